/* The CUDA driver API of the remote client: every function simgpu's cuda.h
 * declares, forwarded to gpuwarden-worker. Context calls, and facts of a
 * device or module the worker has told once, are answered here;
 * asynchronous calls (launches, memsets, host-to-device copies, event
 * records, frees, handle creation) are queued and answered at once;
 * synchronous ones wait for the worker's reply. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cuda_ctx_flags.h"

#define Q(x) ((uint64_t)(x))
#define I(x) ((uint32_t)(x))
#define SID(s) ((uint64_t)(uintptr_t)(s))

static int g_init; /* cuInit succeeded in this process */

/* Facts no call changes in a session: a device's handle, count, name,
 * attributes and UUID, asked of the worker once each and answered here after
 * (frameworks ask for every attribute of every device, often more than
 * once: a round trip each). Each fact is written before its known flag,
 * so a reader that sees the flag sees the fact. A new session (a forked
 * child's, perhaps on another worker) forgets them. */
#define GWR_FACT_DEVS 64
#define GWR_FACT_ATTRS 256
static struct {
    uint32_t count, dev[GWR_FACT_DEVS], attr[GWR_FACT_DEVS][GWR_FACT_ATTRS];
    CUuuid uuid[GWR_FACT_DEVS][2];
    char name[GWR_FACT_DEVS][256];
    uint8_t count_known, dev_known[GWR_FACT_DEVS], attr_known[GWR_FACT_DEVS][GWR_FACT_ATTRS],
        uuid_known[GWR_FACT_DEVS][2], name_known[GWR_FACT_DEVS];
} g_facts;

#define FACT_KNOWN(flag) __atomic_load_n(&(flag), __ATOMIC_ACQUIRE)
#define FACT_LEARN(flag) __atomic_store_n(&(flag), 1, __ATOMIC_RELEASE)
#define FACT_DEV(d) ((uint32_t)(d) < GWR_FACT_DEVS)

/* session opens (or, in a forked child, reopens) the session and inits the driver there. */
static CUresult session(void) {
    memset(&g_facts, 0, sizeof g_facts);
    CUresult rc = gwr_connect();
    if (rc) return rc;
    uint8_t b[8];
    size_t n = gwr_encode(b, sizeof b, "i", I(0));
    return gwr_call(GWR_OP_INIT, b, n, NULL, 0, NULL, 0, NULL, NULL, 0);
}

static CUresult ready(void) {
    if (!__atomic_load_n(&g_init, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED;
    if (gwr_connected()) return CUDA_SUCCESS;
    if (gwr_dead()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    return session(); /* a forked child starts a session of its own */
}

/* rq: a synchronous request of fields by fmt; out gets exactly nout bytes. */
static CUresult rq(uint16_t op, void *out, size_t nout, const char *fmt, ...) {
    uint8_t b[128];
    va_list ap;
    va_start(ap, fmt);
    size_t n = gwr_vencode(b, sizeof b, fmt, ap);
    va_end(ap);
    size_t got = 0;
    CUresult rc = gwr_call(op, b, n, NULL, 0, out, nout, &got, NULL, 0);
    if (rc == CUDA_SUCCESS && got != nout) return CUDA_ERROR_UNKNOWN; /* a reply of the wrong shape */
    return rc;
}

/* aq: an asynchronous request; its error, if any, comes at a later synchronization. */
static CUresult aq(uint16_t op, const char *fmt, ...) {
    uint8_t b[128];
    va_list ap;
    va_start(ap, fmt);
    size_t n = gwr_vencode(b, sizeof b, fmt, ap);
    va_end(ap);
    return gwr_async(op, b, n, NULL, 0);
}

#define READY()                                                                                    \
    do {                                                                                           \
        CUresult rc_ = ready();                                                                    \
        if (rc_) return rc_;                                                                       \
    } while (0)

/* stream_id names a stream to the worker: the default streams by their
 * constants, others by their handle's id; -1 for a bad handle. */
static int stream_id(CUstream s, uint64_t *id) {
    if (SID(s) <= 2) {
        *id = SID(s);
        return 0;
    }
    *id = gwr_obj_id(s, GWR_K_STREAM);
    return *id ? 0 : -1;
}

#define STREAM(s, id)                                                                              \
    uint64_t id;                                                                                   \
    if (stream_id((s), &id)) return CUDA_ERROR_INVALID_HANDLE

/* ------------------------------------------------------------------------ */
/* Initialisation, devices, errors                                           */

GWR_EXPORT CUresult cuInit(unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (__atomic_load_n(&g_init, __ATOMIC_ACQUIRE)) return ready();
    CUresult rc = session();
    if (!rc) __atomic_store_n(&g_init, 1, __ATOMIC_RELEASE);
    return rc;
}

GWR_EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION; /* the API this library implements */
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    READY();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (FACT_DEV(ordinal) && FACT_KNOWN(g_facts.dev_known[ordinal])) {
        *device = (CUdevice)g_facts.dev[ordinal];
        return CUDA_SUCCESS;
    }
    uint32_t d;
    CUresult rc = rq(GWR_OP_DEVICE_GET, &d, 4, "i", I(ordinal));
    if (rc) return rc;
    if (FACT_DEV(ordinal)) {
        g_facts.dev[ordinal] = d;
        FACT_LEARN(g_facts.dev_known[ordinal]);
    }
    *device = (CUdevice)d;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuDeviceGetCount(int *count) {
    READY();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (!FACT_KNOWN(g_facts.count_known)) {
        CUresult rc = rq(GWR_OP_DEVICE_COUNT, &g_facts.count, 4, "");
        if (rc) return rc;
        FACT_LEARN(g_facts.count_known);
    }
    *count = (int)g_facts.count;
    return CUDA_SUCCESS;
}

/* A device's name is asked whole (the worker's buffer, 256 bytes) and cut
 * here to the caller's length, so that it is a fact like the others. A
 * call without a buffer goes to the worker, whose driver says what is
 * wrong first. */
GWR_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    READY();
    if (name && len > 0 && FACT_DEV(dev) && FACT_KNOWN(g_facts.name_known[dev])) {
        snprintf(name, (size_t)len, "%s", g_facts.name[dev]);
        return CUDA_SUCCESS;
    }
    uint8_t b[16];
    size_t n = gwr_encode(b, sizeof b, "ii", I(dev), I(name && len > 0 ? sizeof g_facts.name[0] : 0)), got = 0;
    char tmp[sizeof g_facts.name[0]];
    CUresult rc = gwr_call(GWR_OP_DEVICE_NAME, b, n, NULL, 0, tmp, sizeof tmp, &got, NULL, 0);
    if (rc) return rc;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    tmp[got ? got - 1 : 0] = 0;
    if (FACT_DEV(dev)) {
        memcpy(g_facts.name[dev], tmp, sizeof tmp);
        FACT_LEARN(g_facts.name_known[dev]);
    }
    snprintf(name, (size_t)len, "%s", tmp);
    return CUDA_SUCCESS;
}

static CUresult uuid(CUuuid *u, CUdevice dev, int v2) {
    READY();
    CUuuid tmp;
    if (FACT_DEV(dev) && FACT_KNOWN(g_facts.uuid_known[dev][v2])) {
        tmp = g_facts.uuid[dev][v2];
    } else {
        CUresult rc = rq(GWR_OP_DEVICE_UUID, tmp.bytes, 16, "ii", I(dev), I(v2));
        if (rc) return rc;
        if (FACT_DEV(dev)) {
            g_facts.uuid[dev][v2] = tmp;
            FACT_LEARN(g_facts.uuid_known[dev][v2]);
        }
    }
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    *u = tmp;
    return CUDA_SUCCESS;
}
GWR_EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev) { return uuid(u, dev, 0); }
GWR_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev) { return uuid(u, dev, 1); }

