/* Kernel TLS for the record layer (ktls.h; the kernel's
 * Documentation/networking/tls.rst). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/tls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/utsname.h>

#include "ktls.h"

#define IOV_BATCH 16

enum { RECORD_DATA = 23 }; /* application data, TLS's content type */

/* rekeys: the kernel takes a new key on an installed direction (6.14);
 * before that a KeyUpdate would end the session. */
static int rekeys(void) {
    struct utsname u;
    unsigned major, minor;
    if (uname(&u) || sscanf(u.release, "%u.%u", &major, &minor) != 2) return 0;
    return major > 6 || (major == 6 && minor >= 14);
}

int gwr_ktls_attach(int fd) {
    if (!rekeys()) {
        errno = ENOTSUP;
        return -1;
    }
    return setsockopt(fd, IPPROTO_TCP, TCP_ULP, "tls", sizeof "tls");
}

int gwr_ktls_set_key(int fd, int tx, const uint8_t key[16], const uint8_t iv[12], uint64_t seq) {
    struct tls12_crypto_info_aes_gcm_128 ci = {.info = {.version = TLS_1_3_VERSION, .cipher_type = TLS_CIPHER_AES_GCM_128}};
    /* TLS 1.3's 12-byte IV is the kernel's salt and then its IV; the
     * sequence number goes big-endian. */
    memcpy(ci.key, key, sizeof ci.key);
    memcpy(ci.salt, iv, sizeof ci.salt);
    memcpy(ci.iv, iv + sizeof ci.salt, sizeof ci.iv);
    for (int i = 0; i < 8; i++) ci.rec_seq[7 - i] = (uint8_t)(seq >> (8 * i));
    int rc = setsockopt(fd, SOL_TLS, tx ? TLS_TX : TLS_RX, &ci, sizeof ci);
    explicit_bzero(&ci, sizeof ci);
    return rc;
}

int gwr_ktls_tx_seq(int fd, uint64_t *seq) {
    struct tls12_crypto_info_aes_gcm_128 ci;
    socklen_t len = sizeof ci;
    int rc = getsockopt(fd, SOL_TLS, TLS_TX, &ci, &len);
    if (!rc && len != sizeof ci) errno = EPROTO, rc = -1;
    if (!rc) {
        *seq = 0;
        for (int i = 0; i < 8; i++) *seq = *seq << 8 | ci.rec_seq[i];
    }
    explicit_bzero(&ci, sizeof ci);
    return rc;
}

int gwr_ktls_send(int fd, uint8_t type, const struct iovec *v, int n) {
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(1)];
    } ctl;
    int i = 0;
    size_t off = 0;
    for (;;) {
        while (i < n && off == v[i].iov_len) i++, off = 0;
        if (i == n) return 0;
        struct iovec part[IOV_BATCH];
        int k = 0;
        for (int j = i; j < n && k < IOV_BATCH; j++, k++) part[k] = v[j];
        part[0].iov_base = (char *)part[0].iov_base + off, part[0].iov_len -= off;
        struct msghdr m = {.msg_iov = part, .msg_iovlen = (size_t)k};
        if (type != RECORD_DATA) {
            /* Another content type goes in a record of its own. */
            m.msg_control = ctl.b, m.msg_controllen = sizeof ctl.b;
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_TLS, c->cmsg_type = TLS_SET_RECORD_TYPE, c->cmsg_len = CMSG_LEN(1);
            *CMSG_DATA(c) = type;
        }
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (type != RECORD_DATA && (size_t)w != part[0].iov_len) {
            errno = EPROTO; /* the rest would be a record of its own */
            return -1;
        }
        while (i < n && (size_t)w >= v[i].iov_len - off) w -= (ssize_t)(v[i].iov_len - off), i++, off = 0;
        off += (size_t)w;
    }
}

ssize_t gwr_ktls_recv(int fd, void *buf, size_t n, uint8_t *type) {
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(1)];
    } ctl;
    struct iovec v = {buf, n};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    ssize_t r = recvmsg(fd, &m, 0);
    *type = RECORD_DATA;
    for (struct cmsghdr *c = r > 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_TLS && c->cmsg_type == TLS_GET_RECORD_TYPE && c->cmsg_len == CMSG_LEN(1))
            *type = *CMSG_DATA(c);
    return r;
}
