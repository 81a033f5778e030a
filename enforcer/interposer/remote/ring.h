/* The bulk ring: on a unix socket straight to the worker (same machine),
 * copies go through shared memory instead of the socket, pipelined: the
 * client library offers a sealed memfd in a GWR_OP_RING frame, and each
 * side fills slots the other empties. Slots [0, GWR_RING_SLOTS/2) carry
 * host-to-device chunks (the client fills them), the rest device-to-host
 * (the worker fills them). A slot's state word is 0 (free), 1 (filled) or
 * 2 (filled, and its filler sleeps until it is free); a frame names the
 * slot it filled. The memory is the client's: the worker
 * checks every frame's slot and length, and what a client scribbles into
 * its ring only reaches its own session's memory. */
#ifndef GPUWARDEN_REMOTE_RING_H
#define GPUWARDEN_REMOTE_RING_H

#include <stdatomic.h>
#include <stdint.h>

#include "proto.h"

#define GWR_RING_SLOTS 8u
#define GWR_RING_HTOD 0u                    /* the client's slots start here */
#define GWR_RING_DTOH (GWR_RING_SLOTS / 2)  /* the worker's */
#define GWR_RING_HDR 4096u
#define GWR_RING_SPIN_NS 100000u /* about two slots' copies: a side waiting for a slot polls this long */
/* Slots smaller than a frame's chunk: what one side writes is still in the
 * shared cache when the other reads it. */
#define GWR_RING_SLOT_BYTES (256u << 10)
#define GWR_RING_BYTES ((size_t)GWR_RING_HDR + (size_t)GWR_RING_SLOTS * GWR_RING_SLOT_BYTES)

struct gwr_ring {
    uint8_t *base; /* NULL: no ring */
    _Atomic uint32_t *state;
    uint32_t next; /* the next slot this side fills, within its half */
};

int gwr_ring_create(struct gwr_ring *r);        /* client: a sealed memfd, mapped; its fd, or -1 */
int gwr_ring_map(struct gwr_ring *r, int fd);   /* worker: 0, or -1 (not a sealed ring's memfd) */
void gwr_ring_unmap(struct gwr_ring *r);
uint8_t *gwr_ring_slot(const struct gwr_ring *r, uint32_t slot);
/* gwr_ring_take waits up to timeout_ms for this side's next slot to be
 * free and returns it, or -1. */
int gwr_ring_take(struct gwr_ring *r, uint32_t first, int timeout_ms);
void gwr_ring_filled(struct gwr_ring *r, uint32_t slot);   /* hand it to the other side */
void gwr_ring_emptied(struct gwr_ring *r, uint32_t slot);  /* free it, and wake its filler */

#endif