GWR_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    READY();
    uint64_t v; /* not a fact: the worker's interposer says the memory quota, which may change */
    CUresult rc = rq(GWR_OP_DEVICE_TOTALMEM, &v, 8, "i", I(dev));
    if (rc) return rc;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = v;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    READY();
    uint32_t v;
    int fact = FACT_DEV(dev) && (uint32_t)attrib < GWR_FACT_ATTRS;
    if (fact && FACT_KNOWN(g_facts.attr_known[dev][attrib])) {
        v = g_facts.attr[dev][attrib];
    } else {
        CUresult rc = rq(GWR_OP_DEVICE_ATTR, &v, 4, "ii", I(attrib), I(dev));
        if (rc) return rc;
        if (fact) {
            g_facts.attr[dev][attrib] = v;
            FACT_LEARN(g_facts.attr_known[dev][attrib]);
        }
    }
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    /* managed memory is refused here (README.md): say the device has none */
    *pi = attrib == CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY || attrib == CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
              ? 0
              : (int)v;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    READY();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    static void *pools[64];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    if (dev < 0 || dev >= 64) return rq(GWR_OP_DEVICE_POOL, NULL, 0, "qi", Q(0), I(dev)); /* the worker says why */
    pthread_mutex_lock(&mu);
    if (!pools[dev]) pools[dev] = gwr_obj_new(GWR_K_POOL);
    void *h = pools[dev];
    pthread_mutex_unlock(&mu);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = rq(GWR_OP_DEVICE_POOL, NULL, 0, "qi", gwr_obj_id(h, GWR_K_POOL), I(dev));
    if (!rc) *pool = h;
    return rc;
}

/* Error names and texts: the table shared with simgpu. */
#include "cuda_errors.h"

/* ------------------------------------------------------------------------ */
/* Contexts: each thread's stack is kept here                                */

#define CTX_STACK 16
static __thread struct CUctx_st *tl_stack[CTX_STACK];
static __thread int tl_depth;

static int ctx_valid(const struct CUctx_st *c) { return c && c->magic == GWR_CTX_MAGIC; }

/* cur is the calling thread's current context, or NULL: none, or destroyed. */
static struct CUctx_st *cur(void) {
    struct CUctx_st *c = tl_depth ? tl_stack[tl_depth - 1] : NULL;
    return ctx_valid(c) ? c : NULL;
}

uint64_t gwr_cur_ctx(void) {
    const struct CUctx_st *c = cur();
    return c ? c->id : 0;
}

