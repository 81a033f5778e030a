/* Contexts: each thread has a stack of them, the top one is current. */
#include <stdlib.h>
#include <string.h>

#include "cuda_ctx_flags.h"
#include "internal.h"

#define SG_CTX_STACK 16

static __thread struct CUctx_st *tl_stack[SG_CTX_STACK];
static __thread int tl_depth;

static pthread_mutex_t g_primary_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUctx_st *g_primary[SG_MAX_DEVICES];
static unsigned g_primary_flags[SG_MAX_DEVICES]; /* kept while the primary context is inactive too */

int sg_ctx_valid(struct CUctx_st *c) { return c && c->magic == SG_MAGIC_CTX; }

CUresult sg_current(struct CUctx_st **ctx) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    struct CUctx_st *c = tl_depth ? tl_stack[tl_depth - 1] : NULL;
    if (!sg_ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *ctx = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_new(int dev, int primary, struct CUctx_st **out) {
    struct sg_state *s = sg_ready();
    if (!s) return CUDA_ERROR_NOT_INITIALIZED;
    int index = sg_dev_index(dev);
    if (index < 0) return CUDA_ERROR_INVALID_DEVICE;
    /* A context holds device memory of its own, as a real one does. */
    if (!sg_mem_charge(s, index, SG_CONTEXT_BYTES)) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) {
        sg_mem_uncharge(s, index, SG_CONTEXT_BYTES);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->magic = SG_MAGIC_CTX;
    c->dev = dev;
    c->index = index;
    c->primary = primary;
    c->refs = 1;
    pthread_mutex_init(&c->mu, NULL);
    c->null_stream = sg_stream_new(c);
    if (!c->null_stream) {
        free(c);
        sg_mem_uncharge(s, index, SG_CONTEXT_BYTES);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add(&sg_proc_self(s)->contexts[index], 1);
    *out = c;
    return CUDA_SUCCESS;
}

static void ctx_free(struct CUctx_st *c) {
    struct sg_state *s = sg_ready();
    pthread_mutex_lock(&c->mu);
    struct CUstream_st *st = c->streams;
    c->streams = NULL;
    pthread_mutex_unlock(&c->mu);
    while (st) {
        struct CUstream_st *next = st->next;
        sg_stream_free(st);
        st = next;
    }
    sg_stream_free(c->null_stream);
    sg_free_ctx(c);
    c->magic = 0;
    sg_mem_uncharge(s, c->index, SG_CONTEXT_BYTES);
    atomic_fetch_sub(&sg_proc_self(s)->contexts[c->index], 1);
    for (int i = 0; i < tl_depth; i++)
        if (tl_stack[i] == c) tl_stack[i] = NULL;
    free(c);
}

SG_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx || !cuda_ctx_flags_valid(flags)) return CUDA_ERROR_INVALID_VALUE;
    if (tl_depth == SG_CTX_STACK) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult rc = ctx_new(dev, 0, &c);
    if (rc) return rc;
    c->flags = flags;
    tl_stack[tl_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

/* The CUDA 11.4 and 12.5 forms add execution affinity and CIG parameters,
 * which a simulated device has nothing to do with. */
SG_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                                  CUdevice dev) {
    if (numParams < 0 || (numParams > 0 && !paramsArray)) return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

SG_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                  CUdevice dev) {
    (void)ctxCreateParams;
    return cuCtxCreate_v2(pctx, flags, dev);
}

SG_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!sg_ctx_valid(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    /* popped from this thread's stack if it is on top */
    if (tl_depth && tl_stack[tl_depth - 1] == ctx) tl_depth--;
    ctx_free(ctx);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx && !sg_ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx) {
        if (tl_depth) tl_depth--;
        return CUDA_SUCCESS;
    }
    if (tl_depth == 0) tl_depth = 1;
    tl_stack[tl_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = tl_depth ? tl_stack[tl_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!sg_ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (tl_depth == SG_CTX_STACK) return CUDA_ERROR_INVALID_VALUE;
    tl_stack[tl_depth++] = ctx;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!tl_depth) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = tl_stack[--tl_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

/* For tests, with SIMGPU_COUNT_CALLS=1: how often the process asked the
 * driver for its context's device (simgpu_ctx_get_device_calls). Off, the
 * count costs a load. */
static _Atomic int count_calls = -1;
static _Atomic unsigned long long get_device_calls;

SG_EXPORT unsigned long long simgpu_ctx_get_device_calls(void) { return atomic_load(&get_device_calls); }

SG_EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    int counting = atomic_load_explicit(&count_calls, memory_order_relaxed);
    if (counting < 0) {
        const char *v = getenv("SIMGPU_COUNT_CALLS");
        atomic_store(&count_calls, counting = v && !strcmp(v, "1"));
    }
    if (counting) atomic_fetch_add(&get_device_calls, 1);
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxSynchronize(void) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if ((rc = sg_stream_sync(c->null_stream))) return rc;
    pthread_mutex_lock(&c->mu);
    for (struct CUstream_st *st = c->streams; st && !rc; st = st->next) rc = sg_stream_sync(st);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

SG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (sg_dev_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_primary_mu);
    if (g_primary[dev]) {
        g_primary[dev]->refs++;
    } else {
        rc = ctx_new(dev, 1, &g_primary[dev]);
        if (!rc) g_primary[dev]->flags = g_primary_flags[dev];
    }
    if (!rc) *pctx = g_primary[dev];
    pthread_mutex_unlock(&g_primary_mu);
    return rc;
}

SG_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (sg_dev_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_primary_mu);
    struct CUctx_st *c = g_primary[dev];
    if (!c) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refs == 0) {
        g_primary[dev] = NULL;
        ctx_free(c);
    }
    pthread_mutex_unlock(&g_primary_mu);
    return rc;
}

/* The primary context's flags may change while it is active (the _v2
 * form); they outlive its release. */
SG_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (sg_dev_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!cuda_ctx_flags_valid(flags)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_primary_mu);
    g_primary_flags[dev] = flags;
    if (g_primary[dev]) g_primary[dev]->flags = flags;
    pthread_mutex_unlock(&g_primary_mu);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (sg_dev_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_primary_mu);
    *flags = g_primary_flags[dev];
    *active = g_primary[dev] != NULL;
    pthread_mutex_unlock(&g_primary_mu);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxGetFlags(unsigned int *flags) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuCtxSetFlags(unsigned int flags) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!cuda_ctx_flags_valid(flags)) return CUDA_ERROR_INVALID_VALUE;
    c->flags = flags;
    if (c->primary) {
        pthread_mutex_lock(&g_primary_mu);
        g_primary_flags[c->dev] = flags;
        pthread_mutex_unlock(&g_primary_mu);
    }
    return CUDA_SUCCESS;
}
