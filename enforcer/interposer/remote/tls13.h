/* TLS 1.3 records (RFC 8446 section 5) on a connection the agent handed
 * over (proto.h, "Handing over"): the client library and the worker carry
 * on the session's TLS connection from its traffic secrets, with
 * TLS_AES_128_GCM_SHA256 only. The handshake stays with the agents.
 *
 * One thread may read while another writes; the record layer serializes
 * its own writes (a KeyUpdate answered on the read path goes between two
 * records). Nothing is allocated after gwr_tls_new. Where the kernel has
 * TLS, it seals and opens the records instead (ktls.h); the calls are the
 * same. */
#ifndef GPUWARDEN_REMOTE_TLS13_H
#define GPUWARDEN_REMOTE_TLS13_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define GWR_TLS_AES_128_GCM_SHA256 0x1301

#define GWR_TLS_HDR 5
#define GWR_TLS_TAG 16
#define GWR_TLS_MAX_PLAIN 16384 /* a record's content */
/* A record whose inner plaintext (content, type, padding) is longer than
 * 2^14 + 1 bytes is refused (RFC 8446 5.4): with AES-GCM that bounds the
 * whole record. */
#define GWR_TLS_MAX_RECORD (GWR_TLS_HDR + GWR_TLS_MAX_PLAIN + 1 + GWR_TLS_TAG)

/* One end's view of its connection, as the agent hands it over. */
struct gwr_tls_state {
    uint16_t suite;                            /* GWR_TLS_AES_128_GCM_SHA256 */
    uint8_t write_secret[32], read_secret[32]; /* application traffic secrets (RFC 8446 7.1) */
    uint64_t write_seq, read_seq;              /* the next records' sequence numbers */
};

/* gwr_tls_supported: 1 if this CPU has what the cipher needs (AES-NI,
 * PCLMULQDQ, SSSE3, SSE4.1); otherwise gwr_tls_new fails with ENOTSUP. It
 * also picks the bulk path: the wide one where the CPU has it. */
int gwr_tls_supported(void);
/* gwr_tls_wide, for the tests of both paths: on, bulk data goes through
 * VAES on 512-bit registers where the CPU has it (the default); off, on
 * 128-bit registers only. It returns whether the wide path is in use. */
int gwr_tls_wide(int on);

/* gwr_tls_kernel, for the tests of both record layers: off, gwr_tls_new
 * keeps the records here; on (the default), it hands the kernel each
 * direction it takes (ktls.h). */
void gwr_tls_kernel(int on);

/* gwr_tls_new continues the connection on fd from st; NULL with errno
 * ENOTSUP (another suite, or the CPU lacks AES-NI), EINVAL or ENOMEM. The
 * caller keeps fd, and may wipe st afterwards. */
struct gwr_tls *gwr_tls_new(int fd, const struct gwr_tls_state *st);

/* gwr_tls_in_kernel: the directions of t the kernel carries (1: sending,
 * 2: receiving); why gets where the records are and, where not in the
 * kernel, what the kernel refused: for logs and tests. */
int gwr_tls_in_kernel(const struct gwr_tls *t, char *why, size_t n);

/* gwr_tls_read is read(2) on the stream of application data: >0 bytes;
 * 0 once the peer closed (close_notify, or EOF between records); -1 with
 * errno EBADMSG (a record failed authentication), EPROTO (a record that
 * may not come here, a malformed one, EOF inside one), ECONNRESET (the
 * peer sent an error alert) or the socket's error. After -1, every later
 * call fails the same way. */
ssize_t gwr_tls_read(struct gwr_tls *t, void *buf, size_t n);
/* gwr_tls_pending: a read would return without waiting for the socket (a
 * whole record, an error or the end is buffered). */
int gwr_tls_pending(const struct gwr_tls *t);

/* gwr_tls_writev writes all of v as records of at most GWR_TLS_MAX_PLAIN
 * bytes: 0, or -1 (errno) and every later write fails. */
int gwr_tls_writev(struct gwr_tls *t, const struct iovec *v, int n);

/* gwr_tls_update sends a KeyUpdate and moves to the next write secret;
 * request_peer asks the peer to do the same. The write key is also
 * updated, unasked, every 2^23 records. 0 or -1 (errno). */
int gwr_tls_update(struct gwr_tls *t, int request_peer);

/* gwr_tls_close sends close_notify; later writes fail with EPIPE. */
int gwr_tls_close(struct gwr_tls *t);

/* gwr_tls_free wipes and frees t; fd stays open. */
void gwr_tls_free(struct gwr_tls *t);

/* The record protection itself, in memory, as the reader and writer use
 * it (and gw-tlsrec's speed test and the fuzzer): neither may run
 * alongside a read or write on t.
 *
 * gwr_tls_seal protects one record whose inner plaintext (content, type
 * byte, zero padding) is rec[GWR_TLS_HDR, GWR_TLS_HDR + inner): it writes
 * the header, encrypts in place and appends the tag, with t's write key
 * and next sequence number. Returns the record's length; inner is at most
 * GWR_TLS_MAX_PLAIN + 1.
 *
 * gwr_tls_open checks and decrypts the record at rec (its header first)
 * in place with t's read key and next sequence number, and returns its
 * content's length (the content at rec + GWR_TLS_HDR) and *type; -1 with
 * errno EPROTO (a bad header or no content type) or EBADMSG. */
size_t gwr_tls_seal(struct gwr_tls *t, uint8_t *rec, size_t inner);
ssize_t gwr_tls_open(struct gwr_tls *t, uint8_t *rec, uint8_t *type);

#endif