int gwr_cur_blocking_sync(void) {
    const struct CUctx_st *c = cur();
    return c && (c->flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC;
}

static struct CUctx_st *ctx_new(CUdevice dev, int primary) {
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->magic = GWR_CTX_MAGIC;
    c->id = gwr_new_id();
    c->dev = dev;
    c->primary = primary;
    return c;
}

static struct CUctx_st *g_primary[64];
static unsigned g_primary_flags[64]; /* kept while the primary context is inactive too */
static pthread_mutex_t g_primary_mu = PTHREAD_MUTEX_INITIALIZER;

GWR_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    READY();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= 64) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_primary_mu);
    if (!g_primary[dev] && (g_primary[dev] = ctx_new(dev, 1))) g_primary[dev]->flags = g_primary_flags[dev];
    struct CUctx_st *c = g_primary[dev];
    pthread_mutex_unlock(&g_primary_mu);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = rq(GWR_OP_PRIMARY_RETAIN, NULL, 0, "qi", Q(c->id), I(dev));
    if (!rc) {
        __atomic_fetch_add(&c->refs, 1, __ATOMIC_RELAXED);
        *pctx = c;
    }
    return rc;
}

GWR_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    READY();
    if (dev < 0 || dev >= 64) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_primary_mu);
    struct CUctx_st *c = g_primary[dev];
    pthread_mutex_unlock(&g_primary_mu);
    CUresult rc = rq(GWR_OP_PRIMARY_RELEASE, NULL, 0, "qi", Q(c ? c->id : 0), I(dev));
    if (!rc && c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_RELAXED) == 0)
        gwr_alloc_drop_ctx(c->id); /* the last release destroys it, and its memory */
    return rc;
}

/* dev_check: dev is one of the session's devices (their count is a fact). */
static CUresult dev_check(CUdevice dev) {
    int n;
    CUresult rc = cuDeviceGetCount(&n);
    if (rc) return rc;
    return dev < 0 || dev >= n || dev >= 64 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

/* A context's flags stay here: they say how the calling thread waits for
 * the worker's replies (client.c), and the worker's own contexts keep the
 * driver's default. The primary context's may change while it is active
 * (the _v2 form), and outlive its last release. */
GWR_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    READY();
    CUresult rc = dev_check(dev);
    if (rc) return rc;
    if (!cuda_ctx_flags_valid(flags)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_primary_mu);
    g_primary_flags[dev] = flags;
    if (g_primary[dev]) g_primary[dev]->flags = flags;
    pthread_mutex_unlock(&g_primary_mu);
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    READY();
    CUresult rc = dev_check(dev);
    if (rc) return rc;
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_primary_mu);
    *flags = g_primary_flags[dev];
    *active = g_primary[dev] && __atomic_load_n(&g_primary[dev]->refs, __ATOMIC_RELAXED) > 0;
    pthread_mutex_unlock(&g_primary_mu);
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxGetFlags(unsigned int *flags) {
    READY();
    struct CUctx_st *c = cur();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxSetFlags(unsigned int flags) {
    READY();
    struct CUctx_st *c = cur();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!cuda_ctx_flags_valid(flags)) return CUDA_ERROR_INVALID_VALUE;
    c->flags = flags;
    if (c->primary) {
        pthread_mutex_lock(&g_primary_mu);
        g_primary_flags[c->dev] = flags;
        pthread_mutex_unlock(&g_primary_mu);
    }
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    READY();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (tl_depth == CTX_STACK) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = ctx_new(dev, 0);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->flags = flags;
    CUresult rc = rq(GWR_OP_CTX_CREATE, NULL, 0, "qii", Q(c->id), I(flags), I(dev));
    if (rc) {
        free(c); /* never handed out */
        return rc;
    }
    tl_stack[tl_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return ctx_create(pctx, flags, dev);
}

/* Execution affinity and CIG parameters are not sent: none is supported remotely. */
GWR_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                                   CUdevice dev) {
    if (numParams < 0 || (numParams > 0 && !paramsArray)) return CUDA_ERROR_INVALID_VALUE;
    if (numParams > 0) return CUDA_ERROR_NOT_SUPPORTED;
    return ctx_create(pctx, flags, dev);
}

GWR_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                   CUdevice dev) {
    if (ctxCreateParams) return CUDA_ERROR_NOT_SUPPORTED;
    return ctx_create(pctx, flags, dev);
}

