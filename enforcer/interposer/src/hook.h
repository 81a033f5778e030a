/* How a hook starts and ends. */
#ifndef GW_HOOK_H
#define GW_HOOK_H

#include "internal.h"

/* GW_ENTER passes a call straight to the driver when the driver itself
 * re-entered us (GW_DRIVER_REENTRY), fails it when the environment or control
 * block was bad, and claims this process's slot on its first managed call.
 * It declares gw_outer_, the guard as the hook found it, which GW_GUARDED
 * puts back. */
#define GW_ENTER(name, args)                                                                       \
    const int gw_outer_ = gw_in_hook;                                                              \
    do {                                                                                           \
        if (GW_DRIVER_REENTRY(gw_outer_)) return gw_be.name args;                                  \
        if (GW_UNLIKELY(atomic_load_explicit(&gw_state, memory_order_acquire) != GW_READY)) {      \
            CUresult rc_ = gw_activate();                                                          \
            if (rc_) return rc_;                                                                   \
        }                                                                                          \
        if (GW_UNLIKELY(!gw_be.name)) return CUDA_ERROR_NOT_FOUND;                                 \
    } while (0)

/* GW_GUARDED runs the hook's body with the re-entry guard set, and gives
 * the guard back as it was: a hook nested in a signal handler that
 * interrupted another hook leaves that one's guard set. */
#define GW_GUARDED(call)                                                                           \
    do {                                                                                           \
        gw_in_hook = 1;                                                                            \
        CUresult rc_ = (call);                                                                     \
        gw_in_hook = gw_outer_;                                                                    \
        return rc_;                                                                                \
    } while (0)

#endif
