/* libFuzzer harness for the remote record layer's reader (tls13.c): the
 * input scripts what a (hostile) peer sends on a handed-over connection,
 * records sealed in sequence with the right keys mixed with raw bytes,
 * any inner plaintext, flipped bits, KeyUpdates and close_notify. The
 * reader must return exactly the data sent while the stream is clean, and
 * otherwise only fail with one of its errors, for good. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The record layer's other sources: TestCFuzzers builds a harness with one. */
#include "ktls.c"
#include "sha256.c"
#include "tls13.h"

#define MAX_FEED (64 << 10) /* what the socket buffers without a reader */

static int write_all(int fd, const uint8_t *p, size_t n) {
    for (ssize_t k; n; p += k, n -= (size_t)k)
        if ((k = write(fd, p, n)) <= 0) return -1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint8_t rec[GWR_TLS_MAX_RECORD], sent[MAX_FEED], got[MAX_FEED];
    struct gwr_tls_state st = {.suite = GWR_TLS_AES_128_GCM_SHA256, .write_seq = 3, .read_seq = 9}, ps = st;
    memset(st.write_secret, 1, sizeof st.write_secret);
    memset(st.read_secret, 2, sizeof st.read_secret);
    memcpy(ps.write_secret, st.read_secret, sizeof ps.write_secret);
    memcpy(ps.read_secret, st.write_secret, sizeof ps.read_secret);
    ps.write_seq = st.read_seq, ps.read_seq = st.write_seq;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) __builtin_trap();
    struct gwr_tls *t = gwr_tls_new(sv[0], &st), *peer = gwr_tls_new(sv[1], &ps);
    if (!t || !peer) __builtin_trap();
    size_t nsent = 0, fed = 0;
    int clean = 1;
    while (size >= 3 && fed < MAX_FEED - GWR_TLS_MAX_RECORD) {
        uint8_t op = data[0] % 6;
        size_t n = (size_t)data[1] | (size_t)data[2] << 8;
        data += 3, size -= 3;
        if (n > size) n = size;
        if (op == 0) { /* application data, as the writer seals it */
            struct iovec v = {(void *)data, n};
            if (gwr_tls_writev(peer, &v, 1)) __builtin_trap();
            memcpy(sent + nsent, data, n);
            nsent += n;
            fed += n + n / GWR_TLS_MAX_PLAIN * 22 + 22;
        } else if (op == 1) { /* raw bytes */
            if (write_all(sv[1], data, n)) __builtin_trap();
            fed += n;
            clean = 0;
        } else if (op == 2 || op == 3) { /* any inner plaintext, sealed; op 3 flips a bit of the record */
            if (n > GWR_TLS_MAX_PLAIN + 1) n = GWR_TLS_MAX_PLAIN + 1;
            memcpy(rec + GWR_TLS_HDR, data, n);
            size_t len = gwr_tls_seal(peer, rec, n);
            if (op == 3 && n) rec[GWR_TLS_HDR + data[0] % (len - GWR_TLS_HDR)] ^= (uint8_t)(1 << (data[n - 1] & 7));
            if (write_all(sv[1], rec, len)) __builtin_trap();
            fed += len;
            clean = 0;
        } else if (op == 4) {
            if (gwr_tls_update(peer, (int)(n & 1))) __builtin_trap();
            fed += 22, n = 0;
        } else {
            if (gwr_tls_close(peer)) __builtin_trap();
            break;
        }
        data += n, size -= n;
    }
    shutdown(sv[1], SHUT_WR);
    size_t ngot = 0;
    ssize_t r;
    while ((r = gwr_tls_read(t, got + ngot, sizeof got - ngot)) > 0) ngot += (size_t)r;
    if (clean && (r != 0 || ngot != nsent || memcmp(got, sent, nsent))) __builtin_trap();
    if (r < 0) {
        int e = errno;
        if ((e != EBADMSG && e != EPROTO && e != ECONNRESET) || gwr_tls_read(t, got, 1) != -1 || errno != e)
            __builtin_trap();
    }
    gwr_tls_free(t);
    gwr_tls_free(peer);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