GWR_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    READY();
    if (!ctx_valid(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = rq(GWR_OP_CTX_DESTROY, NULL, 0, "q", Q(ctx->id));
    if (rc) return rc;
    if (tl_depth && tl_stack[tl_depth - 1] == ctx) tl_depth--;
    ctx->magic = 0;
    gwr_alloc_drop_ctx(ctx->id); /* its memory went with it */
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    READY();
    if (ctx && !ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx) {
        if (tl_depth) tl_depth--;
        return CUDA_SUCCESS;
    }
    if (tl_depth == 0) tl_depth = 1;
    tl_stack[tl_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    READY();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = tl_depth ? tl_stack[tl_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    READY();
    if (!ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (tl_depth == CTX_STACK) return CUDA_ERROR_INVALID_VALUE;
    tl_stack[tl_depth++] = ctx;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    READY();
    if (!tl_depth) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = tl_stack[--tl_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

static CUresult current(struct CUctx_st **out) {
    READY();
    struct CUctx_st *c = cur();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuCtxSynchronize(void) {
    READY();
    return rq(GWR_OP_CTX_SYNC, NULL, 0, "");
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

GWR_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    READY();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    uint64_t p;
    CUresult rc = rq(GWR_OP_MEM_ALLOC, &p, 8, "q", Q(bytesize));
    if (!rc) {
        gwr_alloc_add(p, bytesize, gwr_cur_ctx(), 0);
        *dptr = p;
    }
    return rc;
}

GWR_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                       unsigned int ElementSizeBytes) {
    READY();
    if (!dptr || !pPitch) return CUDA_ERROR_INVALID_VALUE;
    uint64_t out[2];
    CUresult rc = rq(GWR_OP_MEM_ALLOC_PITCH, out, 16, "qqi", Q(WidthInBytes), Q(Height), I(ElementSizeBytes));
    if (!rc) {
        gwr_alloc_add(out[0], out[1] * Height, gwr_cur_ctx(), 0);
        *dptr = out[0], *pPitch = out[1];
    }
    return rc;
}

/* Managed memory would need the client's page faults served over the
 * network; it is refused, as README.md says. */
GWR_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    (void)dptr, (void)bytesize, (void)flags;
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "gpuwarden: cuMemAllocManaged: managed memory is not supported on a remote GPU\n");
    return CUDA_ERROR_NOT_SUPPORTED;
}

GWR_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    if (!dptr) return CUDA_SUCCESS; /* freeing NULL is a no-op */
    if (gwr_alloc_take(dptr)) return CUDA_ERROR_INVALID_VALUE;
    return aq(GWR_OP_MEM_FREE, "q", Q(dptr));
}

GWR_EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    READY();
    uint64_t out[2];
    CUresult rc = rq(GWR_OP_MEM_INFO, out, 16, "");
    if (rc) return rc;
    if (!free_ || !total) return CUDA_ERROR_INVALID_VALUE;
    *free_ = out[0], *total = out[1];
    return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int ptsz) {
    READY();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    uint64_t pid = pool ? gwr_obj_id(pool, GWR_K_POOL) : 0, p;
    if (pool && !pid) return CUDA_ERROR_INVALID_VALUE;
    STREAM(s, sid);
    CUresult rc = rq(GWR_OP_MEM_ALLOC_ASYNC, &p, 8, "qqqi", Q(bytes), sid, pid, I(ptsz));
    if (!rc) {
        gwr_alloc_add(p, bytes, gwr_cur_ctx(), 0);
        *dptr = p;
    }
    return rc;
}
GWR_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, NULL, s, 0); }
GWR_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, NULL, s, 1); }
GWR_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(d, n, p, s, 0);
}
GWR_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(d, n, p, s, 1);
}

static CUresult free_async(CUdeviceptr dptr, CUstream s, uint32_t ptsz) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    STREAM(s, sid);
    if (gwr_alloc_take(dptr)) return CUDA_ERROR_INVALID_VALUE;
    return aq(GWR_OP_MEM_FREE_ASYNC, "qqi", Q(dptr), sid, ptsz);
}
GWR_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s, 0); }
GWR_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s, 1); }

GWR_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    READY();
    if (!pool || !poolProps) return CUDA_ERROR_INVALID_VALUE;
    void *h = gwr_obj_new(GWR_K_POOL);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    uint8_t b[16];
    size_t n = gwr_encode(b, sizeof b, "q", gwr_obj_id(h, GWR_K_POOL));
    /* synchronous: a pool's properties are checked where it is created */
    CUresult rc = gwr_call(GWR_OP_POOL_CREATE, b, n, poolProps, sizeof *poolProps, NULL, 0, NULL, NULL, 0);
    if (rc) gwr_obj_free(h);
    else *pool = h;
    return rc;
}

GWR_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    READY();
    uint64_t id = gwr_obj_id(pool, GWR_K_POOL);
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = rq(GWR_OP_POOL_DESTROY, NULL, 0, "q", id);
    if (!rc) gwr_obj_free(pool);
    return rc;
}

GWR_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option) {
    READY();
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    uint8_t b[8];
    size_t n = gwr_encode(b, sizeof b, "i", I(option)), got = 0;
    uint64_t g;
    CUresult rc = gwr_call(GWR_OP_MEM_GRANULARITY, b, n, prop, sizeof *prop, &g, 8, &got, NULL, 0);
    if (!rc && got == 8) *granularity = g;
    return rc;
}

GWR_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                unsigned long long flags) {
    READY();
    if (!handle || !prop) return CUDA_ERROR_INVALID_VALUE;
    uint64_t id = gwr_new_id();
    uint8_t b[32];
    size_t n = gwr_encode(b, sizeof b, "qqq", id, Q(size), Q(flags));
    CUresult rc = gwr_call(GWR_OP_MEM_CREATE, b, n, prop, sizeof *prop, NULL, 0, NULL, NULL, 0);
    if (!rc) *handle = id;
    return rc;
}

GWR_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    READY();
    return rq(GWR_OP_MEM_RELEASE, NULL, 0, "q", Q(handle));
}

GWR_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                        unsigned long long flags) {
    READY();
    if (!ptr) return CUDA_ERROR_INVALID_VALUE;
    uint64_t p;
    CUresult rc = rq(GWR_OP_MEM_RESERVE, &p, 8, "qqqq", Q(size), Q(alignment), Q(addr), Q(flags));
    if (!rc) *ptr = p;
    return rc;
}

GWR_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    READY();
    return rq(GWR_OP_MEM_ADDR_FREE, NULL, 0, "qq", Q(ptr), Q(size));
}

GWR_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                             unsigned long long flags) {
    READY();
    CUresult rc = rq(GWR_OP_MEM_MAP, NULL, 0, "qqqqq", Q(ptr), Q(size), Q(offset), Q(handle), Q(flags));
    if (!rc) gwr_alloc_add(ptr, size, 0, 1);
    return rc;
}

