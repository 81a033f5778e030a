/* Taking over a session's connection from the agent (proto.h, "Handing
 * over"): the client library and the worker both read a GWR_OP_HANDOVER
 * frame with the session's socket attached. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "handover.h"

int gwr_recv_hdr(int sock, uint8_t hdr[GWR_HDR_SIZE], int *fd) {
    *fd = -1;
    size_t got = 0;
    while (got < GWR_HDR_SIZE) {
        union {
            struct cmsghdr c;
            char b[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct iovec v = {hdr + got, GWR_HDR_SIZE - got};
        struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
        ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
                int f;
                memcpy(&f, CMSG_DATA(c), sizeof f);
                if (*fd >= 0) close(f); /* one socket per handover: a second is not ours to keep */
                else *fd = f;
            }
        if (m.msg_flags & MSG_CTRUNC) break; /* more descriptors than one: not an agent's frame */
        got += (size_t)r;
    }
    if (got == GWR_HDR_SIZE) return 0;
    if (*fd >= 0) close(*fd), *fd = -1;
    return -1;
}

int gwr_handover_take(const struct gwr_hdr *h, const uint8_t *payload, int fd, struct gwr_tls **tls) {
    struct gwr_req r;
    struct gwr_tls_state st = {0};
    *tls = NULL;
    if (h->op != GWR_OP_HANDOVER || fd < 0 || gwr_decode(h, payload, &r) || r.ndata != 2 * sizeof st.write_secret ||
        r.i[0] > UINT16_MAX) {
        errno = EPROTO;
        return -1;
    }
    if (r.i[0] == GWR_HANDOVER_PLAIN) return 0;
    st.suite = (uint16_t)r.i[0];
    st.write_seq = r.q[0];
    st.read_seq = r.q[1];
    memcpy(st.write_secret, r.data, sizeof st.write_secret);
    memcpy(st.read_secret, r.data + sizeof st.write_secret, sizeof st.read_secret);
    *tls = gwr_tls_new(fd, &st);
    explicit_bzero(&st, sizeof st);
    return *tls ? 0 : -1;
}
