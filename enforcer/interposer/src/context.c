/* Contexts: each takes device memory of its own, charged as a fixed reserve
 * (limits.context_reserve, default 64 MiB) when it is created: cuCtxCreate,
 * and a device's first primary-context retain in this process. The hooks
 * that change a thread's current context (set, push, pop, create, destroy,
 * primary release) also keep its device in gw_cur for the launch gate. */
#include <stdlib.h>

#include "hook.h"
#include "table.h"

static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int refs;         /* our count of the driver's retains */
    CUcontext ctx;
    uint64_t charged; /* bytes reserved for it */
} prim[GW_MAX_DEVICES];
static struct gw_tab ctxs = {.mu = PTHREAD_MUTEX_INITIALIZER}; /* cuCtxCreate'd context -> reserve */

__thread struct gw_cur gw_cur __attribute__((tls_model("initial-exec"))) = {.dev = GW_DEV_ASK};

/* The devices of the contexts made here (created, or retained primary), so
 * that making one current needs no question to the driver. Lock-free: set
 * and cleared by the hooks, read by any. An entry being replaced reads as
 * unknown (GW_DEV_ASK); a context not here is asked about once it is
 * current. */
#define GW_KNOWN_CTX 64
static struct {
    _Atomic(CUcontext) ctx;
    _Atomic int dev;
} known[GW_KNOWN_CTX];

static void known_note(CUcontext ctx, int dev) {
    int free_i = -1;
    for (int i = 0; i < GW_KNOWN_CTX; i++) {
        CUcontext c = atomic_load(&known[i].ctx);
        if (c == ctx) {
            atomic_store(&known[i].dev, dev);
            return;
        }
        if (!c && free_i < 0) free_i = i;
    }
    for (int i = free_i < 0 ? GW_KNOWN_CTX : free_i; i < GW_KNOWN_CTX; i++) {
        CUcontext none = NULL;
        if (atomic_compare_exchange_strong(&known[i].ctx, &none, ctx)) {
            atomic_store(&known[i].dev, dev);
            return;
        }
    }
}

static void known_forget(CUcontext ctx) {
    for (int i = 0; i < GW_KNOWN_CTX; i++)
        if (atomic_load(&known[i].ctx) == ctx) {
            atomic_store(&known[i].dev, GW_DEV_ASK);
            atomic_store(&known[i].ctx, NULL);
        }
}

/* current_is notes that ctx is now this thread's current context. */
static void current_is(CUcontext ctx) {
    if (!ctx) {
        gw_cur.dev = -1;
        return;
    }
    int dev = GW_DEV_ASK;
    for (int i = 0; i < GW_KNOWN_CTX && dev == GW_DEV_ASK; i++)
        if (atomic_load(&known[i].ctx) == ctx) dev = atomic_load(&known[i].dev);
    CUdevice d;
    if (dev == GW_DEV_ASK && !gw_be.cuCtxGetDevice(&d)) known_note(ctx, dev = d);
    gw_cur.dev = dev;
}

/* current_from_driver takes the current context from the driver, after a
 * call that may have changed it to one the hook cannot name (a pop, a
 * destroy, a release). */
static void current_from_driver(void) {
    CUcontext c = NULL;
    if (gw_be.cuCtxGetCurrent(&c)) gw_cur.dev = GW_DEV_ASK;
    else current_is(c);
}

GW_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    GW_ENTER(cuCtxSetCurrent, (ctx));
    gw_in_hook = 1;
    CUresult rc = gw_be.cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS && ctx) current_is(ctx);
    else if (rc == CUDA_SUCCESS) current_from_driver(); /* NULL may pop, leaving the one below current */
    gw_in_hook = gw_outer_;
    return rc;
}

GW_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    GW_ENTER(cuCtxPushCurrent_v2, (ctx));
    gw_in_hook = 1;
    CUresult rc = gw_be.cuCtxPushCurrent_v2(ctx);
    if (rc == CUDA_SUCCESS) current_is(ctx);
    gw_in_hook = gw_outer_;
    return rc;
}

GW_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    GW_ENTER(cuCtxPopCurrent_v2, (pctx));
    gw_in_hook = 1;
    CUresult rc = gw_be.cuCtxPopCurrent_v2(pctx);
    if (rc == CUDA_SUCCESS) current_from_driver();
    gw_in_hook = gw_outer_;
    return rc;
}

void gw_context_atfork(int phase) {
    if (phase == 0) {
        pthread_mutex_lock(&prim_mu);
        pthread_mutex_lock(&ctxs.mu);
    } else if (phase == 1) {
        pthread_mutex_unlock(&ctxs.mu);
        pthread_mutex_unlock(&prim_mu);
    } else {
        /* the parent's contexts are charged to the parent */
        pthread_mutex_init(&prim_mu, NULL);
        for (int d = 0; d < GW_MAX_DEVICES; d++) prim[d].refs = 0, prim[d].ctx = NULL, prim[d].charged = 0;
        gw_tab_reset(&ctxs);
        for (int i = 0; i < GW_KNOWN_CTX; i++) atomic_store(&known[i].ctx, NULL), atomic_store(&known[i].dev, GW_DEV_ASK);
        gw_cur.dev = GW_DEV_ASK;
    }
}