GWR_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    READY();
    CUresult rc = rq(GWR_OP_MEM_UNMAP, NULL, 0, "qq", Q(ptr), Q(size));
    if (!rc) gwr_alloc_unmap(ptr, size);
    return rc;
}

GWR_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    READY();
    if ((!desc && count) || count > 64) return CUDA_ERROR_INVALID_VALUE;
    uint8_t b[16];
    size_t n = gwr_encode(b, sizeof b, "qq", Q(ptr), Q(size));
    return gwr_call(GWR_OP_MEM_SET_ACCESS, b, n, desc, count * sizeof *desc, NULL, 0, NULL, NULL, 0);
}

/* Host-to-device: the bytes go into the frames or the bulk ring (the caller
 * may reuse its buffer at once), a chunk at a time. */
GWR_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    if (!ByteCount) return CUDA_SUCCESS;
    if (!srcHost || !gwr_alloc_has(dstDevice, ByteCount)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t off = 0; off < ByteCount; off += GWR_CHUNK) {
        size_t k = ByteCount - off < GWR_CHUNK ? ByteCount - off : GWR_CHUNK;
        if ((rc = gwr_htod(Q(dstDevice + off), (const uint8_t *)srcHost + off, k))) return rc;
    }
    return CUDA_SUCCESS;
}

/* Device-to-host: one request; the worker streams the bytes back in chunks
 * straight into dstHost. */
GWR_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    READY();
    if (!ByteCount) return CUDA_SUCCESS;
    if (!dstHost) return CUDA_ERROR_INVALID_VALUE;
    uint8_t b[16];
    size_t n = gwr_encode(b, sizeof b, "qq", Q(srcDevice), Q(ByteCount));
    return gwr_call(GWR_OP_DTOH, b, n, NULL, 0, NULL, 0, NULL, dstHost, ByteCount);
}

GWR_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    if (!N) return CUDA_SUCCESS;
    if (!gwr_alloc_has(dstDevice, N)) return CUDA_ERROR_INVALID_VALUE;
    return aq(GWR_OP_MEMSET8, "qqi", Q(dstDevice), Q(N), I(uc));
}

/* ------------------------------------------------------------------------ */
/* Modules and functions                                                     */

/* image_size: how many bytes cuModuleLoadData would read of an image: an
 * ELF's extent from its headers, a fatbin's from its header, else the
 * NUL-terminated text (PTX, or what simgpu reads). 0: not one of those. */
static size_t image_size(const uint8_t *p) {
    if (!memcmp(p, "\177ELF", 4)) {
        if (p[4] != 2) return 0; /* cubins are ELF64 */
        uint64_t shoff, phoff, end;
        uint16_t shentsize, shnum, phentsize, phnum;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        if (shoff > GWR_MAX_IMAGE || (phnum && phoff > GWR_MAX_IMAGE) || shentsize < 64) return 0;
        end = shoff + (uint64_t)shentsize * shnum;
        if (phnum && phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
        for (uint16_t i = 0; i < shnum; i++) { /* a section's bytes may lie after the headers */
            const uint8_t *sh = p + shoff + (uint64_t)i * shentsize;
            uint32_t type;
            uint64_t off, size;
            memcpy(&type, sh + 4, 4);
            memcpy(&off, sh + 0x18, 8);
            memcpy(&size, sh + 0x20, 8);
            if (type != 8 /* SHT_NOBITS */ && off <= GWR_MAX_IMAGE && size <= GWR_MAX_IMAGE && off + size > end)
                end = off + size;
        }
        return end <= GWR_MAX_IMAGE ? (size_t)end : 0;
    }
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic == 0xBA55ED50u) { /* fatbin: u32 magic, u16 version, u16 header size, u64 body size */
        uint16_t hsize;
        uint64_t fsize;
        memcpy(&hsize, p + 6, 2);
        memcpy(&fsize, p + 8, 8);
        return fsize <= GWR_MAX_IMAGE ? hsize + (size_t)fsize : 0;
    }
    size_t n = strnlen((const char *)p, GWR_MAX_IMAGE);
    return n < GWR_MAX_IMAGE ? n + 1 : 0;
}

GWR_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    READY();
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    size_t size = image_size(image);
    if (!size) return CUDA_ERROR_INVALID_IMAGE;
    uint8_t hash[GWR_HASH_SIZE], b[64];
    gwr_sha256(image, size, hash);
    void *h = gwr_obj_new(GWR_K_MODULE);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t n = gwr_encode(b, sizeof b, "qhq", gwr_obj_id(h, GWR_K_MODULE), hash, Q(size));
    /* The worker may have the image already, from this session or its cache. */
    CUresult rc = gwr_call(GWR_OP_MODULE_LOAD, b, n, NULL, 0, NULL, 0, NULL, NULL, 0);
    if (rc == (CUresult)GWR_NEED_IMAGE) {
        rc = CUDA_SUCCESS;
        for (size_t off = 0; off < size && !rc; off += GWR_CHUNK) {
            size_t k = size - off < GWR_CHUNK ? size - off : GWR_CHUNK;
            uint8_t c[64];
            size_t m = gwr_encode(c, sizeof c, "hqq", hash, Q(size), Q(off));
            rc = gwr_async(GWR_OP_IMAGE_CHUNK, c, m, (const uint8_t *)image + off, k);
        }
        if (!rc) rc = gwr_call(GWR_OP_MODULE_LOAD, b, n, NULL, 0, NULL, 0, NULL, NULL, 0);
        if (rc == (CUresult)GWR_NEED_IMAGE) rc = CUDA_ERROR_INVALID_IMAGE;
    }
    if (rc) gwr_obj_free(h);
    else *module = h;
    return rc;
}

