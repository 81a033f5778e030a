/* Every allocation path, reserved in the ledger before the driver sees it and
 * given back when the memory really returns to the device. */
#include <stdlib.h>

#include "hook.h"
#include "table.h"

enum { K_LINEAR, K_MANAGED, K_ASYNC };

static struct gw_tab allocs = {.mu = PTHREAD_MUTEX_INITIALIZER};  /* device pointer -> record */
static struct gw_tab pools = {.mu = PTHREAD_MUTEX_INITIALIZER};   /* pool -> location */
static struct gw_tab handles = {.mu = PTHREAD_MUTEX_INITIALIZER}; /* VMM handle -> record */
static struct gw_tab maps = {.mu = PTHREAD_MUTEX_INITIALIZER};    /* mapped address -> handle */

/* Stream-ordered frees: the memory returns when the stream reaches the free,
 * so the bytes stay reserved until an event recorded after it completes. */
struct pending {
    CUevent ev;
    int dev;
    uint64_t bytes;
    struct pending *next;
};
static pthread_mutex_t pend_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pend;
static _Atomic int npend;

static int cur_dev(CUcontext *ctx, int *dev) {
    CUdevice d;
    if (gw_be.cuCtxGetCurrent(ctx) || !*ctx || gw_be.cuCtxGetDevice(&d)) return -1;
    *dev = d;
    return 0;
}

static int track(CUdeviceptr p, uint64_t bytes, int dev, CUcontext ctx, int kind) {
    struct gw_rec *r = calloc(1, sizeof *r);
    if (!r) return -1;
    *r = (struct gw_rec){.key = p, .bytes = bytes, .dev = dev, .ctx = ctx, .kind = kind};
    gw_tab_put(&allocs, r);
    return 0;
}

