/* What libgpuwarden.so's files share. Not installed, not an ABI. */
#ifndef GW_INTERNAL_H
#define GW_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "env.h"
#include "gpuwarden_abi.h"
#include "hooks.h"

#define GW_LIKELY(x) __builtin_expect(!!(x), 1)
#define GW_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* procaddr.c: the backend and the substitution table */
extern struct gw_backend gw_be;
int gw_cuda_load(void);      /* fills the CUDA part of gw_be once; 0 when libcuda is there */
int gw_nvml_load(void);      /* the NVML part */
void *gw_real_dlsym(void *handle, const char *name);

/* init.c: process state.
 * gw_state: GW_UNINIT until the first hooked call; GW_FAILED when the
 * environment or a control block is malformed (every hook then fails);
 * GW_CORE once they are read; GW_READY once this process has a ledger slot. */
enum { GW_FAILED = -1, GW_UNINIT = 0, GW_CORE = 1, GW_READY = 2 };
extern _Atomic int gw_state;
extern struct gw_env gw_env;            /* parsed once, at init */
extern struct gw_usage *gw_usage;       /* the container's ledger (read-write) */
extern int gw_usage_per_dev;            /* the ledger has minor 1's per-device counters */
extern int gw_usage_minor;              /* the ledger's minor: its fields of a later one are not written */
extern struct gw_slot *_Atomic gw_slot; /* this process's slot, when GW_READY */
extern __thread int gw_in_hook __attribute__((tls_model("initial-exec")));

/* The re-entry guard. gw_in_hook is set while a hook's body runs, so that
 * when the driver calls one of its own hooked functions (simgpu's _ptsz
 * variants call their base through the PLT, cuCtxCreate_v3 calls _v2), the
 * inner call goes straight to the driver instead of being charged twice.
 * The guard alone cannot tell that call from one made by a signal handler
 * that runs while the hook is inside the driver: both see this thread's
 * guard set. The caller can: a call passes through only when the guard is
 * set and its return address is in the driver's code, or in ours (where the
 * driver tail-called its base function, the return address is the hook that
 * called the driver), or in the kernel's uretprobe trampoline (where a probed
 * driver function tail-called; procaddr.c). A handler's call returns into the
 * program and is managed like any other. Only the rare path (guard set) reads the address:
 * the launch path costs what it did. gw_drv_text and gw_own_text are set once
 * when the driver is loaded (procaddr.c), before any guard can be set. */
struct gw_text {
    uintptr_t lo, len; /* [lo, lo + len): executable segments of one object */
};
extern struct gw_text gw_drv_text, gw_own_text;
int gw_from_uprobes(uintptr_t a) __attribute__((noinline, cold)); /* the kernel's uretprobe trampoline */
static inline int gw_from_driver(const void *ret) {
    uintptr_t a = (uintptr_t)ret;
    return a - gw_drv_text.lo < gw_drv_text.len || a - gw_own_text.lo < gw_own_text.len || gw_from_uprobes(a);
}
/* gw_reentered is set when a call passed through as the driver's own: a
 * launch hook learns from it whether its driver function comes back into
 * the hooks (launch.c). */
extern __thread int gw_reentered __attribute__((tls_model("initial-exec")));
static inline int gw_reentry(const void *ret) {
    if (!gw_from_driver(ret)) return 0;
    gw_reentered = 1;
    return 1;
}
#define GW_DRIVER_REENTRY(guard) (GW_UNLIKELY(guard) && gw_reentry(__builtin_return_address(0)))