#define GWR_FUNC_MAGIC 0x47465543u
struct CUfunc_st {
    uint32_t magic;
    uint64_t id, module;
    int nparams;      /* -1: not asked yet */
    uint32_t *layout; /* offset, size pairs */
    size_t bytes;     /* the packed buffer's size */
    char *name;
    struct CUfunc_st *next;
};
static pthread_mutex_t g_func_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUfunc_st *g_funcs; /* never freed: a stale handle finds a cleared magic */

static int func_valid(const struct CUfunc_st *f) { return f && f->magic == GWR_FUNC_MAGIC; }

/* known_function is the function a module already gave for name: the same
 * kernel of the same module, so the same handle, without a round trip (a
 * name the module lacks is asked each time: only the worker knows). */
static struct CUfunc_st *known_function(uint64_t module, const char *name) {
    struct CUfunc_st *found = NULL;
    pthread_mutex_lock(&g_func_mu);
    for (struct CUfunc_st *f = g_funcs; f && !found; f = f->next)
        if (f->module == module && func_valid(f) && !strcmp(f->name, name)) found = f;
    pthread_mutex_unlock(&g_func_mu);
    return found;
}

GWR_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    READY();
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    size_t len = strlen(name);
    if (len > GWR_MAX_NAME) return CUDA_ERROR_NOT_FOUND;
    uint64_t module = gwr_obj_id(hmod, GWR_K_MODULE);
    if (!module) return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *f = known_function(module, name);
    if (f) {
        *hfunc = f;
        return CUDA_SUCCESS;
    }
    if (!(f = calloc(1, sizeof *f)) || !(f->name = strdup(name))) {
        free(f);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    f->magic = GWR_FUNC_MAGIC;
    f->id = gwr_new_id();
    f->module = module;
    f->nparams = -1;
    uint8_t b[16];
    size_t n = gwr_encode(b, sizeof b, "qq", f->id, f->module);
    /* synchronous: NOT_FOUND for a name the image lacks is the answer callers probe for */
    CUresult rc = gwr_call(GWR_OP_MODULE_FUNCTION, b, n, name, len, NULL, 0, NULL, NULL, 0);
    if (rc) {
        free(f->name);
        free(f);
        return rc;
    }
    pthread_mutex_lock(&g_func_mu);
    f->next = g_funcs;
    g_funcs = f;
    pthread_mutex_unlock(&g_func_mu);
    *hfunc = f;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
    READY();
    uint64_t id = gwr_obj_id(hmod, GWR_K_MODULE);
    if (!id) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = rq(GWR_OP_MODULE_UNLOAD, NULL, 0, "q", id);
    if (rc) return rc;
    gwr_obj_free(hmod);
    pthread_mutex_lock(&g_func_mu);
    for (struct CUfunc_st *f = g_funcs; f; f = f->next)
        if (f->module == id) f->magic = 0; /* its functions went with it */
    pthread_mutex_unlock(&g_func_mu);
    return CUDA_SUCCESS;
}

/* layout asks the worker for a function's parameters, once per function. */
static CUresult layout(struct CUfunc_st *f) {
    if (__atomic_load_n(&f->nparams, __ATOMIC_ACQUIRE) >= 0) return CUDA_SUCCESS;
    static uint32_t buf[1 + 2 * GWR_MAX_PARAMS];
    pthread_mutex_lock(&g_func_mu);
    CUresult rc = CUDA_SUCCESS;
    if (f->nparams < 0) {
        uint8_t b[8];
        size_t n = gwr_encode(b, sizeof b, "q", f->id), got = 0;
        rc = gwr_call(GWR_OP_FUNC_PARAMS, b, n, NULL, 0, buf, sizeof buf, &got, NULL, 0);
        if (!rc && (got < 4 || buf[0] > GWR_MAX_PARAMS || got != 4 + 8 * (size_t)buf[0])) rc = CUDA_ERROR_UNKNOWN;
        uint32_t *l = rc ? NULL : malloc((buf[0] ? buf[0] : 1) * 8);
        if (!rc && !l) rc = CUDA_ERROR_OUT_OF_MEMORY;
        if (!rc) {
            size_t bytes = 0;
            memcpy(l, buf + 1, buf[0] * 8);
            for (uint32_t i = 0; i < buf[0]; i++) {
                if (l[2 * i] > GWR_MAX_PARAM_BYTES || l[2 * i + 1] > GWR_MAX_PARAM_BYTES - l[2 * i]) rc = CUDA_ERROR_UNKNOWN;
                else if (l[2 * i] + l[2 * i + 1] > bytes) bytes = l[2 * i] + l[2 * i + 1];
            }
            if (rc) {
                free(l);
            } else {
                f->layout = l;
                f->bytes = bytes;
                __atomic_store_n(&f->nparams, (int)buf[0], __ATOMIC_RELEASE);
            }
        }
    }
    pthread_mutex_unlock(&g_func_mu);
    return rc;
}

