/* gw-tlsrec: the remote record layer (remote/tls13.h) on a TLS 1.3
 * connection handed to it, for the Go tests that hold the other end.
 *
 *   [--kernel] --fd N echo [UPDATE_AFTER]     echoes the application data read on fd N; with UPDATE_AFTER,
 *                                  once that many bytes were read, sends a KeyUpdate asking the
 *                                  peer for one before echoing them
 *   [--kernel] --fd N duplex SEND [UPDATE_AFTER]
 *                                  a second thread writes SEND bytes of the pattern (byte i is
 *                                  i % 251) in writes of varied sizes, with a KeyUpdate asking
 *                                  the peer for one after UPDATE_AFTER bytes, and then
 *                                  close_notify; meanwhile the data read is checked against
 *                                  the same pattern
 *   speed MIB                      seals and opens MIB MiB of 16 KiB records in memory, on
 *                                  the wide path and on the narrow one (tls13.c)
 *   agree                          seals records of every length from 0 to 4 KiB and of the
 *                                  largest lengths on both paths: the records must be the
 *                                  same, and each path must open the other's; prints
 *                                  "agree N wide W" (W 0: this CPU has no wide path)
 *
 * The connection modes read the state from stdin, one line: the suite in
 * hex, the write and read secrets in hex, the write and read sequence
 * numbers. The records stay in user space; with --kernel the kernel must
 * take both directions (ktls.h), or gw-tlsrec prints "gw-tlsrec: records
 * in user space (kernel TLS: what it refused)" and exits 3. They end when the peer closes (echo answers with
 * close_notify) and print "read N" (the bytes read). speed prints BENCH lines:
 * tls_record_seal_mib_per_sec and tls_record_open_mib_per_sec. Errors
 * print "gw-tlsrec: what: reason" and exit 1; bad arguments exit 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tls13.h"

#define BUF (64 << 10)
#define SPEED_RECORDS 64 /* sealed, then opened: 1 MiB, in cache */

static void die(const char *what) {
    fprintf(stderr, "gw-tlsrec: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void usage(void) {
    fprintf(stderr, "usage: gw-tlsrec [--kernel] --fd N echo [UPDATE_AFTER] | "
                    "gw-tlsrec [--kernel] --fd N duplex SEND [UPDATE_AFTER] | "
                    "gw-tlsrec speed MIB | gw-tlsrec agree\n");
    exit(2);
}

static int g_kernel; /* --kernel */

static uint64_t count(const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') usage();
    return v;
}

static int hex(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++)
        if (sscanf(s + 2 * i, "%2hhx", &out[i]) != 1) return -1;
    return 0;
}

static struct gwr_tls *take(int fd) {
    char ws[80], rs[80];
    struct gwr_tls_state st;
    if (scanf("%hx %79s %79s %" SCNu64 " %" SCNu64, &st.suite, ws, rs, &st.write_seq, &st.read_seq) != 5 ||
        hex(ws, st.write_secret, sizeof st.write_secret) || hex(rs, st.read_secret, sizeof st.read_secret)) {
        errno = EINVAL;
        die("state on stdin");
    }
    struct gwr_tls *t = gwr_tls_new(fd, &st);
    if (!t) die("gwr_tls_new");
    char why[160];
    if (g_kernel && gwr_tls_in_kernel(t, why, sizeof why) != 3) {
        fprintf(stderr, "gw-tlsrec: %s\n", why);
        exit(3);
    }
    return t;
}

struct writer {
    struct gwr_tls *t;
    uint64_t n, update_after;
};

static void *write_pattern(void *arg) {
    struct writer *w = arg;
    static uint8_t buf[3 * BUF];
    uint64_t at = 0, rnd = 1;
    while (at < w->n) {
        rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = (size_t)(rnd >> 33) % (2 * BUF / 3);
        if (k > w->n - at) k = (size_t)(w->n - at);
        size_t cut = k / 3;
        for (size_t i = 0; i < k; i++) buf[i] = (uint8_t)((at + i) % 251);
        struct iovec v[3] = {{buf, cut}, {buf + cut, 0}, {buf + cut, k - cut}};
        if (gwr_tls_writev(w->t, v, 3)) die("write");
        if (w->update_after && at < w->update_after && at + k >= w->update_after && gwr_tls_update(w->t, 1))
            die("key update");
        at += k;
    }
    if (gwr_tls_close(w->t)) die("close");
    return NULL;
}

