/* The client's session with gpuwarden-worker: one unix stream socket per
 * process, named by GPUWARDEN_REMOTE=unix:PATH.
 *
 * Asynchronous frames go into a batch that is written when a synchronous
 * call needs its reply, when the batch reaches GWR_BATCH bytes, or by the
 * flusher thread within GWR_FLUSH_NS of the batch's first frame, so a
 * program that launches and then sleeps still gets its work run. The first
 * frame after the socket was idle for GWR_FLUSH_NS goes out at once: a
 * step's first kernel starts on the GPU while the rest are batched. Replies
 * are read by one of the calls waiting for them at a time (the leader),
 * which hands each to its caller by seq: a single-threaded program reads
 * its own reply, with no thread in between. When the socket ends, every
 * call, waiting ones included, fails at once with
 * CUDA_ERROR_DEVICE_UNAVAILABLE.
 *
 * The socket GPUWARDEN_REMOTE names is the agent's. When the agent hands
 * the session over (proto.h), frames go over the session's TLS connection
 * instead (tls13.h), and the agent's socket stays open only so the agent
 * sees this process go. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "blocks.h"
#include "client.h"
#include "handover.h"
#include "ring.h"
#include "spin.h"

#define GWR_BATCH (64u << 10)
#define GWR_FLUSH_NS 200000L        /* a batch waits at most this long for company */
/* A synchronous call waits for its reply as the driver waits for the
 * device by default (CU_CTX_SCHED_AUTO): it polls, so a reply that comes
 * within GWR_POLL_NS (a synchronize of a step's kernels, mostly) costs no
 * wake-up, which on a virtual machine is tens of microseconds to a few
 * hundred; past it, a wake-up is a small part of the wait and the call
 * sleeps. Past a round trip (GWR_SPIN_NS) it gives the core away between
 * polls. A context created with CU_CTX_SCHED_BLOCKING_SYNC sleeps at once,
 * and so does a session through the relays: its replies are two relays and
 * well over GWR_SPIN_NS away, and the relays need the cores. */
#define GWR_SPIN_NS 30000u
#define GWR_POLL_NS 20000000u
#define GWR_HELLO_TIMEOUT_MS 5000   /* connecting is the only wait with a timeout of its own */

struct waiter {
    uint32_t seq;
    int done;
    CUresult result;
    uint8_t *out;
    size_t cap, nout;
    uint8_t *bulk;
    size_t nbulk;
    struct waiter *next;
};

static struct {
    pthread_mutex_t mu; /* the session's state and the waiters */
    pthread_cond_t cv;  /* a reply arrived, or the session died */
    int fd;  /* the session: the agent's socket, or the handed-over connection */
    int ctl; /* the agent's socket, once the session was handed over; else -1 */
    struct gwr_tls *tls; /* the handed-over connection's records; NULL: plain frames on fd */
    int state; /* 0 not connected, 1 connected, 2 dead */
    int reading; /* a waiting call reads replies for all */
    struct waiter *waiters;

    pthread_mutex_t send_mu; /* the batch and the socket's write side */
    pthread_cond_t send_cv;  /* the batch became non-empty */
    uint8_t batch[GWR_BATCH];
    size_t nbatch;
    uint64_t sent_ns; /* when the socket was last written, CLOCK_MONOTONIC */

    pthread_mutex_t ring_mu; /* the ring's host-to-device slots */
    struct gwr_ring ring;    /* base NULL: bulk data goes in frames */
    uint32_t dnext;          /* polled: the next device-to-host slot the worker fills; the reading call's */
} S = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .fd = -1,
    .ctl = -1,
    .send_mu = PTHREAD_MUTEX_INITIALIZER,
    .send_cv = PTHREAD_COND_INITIALIZER,
    .ring_mu = PTHREAD_MUTEX_INITIALIZER,
};

static _Atomic uint32_t g_seq;
static _Atomic uint64_t g_ids = 0x100;

uint64_t gwr_new_id(void) { return atomic_fetch_add_explicit(&g_ids, 16, memory_order_relaxed); }

/* A forked child's state is reset to 0 by the fork handler: no getpid here. */
int gwr_connected(void) { return __atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == 1; }

int gwr_dead(void) { return __atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == 2; }

/* kill_session marks the session dead; the reading call's read then fails,
 * and it wakes every waiting call: only it may, since it may be writing into
 * a waiting call's buffer until its read returns. */