GWR_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
    READY();
    if (!func_valid(func)) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = layout(func);
    if (rc) return rc;
    if (!paramOffset || !paramSize || paramIndex >= (size_t)func->nparams) return CUDA_ERROR_INVALID_VALUE;
    *paramOffset = func->layout[2 * paramIndex];
    *paramSize = func->layout[2 * paramIndex + 1];
    return CUDA_SUCCESS;
}

/* max_threads: the device's threads per block, asked once; a launch over it
 * is refused at the call, as the driver refuses it. */
static uint64_t max_threads(CUdevice dev) {
    static int cache[64];
    if (dev < 0 || dev >= 64) return UINT64_MAX;
    int v = __atomic_load_n(&cache[dev], __ATOMIC_RELAXED);
    if (!v) {
        uint32_t got;
        if (rq(GWR_OP_DEVICE_ATTR, &got, 4, "ii", I(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), I(dev)) || !got)
            return UINT64_MAX; /* the worker's driver will say */
        __atomic_store_n(&cache[dev], v = (int)got, __ATOMIC_RELAXED);
    }
    return (uint64_t)v;
}

/* launch packs the parameters as the kernel lays them out (or takes the
 * caller's packed `extra` buffer as is) and queues the launch. */
static CUresult launch(CUfunction f, const unsigned g[3], const unsigned b[3], unsigned shmem, CUstream s,
                       void **kernelParams, void **extra, uint32_t kind, const CUlaunchAttribute *attrs,
                       unsigned nattrs) {
    READY();
    if (!func_valid(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2]) return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams && extra) return CUDA_ERROR_INVALID_VALUE;
    STREAM(s, sid);
    struct CUctx_st *c = NULL;
    if (sid <= 2) { /* a default stream: the current context's */
        CUresult rc = current(&c);
        if (rc) return rc;
    }
    if ((uint64_t)b[0] * b[1] * b[2] > max_threads(c ? c->dev : 0)) return CUDA_ERROR_INVALID_VALUE;
    if (nattrs > GWR_MAX_ATTRS || (nattrs && !attrs)) return CUDA_ERROR_INVALID_VALUE;
    uint8_t buf[GWR_MAX_ATTRS * GWR_ATTR_SIZE + GWR_MAX_PARAM_BYTES];
    size_t na = (size_t)nattrs * GWR_ATTR_SIZE, np = 0;
    for (unsigned i = 0; i < nattrs; i++) {
        CUlaunchAttribute a = attrs[i];
        if (a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT || a.id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) {
            uint64_t ev = gwr_obj_id(a.value.programmaticEvent.event, GWR_K_EVENT);
            if (!ev) return CUDA_ERROR_INVALID_HANDLE;
            a.value.programmaticEvent.event = (CUevent)(uintptr_t)ev; /* the worker's name for it */
        }
        memcpy(buf + i * GWR_ATTR_SIZE, &a, GWR_ATTR_SIZE);
    }
    if (kernelParams) {
        CUresult rc = layout(f);
        if (rc) return rc;
        np = f->bytes;
        memset(buf + na, 0, np);
        for (int i = 0; i < f->nparams; i++) {
            if (!kernelParams[i]) return CUDA_ERROR_INVALID_VALUE;
            memcpy(buf + na + f->layout[2 * i], kernelParams[i], f->layout[2 * i + 1]);
        }
    } else if (extra) {
        const void *p = NULL;
        size_t size = 0;
        for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END && i < 16; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) p = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) size = *(const size_t *)extra[i + 1];
            else return CUDA_ERROR_INVALID_VALUE;
        }
        if (!p || size > GWR_MAX_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
        memcpy(buf + na, p, size);
        np = size;
    }
    uint8_t h[96];
    size_t n = gwr_encode(h, sizeof h, "qqiiiiiiiiii", f->id, sid, I(g[0]), I(g[1]), I(g[2]), I(b[0]), I(b[1]),
                          I(b[2]), I(shmem), kind, I(nattrs), I(kernelParams || extra));
    return gwr_async(GWR_OP_LAUNCH, h, n, buf, na + np);
}

GWR_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                   unsigned int by, unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams, void **extra) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, sharedMemBytes, hStream, kernelParams, extra, GWR_LAUNCH_PLAIN, NULL, 0);
}

GWR_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz,
                                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                        void **extra) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, sharedMemBytes, hStream, kernelParams, extra, GWR_LAUNCH_PTSZ, NULL, 0);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **kernelParams, void **extra, uint32_t kind) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    const unsigned g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ}, b[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    return launch(f, g, b, c->sharedMemBytes, c->hStream, kernelParams, extra, kind, c->attrs, c->numAttrs);
}
GWR_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    return launch_ex(config, f, kernelParams, extra, GWR_LAUNCH_EX);
}
GWR_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                          void **extra) {
    return launch_ex(config, f, kernelParams, extra, GWR_LAUNCH_EX_PTSZ);
}

GWR_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                              unsigned int bx, unsigned int by, unsigned int bz,
                                              unsigned int sharedMemBytes, CUstream hStream, void **kernelParams) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, sharedMemBytes, hStream, kernelParams, NULL, GWR_LAUNCH_COOPERATIVE, NULL, 0);
}

GWR_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                   unsigned int bx, unsigned int by, unsigned int bz,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void **kernelParams) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, sharedMemBytes, hStream, kernelParams, NULL, GWR_LAUNCH_COOPERATIVE_PTSZ, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* Streams, events, graphs                                                   */