/* finish records a successful allocation, or undoes it when it cannot. */
static CUresult finish(CUresult rc, CUdeviceptr *dptr, uint64_t bytes, int dev, CUcontext ctx, int kind) {
    if (rc != CUDA_SUCCESS) {
        gw_release(dev, bytes);
        return rc;
    }
    if (track(*dptr, bytes, dev, ctx, kind)) {
        gw_be.cuMemFree_v2(*dptr);
        gw_release(dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

void gw_pending_poll(int wait) {
    if (!atomic_load_explicit(&npend, memory_order_relaxed)) return;
    pthread_mutex_lock(&pend_mu);
    for (struct pending **pp = &pend; *pp;) {
        struct pending *p = *pp;
        if (wait) gw_be.cuEventSynchronize(p->ev);
        if (gw_be.cuEventQuery(p->ev) == CUDA_ERROR_NOT_READY) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        gw_be.cuEventDestroy_v2(p->ev);
        gw_release(p->dev, p->bytes);
        atomic_fetch_sub(&npend, 1);
        free(p);
    }
    pthread_mutex_unlock(&pend_mu);
}

void gw_release_ctx(CUcontext ctx) {
    struct gw_rec *mine = NULL;
    pthread_mutex_lock(&allocs.mu);
    for (int i = 0; i < GW_TAB_BUCKETS; i++)
        for (struct gw_rec **pp = &allocs.b[i]; *pp;) {
            struct gw_rec *r = *pp;
            if (r->ctx != ctx) {
                pp = &r->next;
                continue;
            }
            *pp = r->next;
            r->next = mine;
            mine = r;
        }
    pthread_mutex_unlock(&allocs.mu);
    while (mine) {
        struct gw_rec *next = mine->next;
        gw_release(mine->dev, mine->bytes);
        free(mine);
        mine = next;
    }
}

void gw_memory_atfork(int phase) {
    struct gw_tab *tabs[] = {&pools, &handles, &maps, &allocs};
    if (phase == 0) {
        pthread_mutex_lock(&pend_mu);
        for (int i = 0; i < 4; i++) pthread_mutex_lock(&tabs[i]->mu);
    } else if (phase == 1) {
        for (int i = 3; i >= 0; i--) pthread_mutex_unlock(&tabs[i]->mu);
        pthread_mutex_unlock(&pend_mu);
    } else {
        for (int i = 0; i < 4; i++) gw_tab_reset(tabs[i]);
        pthread_mutex_init(&pend_mu, NULL);
        pend = NULL; /* the parent's bytes, in the parent's slot */
        atomic_store(&npend, 0);
    }
}

/* ---- linear, managed, pitched ---- */

static CUresult alloc_linear(CUdeviceptr *dptr, size_t bytes, int kind, unsigned flags) {
    CUcontext ctx;
    int dev;
    if (!dptr || !bytes || cur_dev(&ctx, &dev))
        return kind == K_MANAGED ? gw_be.cuMemAllocManaged(dptr, bytes, flags) : gw_be.cuMemAlloc_v2(dptr, bytes);
    gw_pending_poll(0);
    if (!gw_reserve(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = kind == K_MANAGED ? gw_be.cuMemAllocManaged(dptr, bytes, flags) : gw_be.cuMemAlloc_v2(dptr, bytes);
    return finish(rc, dptr, bytes, dev, ctx, kind);
}

GW_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    GW_ENTER(cuMemAlloc_v2, (dptr, bytesize));
    GW_GUARDED(alloc_linear(dptr, bytesize, K_LINEAR, 0));
}

GW_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    GW_ENTER(cuMemAllocManaged, (dptr, bytesize, flags));
    GW_GUARDED(alloc_linear(dptr, bytesize, K_MANAGED, flags));
}

#define GW_PITCH_ALIGN 512 /* the pitch drivers choose; reconciled with the real one */

static CUresult alloc_pitch(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h, unsigned elem) {
    CUcontext ctx;
    int dev;
    if (!dptr || !pPitch || !w || !h || cur_dev(&ctx, &dev)) return gw_be.cuMemAllocPitch_v2(dptr, pPitch, w, h, elem);
    if (w > SIZE_MAX - GW_PITCH_ALIGN) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t pitch = (w + GW_PITCH_ALIGN - 1) / GW_PITCH_ALIGN * GW_PITCH_ALIGN;
    if (h > UINT64_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t est = pitch * h;
    gw_pending_poll(0);
    if (!gw_reserve(dev, est)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = gw_be.cuMemAllocPitch_v2(dptr, pPitch, w, h, elem);
    if (rc != CUDA_SUCCESS) {
        gw_release(dev, est);
        return rc;
    }
    /* charge what the driver really took: pitch x height */
    uint64_t actual = *pPitch <= UINT64_MAX / h ? (uint64_t)*pPitch * h : UINT64_MAX;
    if (actual > est && !gw_reserve(dev, actual - est)) {
        gw_be.cuMemFree_v2(*dptr);
        gw_release(dev, est);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < est) gw_release(dev, est - actual);
    return finish(rc, dptr, actual, dev, ctx, K_LINEAR);
}

GW_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    GW_ENTER(cuMemAllocPitch_v2, (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    GW_GUARDED(alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
}

/* A free gives the bytes back once the driver said yes; the record leaves the
 * table first, so an address the driver hands out again is never confused. */
static CUresult free_linear(CUdeviceptr p) {
    struct gw_rec *r = p ? gw_tab_take(&allocs, p) : NULL;
    CUresult rc = gw_be.cuMemFree_v2(p);
    if (!r) return rc;
    if (rc != CUDA_SUCCESS) {
        gw_tab_put(&allocs, r);
        return rc;
    }
    gw_release(r->dev, r->bytes);
    free(r);
    return rc;
}

GW_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    GW_ENTER(cuMemFree_v2, (dptr));
    GW_GUARDED(free_linear(dptr));
}

/* ---- stream-ordered ---- */

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, alloc_async_fn fa,
                            alloc_pool_fn fp) {
#define CALL() (fp ? fp(dptr, bytes, pool, s) : fa(dptr, bytes, s))
    CUcontext ctx;
    int dev;
    if (!dptr || !bytes || cur_dev(&ctx, &dev) || (fp && !pool)) return CALL();
    if (pool) {
        pthread_mutex_lock(&pools.mu);
        struct gw_rec *r = gw_tab_find(&pools, (uint64_t)(uintptr_t)pool);
        int type = r ? r->kind : CU_MEM_LOCATION_TYPE_DEVICE, id = r ? r->dev : dev;
        pthread_mutex_unlock(&pools.mu);
        if (type != CU_MEM_LOCATION_TYPE_DEVICE) return CALL(); /* host memory: not the device's */
        dev = id; /* an unknown pool counts on the current device */
    }
    gw_pending_poll(0);
    if (!gw_reserve(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    return finish(CALL(), dptr, bytes, dev, ctx, K_ASYNC);
#undef CALL
}

GW_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    GW_ENTER(cuMemAllocAsync, (dptr, bytesize, hStream));
    GW_GUARDED(alloc_async(dptr, bytesize, NULL, hStream, gw_be.cuMemAllocAsync, NULL));
}

GW_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    GW_ENTER(cuMemAllocAsync_ptsz, (dptr, bytesize, hStream));
    GW_GUARDED(alloc_async(dptr, bytesize, NULL, hStream, gw_be.cuMemAllocAsync_ptsz, NULL));
}

GW_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    GW_ENTER(cuMemAllocFromPoolAsync, (dptr, bytesize, pool, hStream));
    GW_GUARDED(alloc_async(dptr, bytesize, pool, hStream, NULL, gw_be.cuMemAllocFromPoolAsync));
}

GW_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
    GW_ENTER(cuMemAllocFromPoolAsync_ptsz, (dptr, bytesize, pool, hStream));
    GW_GUARDED(alloc_async(dptr, bytesize, pool, hStream, NULL, gw_be.cuMemAllocFromPoolAsync_ptsz));
}

static CUresult free_async(CUdeviceptr p, CUstream s, CUresult (*f)(CUdeviceptr, CUstream)) {
    struct gw_rec *r = p ? gw_tab_take(&allocs, p) : NULL;
    CUresult rc = f(p, s);
    if (!r) return rc;
    if (rc != CUDA_SUCCESS) {
        gw_tab_put(&allocs, r);
        return rc;
    }
    struct pending *q = malloc(sizeof *q);
    CUevent ev = NULL;
    if (q && !gw_be.cuEventCreate(&ev, 0x2 /* CU_EVENT_DISABLE_TIMING */)) {
        if (!gw_be.cuEventRecord(ev, s)) {
            *q = (struct pending){.ev = ev, .dev = r->dev, .bytes = r->bytes};
            pthread_mutex_lock(&pend_mu);
            q->next = pend;
            pend = q;
            atomic_fetch_add(&npend, 1);
            pthread_mutex_unlock(&pend_mu);
            free(r);
            return rc;
        }
        gw_be.cuEventDestroy_v2(ev);
    }
    free(q);
    /* no event: wait for the stream, then the memory is surely back */
    if (gw_be.cuStreamSynchronize(s) == CUDA_SUCCESS) gw_release(r->dev, r->bytes);
    free(r);
    return rc;
}

GW_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    GW_ENTER(cuMemFreeAsync, (dptr, hStream));
    GW_GUARDED(free_async(dptr, hStream, gw_be.cuMemFreeAsync));
}

GW_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    GW_ENTER(cuMemFreeAsync_ptsz, (dptr, hStream));
    GW_GUARDED(free_async(dptr, hStream, gw_be.cuMemFreeAsync_ptsz));
}

/* ---- pools: where their memory lives ---- */

static void pool_note(CUmemoryPool pool, int type, int id) {
    struct gw_rec *r = calloc(1, sizeof *r);
    if (!r) return; /* unknown pools count on the current device: conservative */
    *r = (struct gw_rec){.key = (uint64_t)(uintptr_t)pool, .kind = type, .dev = id};
    free(gw_tab_take(&pools, r->key));
    gw_tab_put(&pools, r);
}

static CUresult pool_create(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult rc = gw_be.cuMemPoolCreate(pool, props);
    if (rc == CUDA_SUCCESS) pool_note(*pool, props->location.type, props->location.id);
    return rc;
}

GW_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    GW_ENTER(cuMemPoolCreate, (pool, poolProps));
    GW_GUARDED(pool_create(pool, poolProps));
}

