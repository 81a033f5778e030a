/* Reading a byte stream in blocks (blocks.h). */
#include <errno.h>
#include <string.h>

#include "blocks.h"

int gwr_blocks_read(struct gwr_blocks *in, void *dst, size_t n, ssize_t (*more)(void *ctx, void *dst, size_t max),
                    void *ctx) {
    uint8_t *p = dst;
    while (n) {
        if (in->at == in->end) {
            int bulk = n >= in->cap / 2; /* straight into place */
            ssize_t r = more(ctx, bulk ? p : in->b, bulk ? n : in->cap);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return r == 0 ? 0 : -1;
            if (bulk) {
                p += r, n -= (size_t)r;
                continue;
            }
            in->at = 0, in->end = (size_t)r;
        }
        size_t k = in->end - in->at < n ? in->end - in->at : n;
        memcpy(p, in->b + in->at, k);
        in->at += k, p += k, n -= k;
    }
    return 1;
}