static void kill_session(void) {
    pthread_mutex_lock(&S.mu);
    if (S.state == 1) {
        __atomic_store_n(&S.state, 2, __ATOMIC_RELEASE);
        shutdown(S.fd, SHUT_RDWR); /* any read or write returns at once */
    }
    pthread_mutex_unlock(&S.mu);
    pthread_cond_broadcast(&S.send_cv); /* the flusher ends */
}

static void wake_all_dead(void) {
    pthread_mutex_lock(&S.mu);
    for (struct waiter *w = S.waiters; w; w = w->next) {
        w->done = 1;
        w->result = CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

/* read_full reads n bytes of the session: tls's records if it was handed
 * over, else fd's bytes. */
static int read_full(int fd, struct gwr_tls *tls, void *dst, size_t n) {
    uint8_t *p = dst;
    while (n) {
        ssize_t r = tls ? gwr_tls_read(tls, p, n) : read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r, n -= (size_t)r;
    }
    return 0;
}

/* The session's plain frames are read in blocks (blocks.h). Only the
 * reading call touches the block; TLS records have their own. */
static uint8_t g_block[64 << 10];
static struct gwr_blocks R = {.b = g_block, .cap = sizeof g_block};

static ssize_t read_plain(void *fd, void *dst, size_t max) { return read(*(int *)fd, dst, max); }

static int read_session(int fd, struct gwr_tls *tls, void *dst, size_t n) {
    if (tls) return read_full(fd, tls, dst, n);
    return gwr_blocks_read(&R, dst, n, read_plain, &fd) == 1 ? 0 : -1;
}

/* write_iov writes it all; MSG_NOSIGNAL: a dead worker is an error to
 * report, not a SIGPIPE that kills the program. */
static int write_iov(int fd, struct gwr_tls *tls, struct iovec *v, int n) {
    if (tls) return gwr_tls_writev(tls, v, n);
    while (n) {
        struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        while (n && (size_t)w >= v->iov_len) w -= (ssize_t)v->iov_len, v++, n--;
        if (n) v->iov_base = (char *)v->iov_base + w, v->iov_len -= (size_t)w;
    }
    return 0;
}

static struct waiter *find_waiter(uint32_t seq) {
    for (struct waiter *w = S.waiters; w; w = w->next)
        if (w->seq == seq && !w->done) return w;
    return NULL;
}

/* ring_chunk copies the device-to-host chunk the worker filled in slot,
 * n bytes at off of w's copy, into w's buffer and frees the slot: 0, or -1
 * for a chunk nobody asked for (the session is over). */
static int ring_chunk(struct waiter *w, uint32_t slot, uint64_t off, uint32_t n) {
    if (!w || slot < GWR_RING_DTOH || slot >= GWR_RING_SLOTS || n > GWR_RING_SLOT_BYTES || off > w->nbulk ||
        n > w->nbulk - off)
        return -1;
    memcpy(w->bulk + off, gwr_ring_slot(&S.ring, slot), n);
    gwr_ring_emptied(&S.ring, slot);
    return 0;
}

/* ring_drain takes the device-to-host chunks the worker announced in the
 * ring (ring.h), in the order it filled them, into their callers' buffers:
 * 0, or -1 as ring_chunk. Only the reading call drains. */
static int ring_drain(void) {
    for (;;) {
        uint32_t slot = GWR_RING_DTOH + S.dnext;
        if (!atomic_load_explicit(&S.ring.state[slot], memory_order_acquire)) return 0;
        struct gwr_ring_desc d = S.ring.hdr->desc[slot];
        pthread_mutex_lock(&S.mu);
        struct waiter *w = find_waiter(d.seq);
        pthread_mutex_unlock(&S.mu);
        if (ring_chunk(w, slot, d.off, d.len)) return -1;
        S.dnext = (S.dnext + 1) % (GWR_RING_SLOTS / 2);
    }
}

/* read_one reads one frame and hands it to its caller; -1: the session is
 * over. Bulk data is read straight into the caller's buffer: the waiter
 * stays registered, and its buffer valid, until it is marked done here. */
static int read_one(int fd, struct gwr_tls *tls) {
    static uint8_t scratch[GWR_MAX_PAYLOAD]; /* only the reading call uses it */
    uint8_t hb[GWR_HDR_SIZE];
    struct gwr_hdr h;
    if (read_session(fd, tls, hb, sizeof hb) || gwr_get_hdr(hb, &h)) return -1;
    pthread_mutex_lock(&S.mu);
    struct waiter *w = find_waiter(h.seq);
    pthread_mutex_unlock(&S.mu);
    if (h.op == GWR_OP_DATA) {
        uint64_t off;
        if (h.len < 8 || read_session(fd, tls, &off, 8)) return -1;
        size_t n = h.len - 8;
        if (!w || off > w->nbulk || n > w->nbulk - off) return -1; /* data nobody asked for */
        return read_session(fd, tls, w->bulk + off, n);
    }
    if (h.op == GWR_OP_DATA_RING) {
        uint8_t f[16];
        uint64_t off;
        uint32_t slot, n;
        if (h.len != sizeof f || read_session(fd, tls, f, sizeof f) || !S.ring.base) return -1;
        if (S.ring.polled) return ring_drain(); /* the worker woke a sleeping reader: the ring says the rest */
        memcpy(&off, f, 8), memcpy(&slot, f + 8, 4), memcpy(&n, f + 12, 4);
        return ring_chunk(w, slot, off, n);
    }
    if (h.op != GWR_OP_REPLY || h.len < 4 || read_session(fd, tls, scratch, h.len) || !w) return -1;
    if (S.ring.polled && ring_drain()) return -1; /* a copy's last chunks were filled before its reply */
    uint32_t res;
    memcpy(&res, scratch, 4);
    size_t n = h.len - 4;
    pthread_mutex_lock(&S.mu);
    w->result = (CUresult)res;
    w->nout = n < w->cap ? n : w->cap;
    if (w->out) memcpy(w->out, scratch + 4, w->nout);
    w->done = 1;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    return 0;
}

/* read_next waits for what the worker sends next, polling until
 * spin_until and yielding from yield_from (spin.h), and takes it: a frame,
 * or with a polled ring the device-to-host chunks announced in it (ring.h;
 * about to sleep in a read, the reader says so in the ring first). 0, or
 * -1: the session is over. Only the reading call reads. */
static int read_next(int fd, struct gwr_tls *tls, uint64_t yield_from, uint64_t spin_until) {
    if (!S.ring.polled) {
        if (tls || R.at == R.end) gwr_spin_readable(fd, tls, yield_from, spin_until, NULL);
        return read_one(fd, tls);
    }
    uint32_t slot = GWR_RING_DTOH + S.dnext; /* a ring's session has no TLS */
    int got = R.at == R.end ? gwr_spin_readable(fd, NULL, yield_from, spin_until, &S.ring.state[slot]) : 1;
    if (got == 2 || (got == 0 && !gwr_ring_sleeping(&S.ring, slot, 1))) return ring_drain();
    int rc = read_one(fd, NULL);
    if (got == 0) gwr_ring_sleeping(&S.ring, slot, 0);
    return rc;
}

/* write_locked writes frames to the socket; send_mu is held. */
static int write_locked(struct iovec *v, int n) {
    S.sent_ns = gwr_mono_ns();
    return write_iov(S.fd, S.tls, v, n);
}

/* flush_locked writes the batch; send_mu is held. */
static int flush_locked(void) {
    if (!S.nbatch) return 0;
    struct iovec v = {S.batch, S.nbatch};
    S.nbatch = 0;
    return write_locked(&v, 1);
}

static void *flusher(void *arg) {
    (void)arg;
    pthread_mutex_lock(&S.send_mu);
    while (!gwr_dead()) {
        while (!S.nbatch && !gwr_dead()) pthread_cond_wait(&S.send_cv, &S.send_mu);
        pthread_mutex_unlock(&S.send_mu);
        struct timespec ts = {0, GWR_FLUSH_NS};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&S.send_mu);
        if (!gwr_dead() && flush_locked()) {
            pthread_mutex_unlock(&S.send_mu);
            kill_session();
            pthread_mutex_lock(&S.send_mu);
        }
    }
    pthread_mutex_unlock(&S.send_mu);
    return NULL;
}

/* send_frame queues (or, if large, writes) one frame; flush: write it all now. */
static CUresult send_frame(uint16_t op, uint16_t flags, uint32_t seq, const void *a, size_t na, const void *b,
                           size_t nb, int flush) {
    uint8_t hb[GWR_HDR_SIZE];
    struct gwr_hdr h = {.len = (uint32_t)(na + nb), .op = op, .flags = flags, .seq = seq, .ctx = gwr_cur_ctx()};
    gwr_put_hdr(hb, &h);
    size_t total = sizeof hb + na + nb;
    int err = 0;
    pthread_mutex_lock(&S.send_mu);
    if (gwr_dead()) {
        pthread_mutex_unlock(&S.send_mu);
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    if (total <= GWR_BATCH - S.nbatch || (total <= GWR_BATCH / 4 && !(err = flush_locked()))) {
        int was_empty = !S.nbatch;
        if (was_empty && gwr_mono_ns() - S.sent_ns >= (uint64_t)GWR_FLUSH_NS) flush = 1; /* after idle */
        memcpy(S.batch + S.nbatch, hb, sizeof hb);
        if (na) memcpy(S.batch + S.nbatch + sizeof hb, a, na);
        if (nb) memcpy(S.batch + S.nbatch + sizeof hb + na, b, nb);
        S.nbatch += total;
        if (flush || S.nbatch >= GWR_BATCH / 2) err = flush_locked();
        else if (was_empty) pthread_cond_signal(&S.send_cv);
    } else if (!err && !(err = flush_locked())) {
        struct iovec v[3] = {{hb, sizeof hb}, {(void *)a, na}, {(void *)b, nb}};
        err = write_locked(v, 3); /* bulk: no copy into the batch */
    }
    pthread_mutex_unlock(&S.send_mu);
    if (err) {
        kill_session();
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    return CUDA_SUCCESS;
}

static void reset_after_fork(void) {
    /* The child shares the parent's socket but not its threads: it must
     * never touch that session; its next cuInit or call opens its own. */
    if (S.fd >= 0) close(S.fd);
    if (S.ctl >= 0) close(S.ctl);
    gwr_tls_free(S.tls);
    gwr_ring_unmap(&S.ring);
    pthread_mutex_init(&S.ring_mu, NULL);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    pthread_mutex_init(&S.send_mu, NULL);
    pthread_cond_init(&S.send_cv, NULL);
    S.fd = S.ctl = -1;
    S.tls = NULL;
    S.state = 0;
    S.waiters = NULL;
    S.reading = 0;
    S.nbatch = 0;
    R.at = R.end = 0;
    gwr_alloc_forget_all();
}

/* hello writes a hello frame on the session. */
static CUresult hello(int fd, struct gwr_tls *tls, uint16_t flags) {
    uint8_t f[GWR_HDR_SIZE + 8];
    struct gwr_hdr h = {.len = 8, .op = GWR_OP_HELLO, .flags = GWR_F_SYNC | flags, .seq = 1};
    gwr_put_hdr(f, &h);
    uint32_t body[2] = {GWR_MAGIC, GWR_VERSION};
    memcpy(f + GWR_HDR_SIZE, body, 8);
    struct iovec v = {f, sizeof f};
    if (write_iov(fd, tls, &v, 1)) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    return CUDA_SUCCESS;
}

/* hello_reply reads the answer to a hello: the worker's reply, or, on the
 * agent's socket, the session handed over (*sock set, and *tls unless the
 * socket is the worker's own; *handed set). */
static CUresult hello_reply(int fd, struct gwr_tls **tls, int *sock, int *handed) {
    struct pollfd p = {.fd = fd, .events = POLLIN}; /* nothing is buffered yet, even in *tls */
    if (poll(&p, 1, GWR_HELLO_TIMEOUT_MS) != 1) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    uint8_t r[GWR_HDR_SIZE + GWR_MAX_NAME];
    struct gwr_hdr rh;
    int passed = -1;
    if (*tls ? read_full(fd, *tls, r, GWR_HDR_SIZE) : gwr_recv_hdr(fd, r, &passed)) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    if (gwr_get_hdr(r, &rh) || rh.len > sizeof r - GWR_HDR_SIZE || read_full(fd, *tls, r + GWR_HDR_SIZE, rh.len)) {
        if (passed >= 0) close(passed);
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    if (rh.op == GWR_OP_HANDOVER && !*handed) {
        if (gwr_handover_take(&rh, r + GWR_HDR_SIZE, passed, tls)) {
            fprintf(stderr, "gpuwarden: GPUWARDEN_REMOTE: the session cannot be taken over: %s\n", strerror(errno));
            if (passed >= 0) close(passed);
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
        }
        *sock = passed;
        *handed = 1;
        return CUDA_SUCCESS;
    }
    if (passed >= 0) close(passed);
    if (rh.op != GWR_OP_REPLY || rh.len != 8) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    uint32_t res;
    memcpy(&res, r + GWR_HDR_SIZE, 4);
    return (CUresult)res;
}

/* handshake says hello on the agent's socket fd; if the agent hands the
 * session over, again on the session's connection. */
static CUresult handshake(int fd, int *sock, struct gwr_tls **tls) {
    *sock = fd;
    *tls = NULL;
    int handed = 0;
    CUresult rc = hello(fd, NULL, GWR_F_HANDOVER);
    if (rc || (rc = hello_reply(fd, tls, sock, &handed)) || !handed) return rc;
    if ((rc = hello(*sock, *tls, 0)) || (rc = hello_reply(*sock, tls, sock, &handed))) {
        gwr_tls_free(*tls);
        close(*sock);
        *tls = NULL;
        *sock = fd;
    }
    return rc;
}

/* offer_ring offers the worker a bulk ring (ring.h) on a plain socket:
 * one straight to a worker on this machine takes it; through a relay the
 * memfd is dropped on the way and the worker declines. */
static void offer_ring(int fd) {
    struct gwr_ring r;
    int mfd = gwr_ring_create(&r);
    if (mfd < 0) return;
    uint8_t f[GWR_HDR_SIZE + 8];
    struct gwr_hdr h = {.len = 8, .op = GWR_OP_RING, .flags = GWR_F_SYNC, .seq = 1};
    gwr_put_hdr(f, &h);
    gwr_encode(f + GWR_HDR_SIZE, 8, "ii", GWR_RING_SLOTS, GWR_RING_SLOT_BYTES);
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl = {0};
    struct iovec v = {f, sizeof f};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &mfd, sizeof mfd);
    uint8_t rep[GWR_HDR_SIZE + 4];
    struct gwr_hdr rh;
    uint32_t res = 1;
    if (sendmsg(fd, &m, MSG_NOSIGNAL) == (ssize_t)sizeof f && !read_full(fd, NULL, rep, sizeof rep) &&
        !gwr_get_hdr(rep, &rh) && rh.op == GWR_OP_REPLY && rh.len == 4)
        memcpy(&res, rep + GWR_HDR_SIZE, 4);
    close(mfd);
    if (res == CUDA_SUCCESS) {
        r.polled = r.hdr->worker_polls == GWR_RING_POLL; /* an older worker announces by frames */
        S.ring = r;
        S.dnext = 0;
    } else {
        gwr_ring_unmap(&r);
    }
}

/* flush writes the batch now: a frame the worker needs before it can free
 * a slot may be in it. */
static void flush(void) {
    pthread_mutex_lock(&S.send_mu);
    int err = !gwr_dead() && flush_locked();
    pthread_mutex_unlock(&S.send_mu);
    if (err) kill_session();
}

/* htod_slot sends n bytes (at most a slot's) through the ring. */
static CUresult htod_slot(uint64_t dst, const void *src, size_t n) {
    pthread_mutex_lock(&S.ring_mu);
    int slot = gwr_ring_take(&S.ring, GWR_RING_HTOD, 0);
    if (slot < 0) flush();
    while (slot < 0 && !gwr_dead()) {
        slot = gwr_ring_take(&S.ring, GWR_RING_HTOD, 100);
        struct pollfd p = {.fd = S.fd, .events = POLLRDHUP};
        if (slot < 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            kill_session(); /* the worker is gone: its slots stay full */
    }
    if (slot < 0) {
        pthread_mutex_unlock(&S.ring_mu);
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    memcpy(gwr_ring_slot(&S.ring, (uint32_t)slot), src, n);
    gwr_ring_filled(&S.ring, (uint32_t)slot);
    uint8_t b[16];
    size_t k = gwr_encode(b, sizeof b, "qii", dst, (uint32_t)slot, (uint32_t)n);
    CUresult rc = send_frame(GWR_OP_HTOD_RING, 0, 0, b, k, NULL, 0, 1); /* now: the worker copies while we fill */
    pthread_mutex_unlock(&S.ring_mu);
    return rc;
}

CUresult gwr_htod(uint64_t dst, const void *src, size_t n) {
    if (!S.ring.base) {
        uint8_t b[8];
        size_t k = gwr_encode(b, sizeof b, "q", dst);
        return gwr_async(GWR_OP_HTOD, b, k, src, n);
    }
    CUresult rc = CUDA_SUCCESS;
    for (size_t off = 0; off < n && !rc; off += GWR_RING_SLOT_BYTES)
        rc = htod_slot(dst + off, (const uint8_t *)src + off, n - off < GWR_RING_SLOT_BYTES ? n - off : GWR_RING_SLOT_BYTES);
    return rc;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void register_fork(void) { pthread_atfork(NULL, NULL, reset_after_fork); }

/* remote_path reads GPUWARDEN_REMOTE=unix:PATH; NULL (said on stderr) if unset or malformed. */
static const char *remote_path(void) {
    const char *v = getenv("GPUWARDEN_REMOTE");
    struct sockaddr_un a;
    if (!v || !*v) {
        fprintf(stderr, "gpuwarden: GPUWARDEN_REMOTE is not set: want unix:/path/to/socket\n");
        return NULL;
    }
    if (strncmp(v, "unix:", 5) || !v[5] || strlen(v + 5) >= sizeof a.sun_path) {
        fprintf(stderr, "gpuwarden: GPUWARDEN_REMOTE=%s: want unix:/path/to/socket (at most %zu bytes)\n", v,
                sizeof a.sun_path - 1);
        return NULL;
    }
    return v + 5;
}

CUresult gwr_connect(void) {
    pthread_once(&g_once, register_fork);
    pthread_mutex_lock(&S.mu);
    CUresult rc = CUDA_SUCCESS;
    if (S.state == 2) rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
    if (S.state != 0) goto out;
    const char *path = remote_path();
    if (!path) {
        rc = CUDA_ERROR_NO_DEVICE;
        goto out;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        fprintf(stderr, "gpuwarden: GPUWARDEN_REMOTE: connect %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
        goto out;
    }
    int buf = GWR_SOCKET_BUFFER;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    int sock;
    struct gwr_tls *tls;
    if ((rc = handshake(fd, &sock, &tls))) {
        fprintf(stderr, "gpuwarden: GPUWARDEN_REMOTE: %s did not answer as a gpuwarden worker\n", path);
        close(fd);
        goto out;
    }
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (!tls) offer_ring(sock);
    S.fd = sock;
    S.ctl = sock == fd ? -1 : fd;
    S.tls = tls;
    S.state = 1;
    if (pthread_create(&t, &at, flusher, NULL)) {
        S.state = 2; /* a thread is missing: nothing could be answered */
        shutdown(sock, SHUT_RDWR);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_attr_destroy(&at);
out:
    pthread_mutex_unlock(&S.mu);
    return rc;
}

CUresult gwr_async(uint16_t op, const void *a, size_t na, const void *b, size_t nb) {
    return send_frame(op, 0, 0, a, na, b, nb, 0);
}

CUresult gwr_call(uint16_t op, const void *a, size_t na, const void *b, size_t nb, void *out, size_t cap,
                  size_t *nout, void *bulk, size_t nbulk) {
    uint32_t seq;
    while ((seq = atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed)) == 0) {
    }
    struct waiter w = {.seq = seq, .out = out, .cap = cap, .bulk = bulk, .nbulk = nbulk};
    pthread_mutex_lock(&S.mu);
    if (S.state != 1) {
        pthread_mutex_unlock(&S.mu);
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    w.next = S.waiters;
    S.waiters = &w;
    int relayed = S.ctl < 0 && !S.ring.base; /* neither handed over nor with a ring: a relay may be between */
    pthread_mutex_unlock(&S.mu);
    send_frame(op, GWR_F_SYNC, seq, a, na, b, nb, 1); /* a failure ends the read below */
    uint64_t sent = gwr_mono_ns(), spin_until = gwr_cur_blocking_sync() || relayed ? 0 : sent + GWR_POLL_NS;
    pthread_mutex_lock(&S.mu);
    while (!w.done) {
        if (S.reading) { /* another call reads: it hands us our reply */
            pthread_cond_wait(&S.cv, &S.mu);
            continue;
        }
        S.reading = 1;
        int fd = S.fd;
        struct gwr_tls *tls = S.tls;
        pthread_mutex_unlock(&S.mu);
        if (read_next(fd, tls, sent + GWR_SPIN_NS, spin_until)) {
            kill_session();
            wake_all_dead();
        }
        spin_until = gwr_mono_ns() + GWR_RING_SPIN_NS; /* more of a copy's chunks follow */
        pthread_mutex_lock(&S.mu);
        S.reading = 0;
        pthread_cond_broadcast(&S.cv); /* a call still waiting reads next */
    }
    for (struct waiter **pp = &S.waiters; *pp; pp = &(*pp)->next)
        if (*pp == &w) {
            *pp = w.next;
            break;
        }
    pthread_mutex_unlock(&S.mu);
    if (nout) *nout = w.nout;
    return w.result;
}