static CUresult pool_destroy(CUmemoryPool pool) {
    CUresult rc = gw_be.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS) free(gw_tab_take(&pools, (uint64_t)(uintptr_t)pool));
    return rc;
}

GW_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    GW_ENTER(cuMemPoolDestroy, (pool));
    GW_GUARDED(pool_destroy(pool));
}

static CUresult default_pool(CUmemoryPool *pool, CUdevice dev) {
    CUresult rc = gw_be.cuDeviceGetDefaultMemPool(pool, dev);
    if (rc == CUDA_SUCCESS) pool_note(*pool, CU_MEM_LOCATION_TYPE_DEVICE, dev);
    return rc;
}

GW_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    GW_ENTER(cuDeviceGetDefaultMemPool, (pool, dev));
    GW_GUARDED(default_pool(pool, dev));
}

/* ---- virtual memory management ----
 * A handle's memory returns when it is released and no longer mapped, so its
 * bytes stay reserved until both have happened. Host-located handles never
 * touch the ledger. */

static CUresult mem_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                           unsigned long long flags) {
    if (!h || !prop || !size || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return gw_be.cuMemCreate(h, size, prop, flags);
    int dev = prop->location.id;
    if (dev < 0 || dev >= GW_MAX_DEVICES) return gw_be.cuMemCreate(h, size, prop, flags);
    gw_pending_poll(0);
    if (!gw_reserve(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = gw_be.cuMemCreate(h, size, prop, flags);
    struct gw_rec *r = rc == CUDA_SUCCESS ? calloc(1, sizeof *r) : NULL;
    if (rc == CUDA_SUCCESS && !r) {
        gw_be.cuMemRelease(*h);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != CUDA_SUCCESS) {
        gw_release(dev, size);
        return rc;
    }
    *r = (struct gw_rec){.key = *h, .bytes = size, .dev = dev};
    gw_tab_put(&handles, r);
    return rc;
}

GW_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    GW_ENTER(cuMemCreate, (handle, size, prop, flags));
    GW_GUARDED(mem_create(handle, size, prop, flags));
}

/* handle_drop gives a handle's bytes back once it is released and unmapped;
 * the caller holds handles.mu. */
static void handle_drop_locked(struct gw_rec *r) {
    if (!r->released || r->maps) return;
    gw_tab_take_locked(&handles, r->key);
    gw_release(r->dev, r->bytes);
    free(r);
}

static CUresult mem_release(CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&handles.mu);
    CUresult rc = gw_be.cuMemRelease(h);
    struct gw_rec *r = gw_tab_find(&handles, h);
    if (rc == CUDA_SUCCESS && r) {
        r->released = 1;
        handle_drop_locked(r);
    }
    pthread_mutex_unlock(&handles.mu);
    return rc;
}

GW_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    GW_ENTER(cuMemRelease, (handle));
    GW_GUARDED(mem_release(handle));
}

