/* A context's flags as the driver API takes them (cuCtxCreate,
 * cuCtxSetFlags, cuDevicePrimaryCtxSetFlags): for a library that
 * implements the API itself, simgpu's libcuda.so.1 and gpuwarden's remote
 * client, so both refuse the same flags. */
#ifndef CUDA_CTX_FLAGS_H
#define CUDA_CTX_FLAGS_H

#include "cuda.h"

/* cuda_ctx_flags_valid: only CU_CTX_* bits, and one scheduling policy at most. */
static inline int cuda_ctx_flags_valid(unsigned flags) {
    unsigned sched = flags & CU_CTX_SCHED_MASK;
    return !(flags & ~(unsigned)CU_CTX_FLAGS_MASK) && (sched == CU_CTX_SCHED_AUTO || sched == CU_CTX_SCHED_SPIN ||
                                                       sched == CU_CTX_SCHED_YIELD || sched == CU_CTX_SCHED_BLOCKING_SYNC);
}

#endif
