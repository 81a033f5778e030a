/* Kernel TLS (Linux's "tls" upper-layer protocol) for the record layer
 * (tls13.h): where the kernel can carry a TLS 1.3 connection with key
 * updates (Linux 6.14 and later, the tls module present), the kernel seals
 * and opens the records and the record layer only answers what is not
 * application data: KeyUpdates, alerts. Each direction is installed on its
 * own; one the kernel refused stays with the record layer. */
#ifndef GPUWARDEN_REMOTE_KTLS_H
#define GPUWARDEN_REMOTE_KTLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* gwr_ktls_attach puts the "tls" protocol on fd's TCP connection: 0, or
 * -1 with errno (ENOENT: no tls module; ENOTSUP: a kernel without TLS 1.3
 * key updates; ENOTSOCK, EOPNOTSUPP: not a TCP connection). */
int gwr_ktls_attach(int fd);

/* gwr_ktls_set_key installs the AES-128-GCM key and the 12-byte IV of
 * TLS 1.3 for the direction's next record, sequence number seq; tx: the
 * sending direction. On a direction already installed it is a key update.
 * 0 or -1 (errno). */
int gwr_ktls_set_key(int fd, int tx, const uint8_t key[16], const uint8_t iv[12], uint64_t seq);

/* gwr_ktls_tx_seq is the sending direction's next sequence number, as the
 * kernel counts records: 0 or -1 (errno). */
int gwr_ktls_tx_seq(int fd, uint64_t *seq);

/* gwr_ktls_send sends v's bytes in records of the content type given:
 * 0, or -1 (errno; partial writes and EINTR are carried on). */
int gwr_ktls_send(int fd, uint8_t type, const struct iovec *v, int n);

/* gwr_ktls_recv reads from one record, or from consecutive application
 * data records, into buf: what recvmsg(2) returns, and *type the records'
 * content type. */
ssize_t gwr_ktls_recv(int fd, void *buf, size_t n, uint8_t *type);

#endif
