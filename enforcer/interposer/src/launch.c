/* The launch path: count every launch in this process's slot and, when the
 * agent gates the device, wait for a grant. Without a gate this is a few
 * loads and one atomic add: no getenv, lock, log or allocation here. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"

#define GW_WAIT_SLICE_NS 100000000L /* re-check the agent's heartbeat this often */

/* gw_gate_wait takes a ticket on the current device and waits until the
 * agent's grant covers it, the gate is lifted, or the agent falls silent. */
__attribute__((noinline)) CUresult gw_gate_wait(void) {
    struct gw_limits *l = atomic_load_explicit(&gw_limits, memory_order_acquire);
    CUdevice dev;
    if (!l || gw_be.cuCtxGetDevice(&dev) || dev < 0 || dev >= GW_MAX_DEVICES) return CUDA_SUCCESS;
    uint32_t bit = 1u << dev;
    if (!(atomic_load(&gw_snap_gate_mask) & bit)) return CUDA_SUCCESS;
    struct gw_gate *g = &l->gate[dev];
    uint64_t ticket = atomic_fetch_add(&gw_usage->launches_issued[dev], 1) + 1;
    if (ticket <= atomic_load(&g->grant)) return CUDA_SUCCESS;
    uint64_t start = gw_now_ns();
    for (;;) {
        uint32_t w = atomic_load(&g->wake);
        if (ticket <= atomic_load(&g->grant)) break;
        gw_limits_check();
        if (!(atomic_load(&gw_snap_gate_mask) & bit)) break; /* the gate was lifted */
        uint64_t now = gw_now_ns(), beat = atomic_load(&l->heartbeat_ns), grace = atomic_load(&gw_snap_grace);
        if (now > beat && now - beat > grace) break; /* no agent: launches are not held */
        struct timespec ts = {0, GW_WAIT_SLICE_NS};
        syscall(SYS_futex, &g->wake, FUTEX_WAIT, w, &ts, NULL, 0);
    }
    struct gw_slot *me = atomic_load(&gw_slot);
    if (me) atomic_fetch_add(&me->throttled_ns, gw_now_ns() - start);
    return CUDA_SUCCESS;
}

static inline __attribute__((always_inline)) CUresult launch_enter(void) {
    if (GW_UNLIKELY(atomic_load_explicit(&gw_state, memory_order_acquire) != GW_READY)) {
        CUresult rc = gw_activate();
        if (rc) return rc;
    }
    gw_limits_check();
    if (GW_UNLIKELY(atomic_load_explicit(&gw_snap_gate_mask, memory_order_relaxed))) gw_gate_wait();
    atomic_fetch_add_explicit(&atomic_load_explicit(&gw_slot, memory_order_relaxed)->launches, 1,
                              memory_order_relaxed);
    return CUDA_SUCCESS;
}

#define LAUNCH_HOOK(name, params, args)                                                            \
    GW_EXPORT CUresult name params {                                                               \
        const int outer = gw_in_hook;                                                              \
        if (GW_DRIVER_REENTRY(outer)) return gw_be.name args;                                      \
        CUresult rc = launch_enter();                                                              \
        if (GW_UNLIKELY(rc)) return rc;                                                            \
        if (GW_UNLIKELY(!gw_be.name)) return CUDA_ERROR_NOT_FOUND;                                 \
        gw_in_hook = 1;                                                                            \
        rc = gw_be.name args;                                                                      \
        gw_in_hook = outer;                                                                        \
        return rc;                                                                                 \
    }

#define KARGS (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)
#define CARGS (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)

LAUNCH_HOOK(cuLaunchKernel, GW_LAUNCH_PARAMS, KARGS)
LAUNCH_HOOK(cuLaunchKernel_ptsz, GW_LAUNCH_PARAMS, KARGS)
LAUNCH_HOOK(cuLaunchCooperativeKernel, GW_COOP_PARAMS, CARGS)
LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, GW_COOP_PARAMS, CARGS)
LAUNCH_HOOK(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
            (config, f, kernelParams, extra))
LAUNCH_HOOK(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
            (config, f, kernelParams, extra))
LAUNCH_HOOK(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
LAUNCH_HOOK(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