static int run(int fd, int duplex, uint64_t send, uint64_t update_after) {
    struct gwr_tls *t = take(fd);
    struct writer w = {t, send, update_after};
    pthread_t th;
    if (duplex && (errno = pthread_create(&th, NULL, write_pattern, &w))) die("pthread_create");
    static uint8_t buf[BUF];
    uint64_t got = 0;
    for (;;) {
        ssize_t n = gwr_tls_read(t, buf, sizeof buf);
        if (n < 0) die("read");
        if (n == 0) break;
        if (!duplex && update_after && got < update_after && got + (uint64_t)n >= update_after && gwr_tls_update(t, 1))
            die("key update");
        for (ssize_t i = 0; duplex && i < n; i++)
            if (buf[i] != (uint8_t)((got + (uint64_t)i) % 251)) {
                errno = EILSEQ;
                die("pattern");
            }
        struct iovec v = {buf, (size_t)n};
        if (!duplex && gwr_tls_writev(t, &v, 1)) die("write");
        got += (uint64_t)n;
    }
    if (duplex && (errno = pthread_join(th, NULL))) die("pthread_join");
    if (!duplex && gwr_tls_close(t)) die("close");
    gwr_tls_free(t);
    printf("read %" PRIu64 "\n", got);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Both directions share one secret, so the records sealed are opened back. */
/* in_memory is a record layer whose records stay in memory (fd 0 is never
 * used), both ways on the same keys, so it opens what it sealed. */
static struct gwr_tls *in_memory(void) {
    struct gwr_tls_state st = {.suite = GWR_TLS_AES_128_GCM_SHA256, .write_seq = 7, .read_seq = 7};
    memset(st.write_secret, 0x5a, sizeof st.write_secret);
    memset(st.read_secret, 0x5a, sizeof st.read_secret);
    struct gwr_tls *t = gwr_tls_new(0, &st);
    if (!t) die("gwr_tls_new");
    return t;
}

/* speed_path prints the seal and open rates of the path in use, as NAME_seal_... */
static void speed_path(uint64_t mib, const char *name) {
    struct gwr_tls *t = in_memory();
    static uint8_t rec[SPEED_RECORDS][GWR_TLS_MAX_RECORD];
    double seal = 0, open = 0;
    uint64_t rounds = mib * 1024 / (GWR_TLS_MAX_PLAIN / 1024) / SPEED_RECORDS + 1;
    for (uint64_t r = 0; r < rounds; r++) {
        for (int i = 0; i < SPEED_RECORDS; i++) {
            memset(rec[i] + GWR_TLS_HDR, (int)r, GWR_TLS_MAX_PLAIN);
            rec[i][GWR_TLS_HDR + GWR_TLS_MAX_PLAIN] = 23;
        }
        double t0 = now_s();
        for (int i = 0; i < SPEED_RECORDS; i++) gwr_tls_seal(t, rec[i], GWR_TLS_MAX_PLAIN + 1);
        double t1 = now_s();
        for (int i = 0; i < SPEED_RECORDS; i++) {
            uint8_t type;
            if (gwr_tls_open(t, rec[i], &type) != GWR_TLS_MAX_PLAIN || type != 23) die("open");
        }
        seal += t1 - t0;
        open += now_s() - t1;
    }
    double total = (double)rounds * SPEED_RECORDS * GWR_TLS_MAX_PLAIN / (1 << 20);
    printf("BENCH %s_seal_mib_per_sec %.0f MiB/s\nBENCH %s_open_mib_per_sec %.0f MiB/s\n", name, total / seal, name,
           total / open);
    gwr_tls_free(t);
}

static int speed(uint64_t mib) {
    printf("BENCH tls_record_wide_available %d bool\n", gwr_tls_wide(1));
    speed_path(mib, "tls_record");
    gwr_tls_wide(0);
    speed_path(mib, "tls_record_narrow");
    return 0;
}

/* sealed seals n bytes of a pattern (then the type byte) with a fresh
 * state on the path given into rec; the record's length. */
static size_t sealed(int wide, size_t n, uint8_t *rec) {
    gwr_tls_wide(wide);
    struct gwr_tls *t = in_memory();
    for (size_t i = 0; i < n; i++) rec[GWR_TLS_HDR + i] = (uint8_t)(i * 7 + n);
    rec[GWR_TLS_HDR + n] = 23;
    size_t len = gwr_tls_seal(t, rec, n + 1);
    gwr_tls_free(t);
    return len;
}

/* opened opens rec on the path given and checks it holds sealed's pattern. */
static int opened(int wide, uint8_t *rec, size_t n) {
    gwr_tls_wide(wide);
    struct gwr_tls *t = in_memory();
    uint8_t type;
    ssize_t got = gwr_tls_open(t, rec, &type);
    gwr_tls_free(t);
    if (got != (ssize_t)n || type != 23) return 0;
    for (size_t i = 0; i < n; i++)
        if (rec[GWR_TLS_HDR + i] != (uint8_t)(i * 7 + n)) return 0;
    return 1;
}

static int agree(void) {
    static uint8_t a[GWR_TLS_MAX_RECORD], b[GWR_TLS_MAX_RECORD];
    int wide = gwr_tls_wide(1), lengths = 0;
    for (size_t n = 0; n <= GWR_TLS_MAX_PLAIN; n = n < 4096 ? n + 1 : n + 4096) {
        size_t la = sealed(1, n, a), lb = sealed(0, n, b);
        if (la != lb || memcmp(a, b, la)) {
            fprintf(stderr, "gw-tlsrec: a record of %zu bytes differs between the paths\n", n);
            return 1;
        }
        memcpy(b, a, la);
        if (!opened(0, a, n) || !opened(1, b, n)) {
            fprintf(stderr, "gw-tlsrec: a record of %zu bytes does not open on the other path\n", n);
            return 1;
        }
        lengths++;
    }
    printf("agree %d wide %d\n", lengths, wide);
    return 0;
}

int main(int argc, char **argv) {
    g_kernel = argc > 1 && !strcmp(argv[1], "--kernel");
    gwr_tls_kernel(g_kernel);
    argc -= g_kernel, argv += g_kernel;
    if (argc == 3 && !strcmp(argv[1], "speed")) return speed(count(argv[2]));
    if (argc == 2 && !strcmp(argv[1], "agree")) return agree();
    if (argc < 4 || strcmp(argv[1], "--fd")) usage();
    int fd = (int)count(argv[2]);
    if (!strcmp(argv[3], "echo") && argc <= 5) return run(fd, 0, 0, argc == 5 ? count(argv[4]) : 0);
    if (!strcmp(argv[3], "duplex") && (argc == 5 || argc == 6))
        return run(fd, 1, count(argv[4]), argc == 6 ? count(argv[5]) : 0);
    usage();
}
