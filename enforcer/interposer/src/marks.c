/* Completion marks (ledger minor 3): when the work a container launched
 * before its gate closed has run. The agent closes an owner's gate at the
 * end of its time slice and charges it device time until its work is done,
 * so it needs that instant; NVIDIA's per-process utilization only samples
 * it. A launch that must wait at the gate first records an event on its
 * stream (it completes once the work launched there before it has run),
 * polls it while it waits, and writes the time it was seen done into the
 * ledger. Only waiting launches pay this: one that passes the gate
 * makes no driver call. The event is the thread's own, one per device, made
 * on its first wait and destroyed when the thread exits (counts.c).
 *
 * A synchronize that returns is a mark too, done as it is recorded: the
 * work before it has run. A workload that synchronizes every step is then
 * seen done when it is, not a guess after it stopped launching. */
#include "hook.h"

#define GW_EVENT_DISABLE_TIMING 0x2 /* CU_EVENT_DISABLE_TIMING */

/* record makes ev (anew if it belongs to another context) and records it
 * on s. Not on a capturing stream: there a record is a node of the graph
 * being captured, and querying it would invalidate the capture. */
static int record(CUevent *ev, CUstream s) {
    CUstreamCaptureStatus cs;
    if (gw_be.cuStreamIsCapturing(s, &cs) || cs != CU_STREAM_CAPTURE_STATUS_NONE) return 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!*ev && gw_be.cuEventCreate(ev, GW_EVENT_DISABLE_TIMING)) {
            *ev = NULL;
            return 0;
        }
        if (!gw_be.cuEventRecord(*ev, s)) return 1;
        gw_be.cuEventDestroy_v2(*ev); /* an event of a context since changed or destroyed */
        *ev = NULL;
    }
    return 0;
}

/* put_mark writes device dev's mark: the work of tickets up to ticket,
 * recorded at rec, seen run at done (0: not yet). rec goes last, and is 0
 * while the rest is written, so that a reader never pairs one mark's rec
 * with another's ticket. */
static void put_mark(int dev, uint64_t ticket, uint64_t rec, uint64_t done) {
    atomic_store_explicit(&gw_usage->mark_rec_ns[dev], 0, memory_order_relaxed);
    atomic_store_explicit(&gw_usage->mark_done_ns[dev], done, memory_order_relaxed);
    atomic_store_explicit(&gw_usage->mark_ticket[dev], ticket, memory_order_release);
    atomic_store_explicit(&gw_usage->mark_rec_ns[dev], rec, memory_order_release);
}

void gw_mark_record(struct gw_mark *m, int dev, CUstream s, uint64_t ticket) {
    struct gw_slot *me = atomic_load(&gw_slot);
    struct gw_cell *cell = gw_my_cell;
    m->ev = NULL;
    if (gw_usage_minor < 3 || !me || !cell || !gw_be.cuEventCreate || !gw_be.cuEventRecord || !gw_be.cuStreamIsCapturing ||
        !gw_be.cuEventQuery || !gw_be.cuEventDestroy_v2 || !record(&cell->mark_ev[dev], s))
        return;
    m->ev = cell->mark_ev[dev];
    m->dev = dev;
    m->rec = gw_now_ns();
    put_mark(dev, ticket - 1, m->rec, 0); /* the tickets before its own */
}

void gw_mark_poll(struct gw_mark *m) {
    CUresult rc = gw_be.cuEventQuery(m->ev);
    if (rc == CUDA_ERROR_NOT_READY) return;
    /* A later mark of another launch replaced this one: it speaks for itself. */
    if (!rc && atomic_load_explicit(&gw_usage->mark_rec_ns[m->dev], memory_order_acquire) == m->rec)
        atomic_store_explicit(&gw_usage->mark_done_ns[m->dev], gw_now_ns(), memory_order_release);
    m->ev = NULL;
}

void gw_mark_cancel(struct gw_mark *m) {
    uint64_t rec = m->rec;
    /* The launch passed before its mark completed: what it marked is no
     * longer all that is outstanding. */
    atomic_compare_exchange_strong(&gw_usage->mark_rec_ns[m->dev], &rec, 0);
    m->ev = NULL;
}

/* synced marks the thread's device done now, where its gate is on: every
 * ticket taken, the thread's unused batch given up first, so that the mark
 * never speaks for a launch of its own still to come. */
static void synced(void) {
    if (gw_usage_minor < 3 || !atomic_load_explicit(&gw_snap_gate_mask, memory_order_relaxed)) return;
    int dev = gw_thread_dev();
    if (dev < 0 || dev >= GW_MAX_DEVICES || !(atomic_load(&gw_snap_gate_mask) & (1u << dev))) return;
    gw_ticket_drop(dev);
    uint64_t now = gw_now_ns();
    put_mark(dev, atomic_load(&gw_usage->launches_issued[dev]), now, now);
}

#define SYNC_HOOK(name, params, args)                                                              \
    GW_EXPORT CUresult name params {                                                               \
        GW_ENTER(name, args);                                                                      \
        gw_in_hook = 1;                                                                            \
        CUresult rc = gw_be.name args;                                                             \
        gw_in_hook = gw_outer_;                                                                    \
        if (!rc) synced();                                                                         \
        return rc;                                                                                 \
    }

SYNC_HOOK(cuCtxSynchronize, (void), ())
SYNC_HOOK(cuStreamSynchronize, (CUstream hStream), (hStream))
SYNC_HOOK(cuStreamSynchronize_ptsz, (CUstream hStream), (hStream))
SYNC_HOOK(cuEventSynchronize, (CUevent hEvent), (hEvent))
