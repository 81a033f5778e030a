/* libgpuwarden-remote.so: what its files share. */
#ifndef GPUWARDEN_REMOTE_CLIENT_H
#define GPUWARDEN_REMOTE_CLIENT_H

#include <stdint.h>

#include "cuda.h"
#include "proto.h"

#define GWR_EXPORT __attribute__((visibility("default")))

/* A context: the client keeps the thread's current one, so the context
 * calls need no round trip; frames carry its id. Never freed: a stale
 * handle finds a cleared magic, not freed memory. */
#define GWR_CTX_MAGIC 0x47435458u
struct CUctx_st {
    uint32_t magic;
    uint64_t id;
    int dev;
    int primary;
    int refs; /* primary contexts: this process's retains */
    _Atomic unsigned flags; /* CU_CTX_*: with CU_CTX_SCHED_BLOCKING_SYNC its calls sleep for replies */
};

/* handles.c: streams, events, modules, graphs, graph execs and pools */
enum gwr_kind { GWR_K_STREAM = 1, GWR_K_EVENT, GWR_K_MODULE, GWR_K_GRAPH, GWR_K_EXEC, GWR_K_POOL };
struct gwr_obj {
    uint32_t magic;
    uint32_t kind;
    uint64_t id; /* the worker's name for it */
    struct gwr_obj *next; /* the free list */
};
void *gwr_obj_new(uint32_t kind);                   /* NULL: out of memory */
uint64_t gwr_obj_id(const void *h, uint32_t kind); /* 0: not a live handle of that kind */
void gwr_obj_free(void *h);

/* allocs.c: the session's device memory, as this process allocated and mapped it */
void gwr_alloc_add(uint64_t base, uint64_t bytes, uint64_t ctx, int mapped);
int gwr_alloc_take(uint64_t base); /* 0, or -1: no allocation starts there */
void gwr_alloc_unmap(uint64_t base, uint64_t bytes);
int gwr_alloc_has(uint64_t p, uint64_t n);
void gwr_alloc_drop_ctx(uint64_t ctx);
void gwr_alloc_forget_all(void);

/* client.c: the session with the worker */
CUresult gwr_connect(void);                 /* once per process (and again after fork) */
uint64_t gwr_new_id(void);                  /* a fresh handle name */
uint64_t gwr_cur_ctx(void);                 /* the calling thread's context's id, or 0 (cuda.c) */
int gwr_cur_blocking_sync(void);            /* the calling thread's context sleeps for replies (cuda.c) */
CUresult gwr_async(uint16_t op, const void *a, size_t na, const void *b, size_t nb);
/* gwr_call sends a request and waits for its reply; out gets the reply's
 * outputs (*nout their length); bulk gets GWR_OP_DATA frames. */
CUresult gwr_call(uint16_t op, const void *a, size_t na, const void *b, size_t nb, void *out, size_t cap,
                  size_t *nout, void *bulk, size_t nbulk);
/* gwr_htod sends one chunk (at most GWR_CHUNK) of a host-to-device copy:
 * through the bulk ring where the worker took one, else in a frame; the
 * caller may reuse src once it returns. */
CUresult gwr_htod(uint64_t dst, const void *src, size_t n);
int gwr_dead(void);      /* the session ended: every call fails */
int gwr_connected(void); /* this process has a live session */

#endif