static CUresult mem_map(CUdeviceptr ptr, size_t size, size_t off, CUmemGenericAllocationHandle h,
                        unsigned long long flags) {
    struct gw_rec *m = calloc(1, sizeof *m);
    pthread_mutex_lock(&handles.mu);
    CUresult rc = gw_be.cuMemMap(ptr, size, off, h, flags);
    struct gw_rec *r = gw_tab_find(&handles, h);
    if (rc == CUDA_SUCCESS && r && m) {
        r->maps++;
        *m = (struct gw_rec){.key = ptr, .handle = h};
        gw_tab_put(&maps, m);
        m = NULL;
    }
    pthread_mutex_unlock(&handles.mu);
    free(m); /* no record: the handle's bytes stay reserved (conservative) */
    return rc;
}

GW_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    GW_ENTER(cuMemMap, (ptr, size, offset, handle, flags));
    GW_GUARDED(mem_map(ptr, size, offset, handle, flags));
}

static CUresult mem_unmap(CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&handles.mu);
    CUresult rc = gw_be.cuMemUnmap(ptr, size);
    struct gw_rec *m = rc == CUDA_SUCCESS ? gw_tab_take(&maps, ptr) : NULL;
    if (m) {
        struct gw_rec *r = gw_tab_find(&handles, m->handle);
        if (r && r->maps) {
            r->maps--;
            handle_drop_locked(r);
        }
        free(m);
    }
    pthread_mutex_unlock(&handles.mu);
    return rc;
}

GW_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    GW_ENTER(cuMemUnmap, (ptr, size));
    GW_GUARDED(mem_unmap(ptr, size));
}

/* ---- what the device looks like from inside ---- */

static CUresult mem_info(size_t *free_bytes, size_t *total) {
    CUresult rc = gw_be.cuMemGetInfo_v2(free_bytes, total);
    CUdevice dev;
    if (rc != CUDA_SUCCESS || gw_be.cuCtxGetDevice(&dev)) return rc;
    uint64_t limit = gw_limit(dev);
    if (!limit) return rc;
    gw_reap_dead();
    gw_pending_poll(0);
    uint64_t used = atomic_load(&gw_usage->reserved_bytes[dev]);
    uint64_t quota_free = used < limit ? limit - used : 0;
    if (limit < *total) *total = limit;
    if (quota_free < *free_bytes) *free_bytes = quota_free;
    return rc;
}

GW_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    GW_ENTER(cuMemGetInfo_v2, (free, total));
    GW_GUARDED(mem_info(free, total));
}

static CUresult total_mem(size_t *bytes, CUdevice dev) {
    CUresult rc = gw_be.cuDeviceTotalMem_v2(bytes, dev);
    uint64_t limit = rc == CUDA_SUCCESS ? gw_limit(dev) : 0;
    if (limit && limit < *bytes) *bytes = limit;
    return rc;
}

GW_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    GW_ENTER(cuDeviceTotalMem_v2, (bytes, dev));
    GW_GUARDED(total_mem(bytes, dev));
}
