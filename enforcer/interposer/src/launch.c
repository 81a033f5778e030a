/* The launch path: count every launch in this thread's cell (counts.c)
 * and, when the agent gates the device, wait for a grant. Without a gate
 * this is a few loads, one unlocked add and a jump to the driver: no
 * getenv, lock, log, allocation or locked instruction here (a thread's
 * first launch takes a cell). With a gate on any device the launch's
 * device is known, without asking the driver (see launch_dev), and the
 * launch is counted on it too (ledgers of minor 1); the one locked
 * instruction is the gate's ticket, taken for several launches at once
 * where the agent counts its closes. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"

#define GW_WAIT_SLICE_NS 100000000ull   /* re-check the agent's heartbeat at least this often */
#define GW_STALE_NS 500000000ull        /* a heartbeat this old (or half the grace, if less): the agent is silent */
#define GW_PACE_WINDOW_NS 1000000000ull /* the grant's pace is measured over at least this much beat time */
#define GW_PACE_WINDOW_MAX_NS 4000000000ull /* a longer window (no gated launch meanwhile) measures nothing */
#define GW_PACE_SLOWEST_NS 100000000ull /* a silent agent's grant never goes slower than 10 launches/s */

/* A silent agent (SIGKILLed, stuck, or limits that fail their check) must
 * stall nobody: for the grace period the grant goes on, in this process's
 * reckoning, at the pace the agent last granted, then the gate lifts. The
 * pace is the grant's advance over heartbeat time, as this process saw it
 * at its gated launches, over windows of 1 to 4 s of beats (per device,
 * process-local; every process of the container reckons alike, and tickets
 * are container-wide, so the container as a whole keeps about that pace). */
struct pace {
    _Atomic uint64_t win_beat, win_grant; /* where the current window started */
    _Atomic uint64_t ns_per_launch;       /* the last window's pace; 0 none yet */
    _Atomic uint64_t last_beat, last_grant; /* the last good (beat, grant) seen */
};
static struct pace pace[GW_MAX_DEVICES];

/* pace_note records a good (beat, grant) read at a gated launch. */
static void pace_note(struct pace *p, uint64_t beat, uint64_t grant) {
    if (atomic_load_explicit(&p->last_beat, memory_order_relaxed) != beat) {
        atomic_store_explicit(&p->last_grant, grant, memory_order_relaxed);
        atomic_store_explicit(&p->last_beat, beat, memory_order_relaxed);
    }
    uint64_t b0 = atomic_load_explicit(&p->win_beat, memory_order_relaxed);
    if (beat >= b0 && beat - b0 < GW_PACE_WINDOW_NS) return;
    if (!atomic_compare_exchange_strong(&p->win_beat, &b0, beat)) return; /* another thread closes it */
    uint64_t g0 = atomic_exchange(&p->win_grant, grant);
    if (!b0 || beat < b0 || beat - b0 > GW_PACE_WINDOW_MAX_NS || grant < g0) return;
    uint64_t per = grant > g0 ? (beat - b0) / (grant - g0) : GW_PACE_SLOWEST_NS;
    atomic_store_explicit(&p->ns_per_launch, per ? per : 1, memory_order_relaxed);
}

static uint64_t pace_ns(struct pace *p) {
    uint64_t per = atomic_load_explicit(&p->ns_per_launch, memory_order_relaxed);
    return per && per < GW_PACE_SLOWEST_NS ? per : GW_PACE_SLOWEST_NS;
}

/* count_placed adds n (1 launch, or the ns a launch waited) to a
 * container-wide per-device counter and, as counted there, to the slot. */
static void count_placed(_Atomic uint64_t *dev_counter, _Atomic uint64_t *slot_counter, uint64_t n) {
    atomic_fetch_add_explicit(dev_counter, n, memory_order_relaxed);
    atomic_fetch_add_explicit(slot_counter, n, memory_order_relaxed);
}

/* gw_thread_dev is the device of this thread's current context, -1 none.
 * With one visible device it can only be that one. Otherwise it is what the
 * context hooks left in gw_cur, checked against the driver once every
 * GW_DEV_CHECK_EVERY gated launches: a context made current behind the
 * hooks' back (a path that bypasses them) is counted in the ledger
 * (usage.dev_mismatches, minor 2) and the driver's answer taken. */
#define GW_DEV_CHECK_EVERY 1024
int gw_thread_dev(void) {
    if (atomic_load_explicit(&gw_ndev_visible, memory_order_relaxed) == 1) return 0;
    struct gw_cur *c = &gw_cur;
    if (GW_LIKELY(c->dev != GW_DEV_ASK && c->left)) {
        c->left--;
        return c->dev;
    }
    CUdevice d;
    int now = gw_be.cuCtxGetDevice(&d) ? -1 : d;
    if (c->dev != GW_DEV_ASK && c->dev != now && gw_usage_minor >= 2)
        atomic_fetch_add(&gw_usage->dev_mismatches, 1);
    c->dev = now;
    c->left = GW_DEV_CHECK_EVERY - 1;
    return now;
}

