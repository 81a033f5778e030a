/* Reading a byte stream in blocks, so that a frame's header and fields
 * cost one system call, not one each; a read of half a block or more goes
 * straight to its place. The client library and the worker read their
 * sessions' plain frames this way. */
#ifndef GPUWARDEN_REMOTE_BLOCKS_H
#define GPUWARDEN_REMOTE_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct gwr_blocks {
    uint8_t *b;     /* the block */
    size_t cap;     /* its size */
    size_t at, end; /* the bytes read ahead: b[at, end) */
};

/* gwr_blocks_read reads exactly n bytes into dst through more, a read(2)
 * of up to max bytes (EINTR is retried): 1, or 0 at end of stream before
 * n bytes, or -1 on an error. */
int gwr_blocks_read(struct gwr_blocks *in, void *dst, size_t n, ssize_t (*more)(void *ctx, void *dst, size_t max),
                    void *ctx);

#endif
