/* The bulk ring: on a unix socket straight to the worker (same machine),
 * copies go through shared memory instead of the socket, pipelined: the
 * client library offers a sealed memfd in a GWR_OP_RING frame, and each
 * side fills slots the other empties. Slots [0, GWR_RING_SLOTS/2) carry
 * host-to-device chunks (the client fills them), the rest device-to-host
 * (the worker fills them). A slot's state word is 0 (free), 1 (filled) or
 * 2 (filled, and its filler sleeps until it is free); a frame names the
 * slot it filled. The memory is the client's: the worker
 * checks every frame's slot and length, and what a client scribbles into
 * its ring only reaches its own session's memory.
 *
 * Device-to-host chunks can be announced in the ring itself instead of by
 * frames: a client that polls writes GWR_RING_POLL into its offer word
 * before it offers the ring, and a worker that takes the offer writes it
 * into its own word before it answers. The worker then writes each filled
 * slot's descriptor (the request's seq, the chunk's offset and length) and
 * sends no frame, unless the client said it sleeps in a read (its sleeps
 * word): then the slot's frame goes out too, to wake it. The client takes
 * the device-to-host slots in order, as the worker fills them. Either side
 * without the word (an older one) keeps to frames. */
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

#define GWR_RING_POLL 0x4c4c4f50u /* "POLL" */

/* The header: the slots' state words, then these words and descriptors. */
struct gwr_ring_hdr {
    _Atomic uint32_t state[GWR_RING_SLOTS];
    uint32_t client_polls, worker_polls; /* GWR_RING_POLL: each side's word that it polls */
    _Atomic uint32_t client_sleeps;      /* 1 while the client may sleep in a read */
    uint32_t pad;
    struct gwr_ring_desc {
        uint32_t seq, len; /* the device-to-host request's seq; the chunk's bytes */
        uint64_t off;      /* the chunk's offset in the copy */
    } desc[GWR_RING_SLOTS];
};
_Static_assert(sizeof(struct gwr_ring_hdr) <= GWR_RING_HDR, "the ring's header outgrew its page");

struct gwr_ring {
    uint8_t *base; /* NULL: no ring */
    _Atomic uint32_t *state;
    struct gwr_ring_hdr *hdr;
    uint32_t next; /* the next slot this side fills, within its half */
    int polled;    /* device-to-host slots are announced in the ring (both sides' words) */
};

int gwr_ring_create(struct gwr_ring *r);        /* client: a sealed memfd, mapped; its fd, or -1 */
int gwr_ring_map(struct gwr_ring *r, int fd);   /* worker: 0, or -1 (not a sealed ring's memfd) */
void gwr_ring_unmap(struct gwr_ring *r);
uint8_t *gwr_ring_slot(const struct gwr_ring *r, uint32_t slot);
/* gwr_ring_take waits up to timeout_ms for this side's next slot to be
 * free and returns it, or -1. */
int gwr_ring_take(struct gwr_ring *r, uint32_t first, int timeout_ms);
void gwr_ring_filled(struct gwr_ring *r, uint32_t slot);   /* hand it to the other side */
void gwr_ring_untake(struct gwr_ring *r);                   /* the slot just taken stays free, and next */
void gwr_ring_emptied(struct gwr_ring *r, uint32_t slot);  /* free it, and wake its filler */
/* gwr_ring_announce (worker, polled): describes a filled device-to-host
 * slot and hands it over; 1 if the client may sleep and needs the slot's
 * frame to wake. */
int gwr_ring_announce(struct gwr_ring *r, uint32_t slot, uint32_t seq, uint64_t off, uint32_t len);
/* gwr_ring_sleeping (client, polled): on, the client may sleep in a read
 * now; 0 if a slot it waits for was filled meanwhile (it must not sleep),
 * else 1. Off: 1. */
int gwr_ring_sleeping(struct gwr_ring *r, uint32_t slot, int on);

#endif
