/* gw-tcp: what plain TCP between two C programs reaches on a link, the
 * ceiling a remote GPU session is held against (gpuwarden bench --only remote).
 *
 *   serve ADDR:PORT                      serves clients until killed; prints "listening PORT"
 *   client ADDR:PORT ROUNDS MIB          ROUNDS round trips of a 24-byte message (a remote
 *                                        frame's header), then MIB MiB each way, in 1 MiB writes
 *
 * The client prints BENCH lines: tcp_round_trip_us (mean), tcp_send_mib_per_sec and
 * tcp_recv_mib_per_sec (until the last byte is acknowledged or read), and tcp_ktls_available
 * (whether the kernel accepts the "tls" upper-layer protocol on the connected socket). Both
 * sides set TCP_NODELAY, as the remote link does. Exit 2 on bad arguments, 1 on a failed
 * connection. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG 24
#define CHUNK (1 << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "gw-tcp: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int io_all(int fd, void *buf, size_t n, int writing) {
    char *p = buf;
    while (n) {
        ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* resolve parses "ADDR:PORT" (the last colon separates them). */
static struct addrinfo *resolve(const char *spec, int passive) {
    char host[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof host || !colon[1]) {
        fprintf(stderr, "gw-tcp: %s: want ADDR:PORT\n", spec);
        exit(2);
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    struct addrinfo *ai;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc) {
        fprintf(stderr, "gw-tcp: %s: %s\n", spec, gai_strerror(rc));
        exit(2);
    }
    return ai;
}

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A client's commands: 'r' N (echo N messages), 'u' MIB (read them, then
 * acknowledge with one byte), 'd' MIB (write them). */
static void *serve_one(void *arg) {
    int fd = (int)(intptr_t)arg;
    char *buf = malloc(CHUNK);
    nodelay(fd);
    for (char cmd; buf && io_all(fd, &cmd, 1, 0) == 0;) {
        uint64_t n;
        if (io_all(fd, &n, sizeof n, 0) < 0) break;
        int ok = cmd == 'r' || cmd == 'u' || cmd == 'd';
        for (uint64_t i = 0; ok && i < n; i++) {
            if (cmd == 'r')
                ok = io_all(fd, buf, MSG, 0) == 0 && io_all(fd, buf, MSG, 1) == 0;
            else
                ok = io_all(fd, buf, CHUNK, cmd == 'd') == 0;
        }
        if (ok && cmd == 'u') ok = io_all(fd, "k", 1, 1) == 0;
        if (!ok) break;
    }
    free(buf);
    close(fd);
    return NULL;
}

static _Noreturn void serve(const char *spec) {
    struct addrinfo *ai = resolve(spec, 1);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) die("socket");
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) die(spec);
    freeaddrinfo(ai);
    if (listen(fd, 16) < 0) die("listen");
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0) die("getsockname");
    int port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                              : ((struct sockaddr_in *)&sa)->sin_port);
    printf("listening %d\n", port);
    fflush(stdout);
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            die("accept");
        }
        pthread_t t;
        if (pthread_create(&t, NULL, serve_one, (void *)(intptr_t)c) != 0) {
            close(c);
            continue;
        }
        pthread_detach(t);
    }
}

static int command(int fd, char cmd, uint64_t n) {
    return io_all(fd, &cmd, 1, 1) == 0 && io_all(fd, &n, sizeof n, 1) == 0 ? 0 : -1;
}

static uint64_t count(const char *s, const char *what) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || !*s || v == 0 || v > 1000000) {
        fprintf(stderr, "gw-tcp: %s %s: want a count of 1-1000000\n", what, s);
        exit(2);
    }
    return v;
}

static int client(const char *spec, uint64_t rounds, uint64_t mib) {
    struct addrinfo *ai = resolve(spec, 0);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) die(spec);
    freeaddrinfo(ai);
    nodelay(fd);
    /* Asked on a socket of its own: a socket with the tls ULP is no longer plain TCP. */
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t lolen = sizeof lo;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ktls = 0;
    if (probe >= 0 && ls >= 0 && bind(ls, (struct sockaddr *)&lo, sizeof lo) == 0 && listen(ls, 1) == 0 &&
        getsockname(ls, (struct sockaddr *)&lo, &lolen) == 0 && connect(probe, (struct sockaddr *)&lo, lolen) == 0)
        ktls = setsockopt(probe, IPPROTO_TCP, TCP_ULP, "tls", sizeof "tls") == 0;
    if (probe >= 0) close(probe);
    if (ls >= 0) close(ls);

    char msg[MSG] = {0}, *buf = calloc(1, CHUNK);
    if (!buf) die("malloc");
    if (command(fd, 'r', rounds) < 0) die("send");
    double t0 = now_s();
    for (uint64_t i = 0; i < rounds; i++)
        if (io_all(fd, msg, MSG, 1) < 0 || io_all(fd, msg, MSG, 0) < 0) die("round trip");
    double rt = (now_s() - t0) / (double)rounds;

    t0 = now_s();
    char ack;
    if (command(fd, 'u', mib) < 0) die("send");
    for (uint64_t i = 0; i < mib; i++)
        if (io_all(fd, buf, CHUNK, 1) < 0) die("send");
    if (io_all(fd, &ack, 1, 0) < 0) die("acknowledgement");
    double up = (double)mib / (now_s() - t0);

    t0 = now_s();
    if (command(fd, 'd', mib) < 0) die("send");
    for (uint64_t i = 0; i < mib; i++)
        if (io_all(fd, buf, CHUNK, 0) < 0) die("receive");
    double down = (double)mib / (now_s() - t0);
    close(fd);
    free(buf);
    printf("BENCH tcp_round_trip_us %.2f us\nBENCH tcp_send_mib_per_sec %.0f MiB/s\n"
           "BENCH tcp_recv_mib_per_sec %.0f MiB/s\nBENCH tcp_ktls_available %d bool\n",
           rt * 1e6, up, down, ktls);
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[1], "serve")) serve(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "client"))
        return client(argv[2], count(argv[3], "ROUNDS"), count(argv[4], "MIB"));
    fprintf(stderr, "usage: gw-tcp serve ADDR:PORT | gw-tcp client ADDR:PORT ROUNDS MIB\n");
    return 2;
}