/* A thread takes gate tickets a batch at a time (limits of minor 4): one
 * locked instruction, the ticket counter's compare-and-swap, for up to
 * GW_BATCH_MAX launches. A launch that returns leaves stores pending on
 * NVIDIA's driver, and a locked instruction after it waits for them all
 * (about 150 ns on an H200): a batch pays that once. A batch lapses when
 * the agent closes the gate (gate.closes moves) or replaces the limits
 * file, and in a fork child, and a synchronize gives it up
 * (gw_ticket_drop). Lapsed tickets are never used: the agent counts them
 * as taken, launched by nobody. So that few lapse, a batch is at most a
 * quarter of the grant left (the grant is short where kernels are long)
 * and no more than the launches the thread has left before its next
 * synchronize, if it made as many between its last two: a training step
 * that launches the same kernels and synchronizes uses every ticket. */
#define GW_BATCH_MAX 16
struct gw_batch {
    uint64_t next, last;          /* tickets next..last are this thread's, unused */
    uint64_t closes;              /* gate.closes when they were taken */
    const struct gw_limits *l;    /* the limits file they were taken under */
    uint32_t since_sync;          /* tickets used since this thread's last synchronize */
    uint32_t per_sync;            /* those between its last two; 0: none seen */
};
static __thread struct gw_batch gw_batch[GW_MAX_DEVICES] __attribute__((tls_model("initial-exec")));

/* next_ticket takes the batch's next ticket in one instruction, so that a
 * signal handler that launches on this thread never gets the same one. */
static inline uint64_t next_ticket(uint64_t *next) {
#if defined(__x86_64__)
    uint64_t t = 1;
    __asm__ volatile("xaddq %0, %1" : "+r"(t), "+m"(*next) : : "memory");
    return t;
#else
    return atomic_fetch_add_explicit((_Atomic uint64_t *)next, 1, memory_order_relaxed);
#endif
}

/* take_ticket is this launch's ticket on dev's gate g. */
static uint64_t take_ticket(const struct gw_limits *l, struct gw_gate *g, int dev) {
    _Atomic uint64_t *issued = &gw_usage->launches_issued[dev];
    if (__atomic_load_n(&l->abi_minor, __ATOMIC_RELAXED) < 4) return atomic_fetch_add(issued, 1) + 1;
    struct gw_batch *b = &gw_batch[dev];
    uint64_t closes = atomic_load_explicit(&g->closes, memory_order_acquire);
    b->since_sync++;
    if (GW_LIKELY(b->closes == closes && b->l == l)) {
        uint64_t t = next_ticket(&b->next);
        if (GW_LIKELY(t <= b->last)) return t;
    }
    uint64_t most = GW_BATCH_MAX, cur = atomic_load_explicit(issued, memory_order_relaxed), n;
    if (b->per_sync >= b->since_sync && b->per_sync - b->since_sync + 1 < most) most = b->per_sync - b->since_sync + 1;
    do {
        uint64_t grant = atomic_load(&g->grant);
        n = grant > cur ? (grant - cur) / 4 : 0;
        n = n < 1 ? 1 : n > most ? most : n;
    } while (!atomic_compare_exchange_weak(issued, &cur, cur + n));
    /* last first and last again: a handler that runs in between finds the
     * batch empty and takes its own (which this one then replaces, unused) */
    b->last = 0;
    atomic_signal_fence(memory_order_seq_cst);
    b->closes = closes, b->l = l, b->next = cur + 2;
    atomic_signal_fence(memory_order_seq_cst);
    b->last = cur + n;
    return cur + 1;
}

void gw_ticket_drop(int dev) {
    if (dev < 0 || dev >= GW_MAX_DEVICES) return;
    struct gw_batch *b = &gw_batch[dev];
    b->last = 0;
    if (b->since_sync) b->per_sync = b->since_sync;
    b->since_sync = 0;
}

void gw_tickets_atfork_child(void) { memset(gw_batch, 0, sizeof gw_batch); }

/* gw_gate_wait counts the launch on the current device, takes a ticket
 * there and waits until the agent's grant covers it, the gate is lifted, or
 * the agent falls silent: then until the grant, reckoned on at the agent's
 * last pace from its last beat, covers it, or the grace period since that
 * beat is over. A launch that waits leaves a completion mark for the work
 * before it on its stream s (marks.c). */