/* The cuCtxCreate forms (CUDA 3.2, 11.4, 12.5) differ only in what they pass
 * the driver; each is charged the same reserve. */
struct ctx_args {
    int version;
    unsigned flags;
    CUexecAffinityParam *affinity;
    int naffinity;
    CUctxCreateParams *params;
};

static CUresult driver_ctx_create(CUcontext *pctx, CUdevice dev, const struct ctx_args *a) {
    switch (a->version) {
    case 3: return gw_be.cuCtxCreate_v3(pctx, a->affinity, a->naffinity, a->flags, dev);
    case 4: return gw_be.cuCtxCreate_v4(pctx, a->params, a->flags, dev);
    default: return gw_be.cuCtxCreate_v2(pctx, a->flags, dev);
    }
}

static CUresult ctx_create(CUcontext *pctx, CUdevice dev, const struct ctx_args *a) {
    uint64_t charge = gw_context_reserve();
    struct gw_rec *r = calloc(1, sizeof *r);
    if (!r || !pctx || dev < 0 || dev >= GW_MAX_DEVICES) {
        free(r);
        return r ? driver_ctx_create(pctx, dev, a) : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!gw_reserve(dev, charge)) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = driver_ctx_create(pctx, dev, a);
    if (rc != CUDA_SUCCESS) {
        gw_release(dev, charge);
        free(r);
        return rc;
    }
    *r = (struct gw_rec){.key = (uint64_t)(uintptr_t)*pctx, .bytes = charge, .dev = dev};
    gw_tab_put(&ctxs, r);
    known_note(*pctx, dev);
    gw_cur.dev = dev; /* a new context is pushed, current */
    return rc;
}

GW_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    GW_ENTER(cuCtxCreate_v2, (pctx, flags, dev));
    GW_GUARDED(ctx_create(pctx, dev, &(struct ctx_args){.version = 2, .flags = flags}));
}

GW_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev) {
    GW_ENTER(cuCtxCreate_v3, (pctx, paramsArray, numParams, flags, dev));
    GW_GUARDED(ctx_create(pctx, dev,
                          &(struct ctx_args){.version = 3, .flags = flags, .affinity = paramsArray,
                                             .naffinity = numParams}));
}

GW_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                  CUdevice dev) {
    GW_ENTER(cuCtxCreate_v4, (pctx, ctxCreateParams, flags, dev));
    GW_GUARDED(ctx_create(pctx, dev, &(struct ctx_args){.version = 4, .flags = flags, .params = ctxCreateParams}));
}

static CUresult ctx_destroy(CUcontext ctx) {
    CUresult rc = gw_be.cuCtxDestroy_v2(ctx);
    if (rc != CUDA_SUCCESS) return rc;
    struct gw_rec *r = gw_tab_take(&ctxs, (uint64_t)(uintptr_t)ctx);
    known_forget(ctx);
    current_from_driver();
    gw_release_ctx(ctx); /* its allocations went with it */
    if (r) gw_release(r->dev, r->bytes);
    free(r);
    return rc;
}

GW_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    GW_ENTER(cuCtxDestroy_v2, (ctx));
    GW_GUARDED(ctx_destroy(ctx));
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev) {
    if (!pctx || dev < 0 || dev >= GW_MAX_DEVICES) return gw_be.cuDevicePrimaryCtxRetain(pctx, dev);
    pthread_mutex_lock(&prim_mu);
    uint64_t charge = 0;
    int reserved = 0;
    CUresult rc = CUDA_SUCCESS;
    if (prim[dev].refs == 0) {
        charge = gw_context_reserve();
        reserved = gw_reserve(dev, charge);
        if (!reserved) rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc == CUDA_SUCCESS) rc = gw_be.cuDevicePrimaryCtxRetain(pctx, dev);
    if (rc == CUDA_SUCCESS) {
        if (prim[dev].refs++ == 0) prim[dev].ctx = *pctx, prim[dev].charged = charge;
        known_note(*pctx, dev);
    } else if (reserved) {
        gw_release(dev, charge);
    }
    pthread_mutex_unlock(&prim_mu);
    return rc;
}

GW_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    GW_ENTER(cuDevicePrimaryCtxRetain, (pctx, dev));
    GW_GUARDED(primary_retain(pctx, dev));
}

static CUresult primary_release(CUdevice dev) {
    if (dev < 0 || dev >= GW_MAX_DEVICES) return gw_be.cuDevicePrimaryCtxRelease_v2(dev);
    pthread_mutex_lock(&prim_mu);
    CUresult rc = gw_be.cuDevicePrimaryCtxRelease_v2(dev);
    if (rc == CUDA_SUCCESS && prim[dev].refs > 0 && --prim[dev].refs == 0) {
        /* the driver destroys the primary context, and its memory with it */
        gw_release_ctx(prim[dev].ctx);
        gw_release(dev, prim[dev].charged);
        known_forget(prim[dev].ctx);
        current_from_driver();
        prim[dev].ctx = NULL;
        prim[dev].charged = 0;
    }
    pthread_mutex_unlock(&prim_mu);
    return rc;
}

GW_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    GW_ENTER(cuDevicePrimaryCtxRelease_v2, (dev));
    GW_GUARDED(primary_release(dev));
}