int gw_core(void);       /* runs init once; GW_FAILED, GW_CORE or GW_READY */
int gw_activate(void);   /* claims a slot; 0 on success, else a CUresult */
void gw_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* What every hook returns once init failed (hook.h's GW_ENTER). */
#define GW_FAILED_CUDA CUDA_ERROR_NOT_PERMITTED
#define GW_FAILED_NVML NVML_ERROR_NO_PERMISSION

/* ledger.c: usage and limits files, reservations, reaping */
int gw_ledger_open(const char *dir, const char *key, const char *cgpath, char *err, size_t errlen);
int gw_limits_open(char *err, size_t errlen); /* 0 mapped or absent, -1 malformed */
void gw_record_claims(void);
extern pthread_mutex_t gw_lim_mu;
void gw_limits_poll_file(void);  /* maps limits if it appeared since */
extern struct gw_limits *_Atomic gw_limits;
extern _Atomic uint64_t gw_limits_seq;  /* seq of the snapshot below */
void gw_limits_refresh(void);
static inline void gw_limits_check(void) {
    struct gw_limits *l = atomic_load_explicit(&gw_limits, memory_order_acquire);
    if (GW_UNLIKELY(l && atomic_load_explicit(&l->seq, memory_order_relaxed) !=
                             atomic_load_explicit(&gw_limits_seq, memory_order_relaxed)))
        gw_limits_refresh();
}
extern _Atomic uint32_t gw_snap_gate_mask;
extern _Atomic uint64_t gw_snap_grace;       /* ns; the default when the agent wrote 0 */
extern _Atomic uint64_t gw_limits_bad_since; /* CLOCK_MONOTONIC ns of a bad read of limits since the last good one, 0 none */
uint64_t gw_limit(int dev);           /* bytes, 0 = none */
uint64_t gw_context_reserve(void);
uint64_t gw_generation(void);
int gw_reserve(int dev, uint64_t bytes); /* 1 reserved, 0 over the quota */
void gw_release(int dev, uint64_t bytes);
struct gw_slot *gw_slot_claim(void);
void gw_slot_release_self(void);
void gw_reap_dead(void);
uint64_t gw_proc_start_time(int pid);
void gw_record_devices(void);

/* memory.c */
void gw_pending_poll(int wait);   /* releases stream-ordered frees that completed */
void gw_release_ctx(CUcontext ctx);
void gw_memory_atfork(int phase); /* 0 prepare, 1 parent, 2 child */

/* context.c */
void gw_context_atfork(int phase);

/* counts.c: launch counts per thread. A launch adds to its own thread's
 * cell with a plain add: on x86 any locked read-modify-write waits for every
 * store still pending, and NVIDIA's launch returns with stores pending (about
 * 100 ns a launch on an H200). The reaper sums the cells into the process's
 * slot and the per-device counters every GW_FLUSH_PERIOD_NS, at exit, and
 * when a thread exits; a fork child's cells start from zero. */
struct gw_cell {
    _Atomic uint64_t launches;               /* written by its thread only */
    _Atomic uint64_t placed[GW_MAX_DEVICES]; /* of those, by the device they ran on (gated launches) */
    uint64_t summed, summed_placed[GW_MAX_DEVICES]; /* what the ledger holds of them; under the cells' lock */
    CUevent mark_ev[GW_MAX_DEVICES]; /* its completion marks' events (marks.c) */
    struct gw_cell *next;
};
extern __thread struct gw_cell *gw_my_cell __attribute__((tls_model("initial-exec")));
struct gw_cell *gw_cell_new(void); /* this thread's cell on its first launch; NULL when none can be had */
void gw_counts_flush(void);        /* the reaper's sum */
void gw_counts_close(void);        /* the last sum, at exit: nothing is summed into the slot after it */
void gw_counts_atfork(int phase);

/* gw_count_add adds to a counter only this thread writes. On x86 it is one
 * unlocked add to memory: a signal handler that launches cannot split it. */
static inline void gw_count_add(_Atomic uint64_t *c, uint64_t n) {
#if defined(__x86_64__)
    __asm__ volatile("addq %1, %0" : "+m"(*(uint64_t *)c) : "er"(n) : "memory");
#else
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
#endif
}

/* context.c: the device of this thread's current context, kept by the
 * context hooks so that a gated launch need not ask the driver. */
#define GW_DEV_ASK (-2) /* not known: the next gated launch asks the driver */
struct gw_cur {
    int dev;       /* the current context's device; -1 none */
    uint32_t left; /* gated launches until the cache is checked against the driver */
};
extern __thread struct gw_cur gw_cur __attribute__((tls_model("initial-exec")));
extern _Atomic int gw_ndev_visible; /* devices this process sees (cuDeviceGetCount at cuInit), 0 unknown */

/* marks.c: completion marks, recorded by a launch that waits at a gate */
struct gw_mark {
    CUevent ev;   /* NULL: no mark pending */
    int dev;
    uint64_t rec; /* when it was recorded */
};
#define GW_MARK_POLL_NS 200000ull /* a pending mark is polled this often while its launch waits */
void gw_mark_record(struct gw_mark *m, int dev, CUstream s, uint64_t ticket); /* ticket: the waiting launch's */
void gw_mark_poll(struct gw_mark *m);
void gw_mark_cancel(struct gw_mark *m); /* the launch passes with its mark still pending */

/* launch.c */
CUresult gw_gate_wait(CUstream s);
int gw_thread_dev(void); /* the device of this thread's current context, -1 none */
void gw_ticket_drop(int dev);         /* this thread gives up its unused gate tickets on dev */
void gw_tickets_atfork_child(void);   /* a fork child holds none of its parent's tickets */

/* time */
uint64_t gw_now_ns(void); /* CLOCK_MONOTONIC */

#endif