__attribute__((noinline)) CUresult gw_gate_wait(CUstream s) {
    struct gw_limits *l = atomic_load_explicit(&gw_limits, memory_order_acquire);
    int dev = gw_thread_dev();
    if (!l || dev < 0 || dev >= GW_MAX_DEVICES) return CUDA_SUCCESS;
    struct gw_slot *me = atomic_load(&gw_slot);
    struct gw_cell *cell = gw_my_cell;
    if (gw_usage_per_dev && me) {
        if (GW_LIKELY(cell)) gw_count_add(&cell->placed[dev], 1); /* summed by the reaper (counts.c) */
        else count_placed(&gw_usage->launches_dev[dev], &me->launches_placed, 1);
    }
    uint32_t bit = 1u << dev;
    if (!(atomic_load(&gw_snap_gate_mask) & bit)) return CUDA_SUCCESS;
    struct gw_gate *g = &l->gate[dev];
    struct pace *p = &pace[dev];
    uint64_t ticket = take_ticket(l, g, dev);
    if (GW_LIKELY(!atomic_load_explicit(&gw_limits_bad_since, memory_order_relaxed))) {
        uint64_t grant = atomic_load(&g->grant);
        pace_note(p, atomic_load_explicit(&l->heartbeat_ns, memory_order_relaxed), grant);
        if (ticket <= grant) return CUDA_SUCCESS;
    }
    uint64_t start = gw_now_ns();
    struct gw_mark mark;
    gw_mark_record(&mark, dev, s, ticket);
    for (;;) {
        uint32_t w = atomic_load(&g->wake);
        if (mark.ev) gw_mark_poll(&mark);
        gw_limits_check();
        if (!(atomic_load(&gw_snap_gate_mask) & bit)) break; /* the gate was lifted */
        uint64_t grant, beat, bad = atomic_load_explicit(&gw_limits_bad_since, memory_order_relaxed);
        if (!bad) {
            grant = atomic_load(&g->grant);
            beat = atomic_load_explicit(&l->heartbeat_ns, memory_order_relaxed);
            pace_note(p, beat, grant);
        } else { /* limits failed their check: trust what was seen before, as from a silent agent */
            grant = atomic_load_explicit(&p->last_grant, memory_order_relaxed);
            beat = atomic_load_explicit(&p->last_beat, memory_order_relaxed);
            if (!beat) beat = bad;
        }
        if (ticket <= grant) break;
        uint64_t now = gw_now_ns(), grace = atomic_load(&gw_snap_grace);
        uint64_t age = now > beat ? now - beat : 0, stale = grace / 2 < GW_STALE_NS ? grace / 2 : GW_STALE_NS;
        if (age >= grace) break; /* no agent: launches are not held */
        uint64_t wait = GW_WAIT_SLICE_NS;
        if (age >= stale) { /* a silent agent: its grant goes on at its last pace from its last beat */
            uint64_t per = pace_ns(p), ahead = ticket - grant;
            uint64_t due = ahead > (UINT64_MAX - beat) / per ? UINT64_MAX : beat + ahead * per;
            if (now >= due) break;
            if (due - now < wait) wait = due - now;
        } else if (stale - age < wait) {
            wait = stale - age;
        }
        if (grace - age < wait) wait = grace - age;
        if (mark.ev && wait > GW_MARK_POLL_NS) wait = GW_MARK_POLL_NS;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        syscall(SYS_futex, &g->wake, FUTEX_WAIT, w, &ts, NULL, 0);
    }
    if (mark.ev) gw_mark_cancel(&mark);
    uint64_t waited = gw_now_ns() - start;
    if (me) atomic_fetch_add(&me->throttled_ns, waited);
    if (gw_usage_per_dev && me) count_placed(&gw_usage->throttled_ns_dev[dev], &me->throttled_placed_ns, waited);
    return CUDA_SUCCESS;
}

static inline __attribute__((always_inline)) CUresult launch_enter(void) {
    if (GW_UNLIKELY(atomic_load_explicit(&gw_state, memory_order_acquire) != GW_READY)) {
        CUresult rc = gw_activate();
        if (rc) return rc;
    }
    gw_limits_check();
    /* counted before the gate, so that no reader sees more placed than launches */
    struct gw_cell *cell = gw_my_cell;
    if (GW_UNLIKELY(!cell)) cell = gw_cell_new();
    if (GW_LIKELY(cell)) gw_count_add(&cell->launches, 1);
    else atomic_fetch_add(&atomic_load_explicit(&gw_slot, memory_order_relaxed)->launches, 1);
    return CUDA_SUCCESS;
}

/* The direct path. A launch needs nothing of ours after the driver
 * returns (it was counted, and if gated its ticket granted, before), so it
 * can jump to the driver instead of calling it: no frame, no guard, nothing
 * of ours left to run while the driver's stores drain (which on NVIDIA's
 * driver costs more than the instructions; see the bench's launch rows).
 * Without the guard, a driver function that comes back into a hook would
 * be counted twice, so each launch hook takes the direct path only once a
 * guarded call of it succeeded and no call came back into the hooks
 * meanwhile (GW_DIRECT_OK); one that did stays guarded (GW_DIRECT_REENTERS;
 * simgpu's cuLaunchKernelEx_ptsz calls its base). */
