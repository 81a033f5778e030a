/* Frames to fields and back. Every length the peer sends is checked here,
 * before the worker or the client acts on it. */
#include <stdarg.h>
#include <string.h>

#include "proto.h"

static const char *const formats[GWR_OP_MAX] = {
#define GWR_OP_FMT(name, value, fmt) [value] = fmt,
    GWR_OPS(GWR_OP_FMT)
#undef GWR_OP_FMT
};

const char *gwr_format(uint16_t op) { return op < GWR_OP_MAX ? formats[op] : NULL; }

void gwr_put_hdr(uint8_t out[GWR_HDR_SIZE], const struct gwr_hdr *h) {
    uint32_t zero = 0;
    memcpy(out, &h->len, 4);
    memcpy(out + 4, &h->op, 2);
    memcpy(out + 6, &h->flags, 2);
    memcpy(out + 8, &h->seq, 4);
    memcpy(out + 12, &zero, 4);
    memcpy(out + 16, &h->ctx, 8);
}

int gwr_get_hdr(const uint8_t in[GWR_HDR_SIZE], struct gwr_hdr *h) {
    uint32_t zero;
    memcpy(&h->len, in, 4);
    memcpy(&h->op, in + 4, 2);
    memcpy(&h->flags, in + 6, 2);
    memcpy(&h->seq, in + 8, 4);
    memcpy(&zero, in + 12, 4);
    memcpy(&h->ctx, in + 16, 8);
    if (h->len > GWR_MAX_PAYLOAD || zero || (h->flags & ~(GWR_F_SYNC | GWR_F_HANDOVER)) || !gwr_format(h->op)) return -1;
    return 0;
}

int gwr_decode(const struct gwr_hdr *h, const uint8_t *p, struct gwr_req *r) {
    const char *fmt = gwr_format(h->op);
    if (!fmt || h->len > GWR_MAX_PAYLOAD) return -1;
    size_t n = h->len, at = 0;
    int nq = 0, ni = 0;
    r->h = *h;
    r->hash = NULL;
    r->data = NULL;
    r->ndata = 0;
    r->str[0] = 0;
    for (const char *f = fmt; *f; f++) {
        switch (*f) {
        case 'q':
            if (n - at < 8 || nq == GWR_MAX_FIELDS) return -1;
            memcpy(&r->q[nq++], p + at, 8);
            at += 8;
            break;
        case 'i':
            if (n - at < 4 || ni == GWR_MAX_FIELDS) return -1;
            memcpy(&r->i[ni++], p + at, 4);
            at += 4;
            break;
        case 'h':
            if (n - at < GWR_HASH_SIZE) return -1;
            r->hash = p + at;
            at += GWR_HASH_SIZE;
            break;
        case 'b':
            r->data = p + at;
            r->ndata = n - at;
            at = n;
            break;
        case 's':
            if (n - at > GWR_MAX_NAME || memchr(p + at, 0, n - at)) return -1;
            memcpy(r->str, p + at, n - at);
            r->str[n - at] = 0;
            at = n;
            break;
        default: return -1;
        }
    }
    return at == n ? 0 : -1; /* nothing may trail the fields */
}

size_t gwr_encode(uint8_t *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t n = gwr_vencode(out, cap, fmt, ap);
    va_end(ap);
    return n;
}

size_t gwr_vencode(uint8_t *out, size_t cap, const char *fmt, va_list ap) {
    size_t at = 0;
    for (const char *f = fmt; *f; f++) {
        if (*f == 'q') {
            uint64_t v = va_arg(ap, uint64_t);
            if (cap - at < 8) goto short_;
            memcpy(out + at, &v, 8);
            at += 8;
        } else if (*f == 'i') {
            uint32_t v = va_arg(ap, uint32_t);
            if (cap - at < 4) goto short_;
            memcpy(out + at, &v, 4);
            at += 4;
        } else if (*f == 'h') {
            const uint8_t *v = va_arg(ap, const uint8_t *);
            if (cap - at < GWR_HASH_SIZE) goto short_;
            memcpy(out + at, v, GWR_HASH_SIZE);
            at += GWR_HASH_SIZE;
        } else {
            break; /* 'b' and 's' follow from the caller */
        }
    }
    return at;
short_:
    return 0;
}
