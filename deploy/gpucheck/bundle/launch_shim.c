/* launch-shim: an LD_PRELOAD library that wraps cuLaunchKernel as the
 * interposer does (the driver's function found with dlsym(RTLD_NEXT)) and
 * does one thing after the driver returns, chosen at build time:
 *
 *   GW_SHIM_AFTER=0  nothing: the call is a bare tail call (a jump)
 *   GW_SHIM_AFTER=1  a plain add to a process counter
 *   GW_SHIM_AFTER=2  a relaxed atomic add (on x86 a lock-prefixed add)
 *
 * Timed side by side, the three show what an instruction after the launch
 * costs on the driver at hand: a locked add waits for the stores the driver
 * left pending, a plain add does not. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "cuda.h"

#ifndef GW_SHIM_AFTER
#error "build with -DGW_SHIM_AFTER=0, 1 or 2"
#endif

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

static launch_fn real_launch;

/* Not static, so the compiler must keep every add to it. */
__attribute__((visibility("hidden"))) unsigned long gw_shim_launches;

__attribute__((constructor)) static void shim_init(void) {
    real_launch = (launch_fn)dlsym(RTLD_NEXT, "cuLaunchKernel");
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream s, void **params, void **extra) {
    if (!real_launch) return CUDA_ERROR_NOT_FOUND;
#if GW_SHIM_AFTER == 0
    return real_launch(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
#else
    CUresult rc = real_launch(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
#if GW_SHIM_AFTER == 1
    gw_shim_launches++;
#else
    __atomic_fetch_add(&gw_shim_launches, 1, __ATOMIC_RELAXED);
#endif
    return rc;
#endif
}