enum { GW_DIRECT_UNKNOWN, GW_DIRECT_OK, GW_DIRECT_REENTERS };

static __attribute__((noinline)) void direct_learn(_Atomic int *direct, CUresult rc) {
    if (gw_reentered) {
        atomic_store_explicit(direct, GW_DIRECT_REENTERS, memory_order_relaxed);
    } else if (rc == CUDA_SUCCESS) { /* a failed call may have returned before reaching what it calls */
        int unknown = GW_DIRECT_UNKNOWN;
        atomic_compare_exchange_strong(direct, &unknown, GW_DIRECT_OK);
    }
}

/* launch_direct counts the launch and says 1 where the guarded path would
 * do nothing more than count it and wait at the gate: the hook is known not
 * to re-enter, no hook of this thread is running, the process is ready, the
 * limits seen are current, and the thread has its cell. Anything else takes
 * the guarded path, which does it all. */
static inline __attribute__((always_inline)) int launch_direct(_Atomic int *direct) {
    if (atomic_load_explicit(direct, memory_order_relaxed) != GW_DIRECT_OK || gw_in_hook) return 0;
    if (atomic_load_explicit(&gw_state, memory_order_acquire) != GW_READY) return 0;
    struct gw_limits *l = atomic_load_explicit(&gw_limits, memory_order_acquire);
    if (l && atomic_load_explicit(&l->seq, memory_order_relaxed) !=
                 atomic_load_explicit(&gw_limits_seq, memory_order_relaxed))
        return 0;
    struct gw_cell *cell = gw_my_cell;
    if (!cell) return 0;
    gw_count_add(&cell->launches, 1);
    return 1;
}

/* stream is the launch's stream, for its completion mark (a _ptsz
 * variant's default stream is the thread's own): evaluated only where a
 * gate is on, so the ungated launch reads nothing more. */
#define LAUNCH_HOOK(name, params, args, stream)                                                    \
    static _Atomic int name##_direct;                                                              \
    static __attribute__((noinline)) CUresult name##_guarded params {                              \
        const int outer = gw_in_hook;                                                              \
        if (GW_DRIVER_REENTRY(outer)) return gw_be.name args;                                      \
        CUresult rc = launch_enter();                                                              \
        if (GW_UNLIKELY(rc)) return rc;                                                            \
        if (GW_UNLIKELY(atomic_load_explicit(&gw_snap_gate_mask, memory_order_relaxed)))           \
            gw_gate_wait(stream);                                                                  \
        if (GW_UNLIKELY(!gw_be.name)) return CUDA_ERROR_NOT_FOUND;                                 \
        const int learn = !outer && atomic_load_explicit(&name##_direct, memory_order_relaxed) ==  \
                                        GW_DIRECT_UNKNOWN;                                         \
        if (GW_UNLIKELY(learn)) gw_reentered = 0;                                                  \
        gw_in_hook = 1;                                                                            \
        rc = gw_be.name args;                                                                      \
        gw_in_hook = outer;                                                                        \
        if (GW_UNLIKELY(learn)) direct_learn(&name##_direct, rc);                                  \
        return rc;                                                                                 \
    }                                                                                              \
    GW_EXPORT CUresult name params {                                                               \
        __typeof__(gw_be.name) next = gw_be.name;                                                  \
        if (GW_LIKELY(next && launch_direct(&name##_direct))) {                                    \
            if (GW_UNLIKELY(atomic_load_explicit(&gw_snap_gate_mask, memory_order_relaxed)))       \
                gw_gate_wait(stream);                                                              \
            return next args;                                                                      \
        }                                                                                          \
        return name##_guarded args;                                                                \
    }

#define KARGS (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)
#define CARGS (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)

#define PTSZ(s) ((s) ? (s) : CU_STREAM_PER_THREAD)
#define EX_STREAM (config ? config->hStream : NULL)

LAUNCH_HOOK(cuLaunchKernel, GW_LAUNCH_PARAMS, KARGS, hStream)
LAUNCH_HOOK(cuLaunchKernel_ptsz, GW_LAUNCH_PARAMS, KARGS, PTSZ(hStream))
LAUNCH_HOOK(cuLaunchCooperativeKernel, GW_COOP_PARAMS, CARGS, hStream)
LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, GW_COOP_PARAMS, CARGS, PTSZ(hStream))
LAUNCH_HOOK(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
            (config, f, kernelParams, extra), EX_STREAM)
LAUNCH_HOOK(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
            (config, f, kernelParams, extra), PTSZ(EX_STREAM))
LAUNCH_HOOK(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream), hStream)
LAUNCH_HOOK(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream), PTSZ(hStream))