GWR_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    if (!phStream || Flags > 1) return CUDA_ERROR_INVALID_VALUE;
    void *h = gwr_obj_new(GWR_K_STREAM);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = aq(GWR_OP_STREAM_CREATE, "qi", gwr_obj_id(h, GWR_K_STREAM), I(Flags)))) {
        gwr_obj_free(h);
        return rc;
    }
    *phStream = h;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    READY();
    uint64_t id = gwr_obj_id(hStream, GWR_K_STREAM);
    if (!id) return CUDA_ERROR_INVALID_HANDLE;
    gwr_obj_free(hStream);
    return aq(GWR_OP_STREAM_DESTROY, "q", id);
}

GWR_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
    READY();
    STREAM(hStream, id);
    return rq(GWR_OP_STREAM_SYNC, NULL, 0, "q", id);
}

GWR_EXPORT CUresult cuStreamQuery(CUstream hStream) {
    READY();
    STREAM(hStream, id);
    return rq(GWR_OP_STREAM_QUERY, NULL, 0, "q", id);
}

GWR_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    struct CUctx_st *c;
    CUresult rc = current(&c);
    if (rc) return rc;
    if (!phEvent || Flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    void *h = gwr_obj_new(GWR_K_EVENT);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = aq(GWR_OP_EVENT_CREATE, "qi", gwr_obj_id(h, GWR_K_EVENT), I(Flags)))) {
        gwr_obj_free(h);
        return rc;
    }
    *phEvent = h;
    return CUDA_SUCCESS;
}

GWR_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    READY();
    uint64_t id = gwr_obj_id(hEvent, GWR_K_EVENT);
    if (!id) return CUDA_ERROR_INVALID_HANDLE;
    STREAM(hStream, sid);
    return aq(GWR_OP_EVENT_RECORD, "qq", id, sid);
}

GWR_EXPORT CUresult cuEventQuery(CUevent hEvent) {
    READY();
    uint64_t id = gwr_obj_id(hEvent, GWR_K_EVENT);
    if (!id) return CUDA_ERROR_INVALID_HANDLE;
    return rq(GWR_OP_EVENT_QUERY, NULL, 0, "q", id);
}

GWR_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
    READY();
    uint64_t id = gwr_obj_id(hEvent, GWR_K_EVENT);
    if (!id) return CUDA_ERROR_INVALID_HANDLE;
    return rq(GWR_OP_EVENT_SYNC, NULL, 0, "q", id);
}

GWR_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    READY();
    if (!pMilliseconds) return CUDA_ERROR_INVALID_VALUE;
    float ms;
    uint64_t a = gwr_obj_id(hStart, GWR_K_EVENT), b = gwr_obj_id(hEnd, GWR_K_EVENT);
    if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = rq(GWR_OP_EVENT_ELAPSED, &ms, sizeof ms, "qq", a, b);
    if (!rc) *pMilliseconds = ms;
    return rc;
}

GWR_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
    READY();
    uint64_t id = gwr_obj_id(hEvent, GWR_K_EVENT);
    if (!id) return CUDA_ERROR_INVALID_HANDLE;
    gwr_obj_free(hEvent);
    return aq(GWR_OP_EVENT_DESTROY, "q", id);
}

GWR_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    READY();
    STREAM(hStream, id);
    return rq(GWR_OP_CAPTURE_BEGIN, NULL, 0, "qi", id, I(mode));
}

GWR_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    READY();
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    STREAM(hStream, sid);
    void *h = gwr_obj_new(GWR_K_GRAPH);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = rq(GWR_OP_CAPTURE_END, NULL, 0, "qq", sid, gwr_obj_id(h, GWR_K_GRAPH));
    if (rc) gwr_obj_free(h);
    else *phGraph = h;
    return rc;
}

GWR_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    READY();
    if (!phGraphExec) return CUDA_ERROR_INVALID_VALUE;
    uint64_t gid = gwr_obj_id(hGraph, GWR_K_GRAPH);
    if (!gid) return CUDA_ERROR_INVALID_VALUE;
    void *h = gwr_obj_new(GWR_K_EXEC);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = rq(GWR_OP_GRAPH_INSTANTIATE, NULL, 0, "qqq", gwr_obj_id(h, GWR_K_EXEC), gid, Q(flags));
    if (rc) gwr_obj_free(h);
    else *phGraphExec = h;
    return rc;
}

GWR_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                          char *logBuffer, size_t bufferSize) {
    (void)phErrorNode;
    if (logBuffer && bufferSize) logBuffer[0] = 0;
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

static CUresult graph_launch(CUgraphExec x, CUstream s, uint32_t ptsz) {
    READY();
    uint64_t id = gwr_obj_id(x, GWR_K_EXEC);
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    STREAM(s, sid);
    return aq(GWR_OP_GRAPH_LAUNCH, "qqi", id, sid, ptsz);
}
GWR_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(hGraphExec, hStream, 0);
}
GWR_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(hGraphExec, hStream, 1);
}

static CUresult graph_destroy(void *h, uint32_t kind, uint16_t op) {
    READY();
    uint64_t id = gwr_obj_id(h, kind);
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    gwr_obj_free(h);
    return aq(op, "q", id);
}
GWR_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { return graph_destroy(hGraph, GWR_K_GRAPH, GWR_OP_GRAPH_DESTROY); }
GWR_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    return graph_destroy(hGraphExec, GWR_K_EXEC, GWR_OP_GRAPH_EXEC_DESTROY);
}
