/* Linear, managed and stream-ordered memory, copies and the allocation table. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define SG_BUCKETS 4096

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_alloc_rec *g_table[SG_BUCKETS];

static size_t bucket(CUdeviceptr p) { return (size_t)((p >> 12) * 0x9E3779B97F4A7C15ull >> 52) % SG_BUCKETS; }

void sg_table_add(struct sg_alloc_rec *r) {
    pthread_mutex_lock(&g_mu);
    size_t b = bucket(r->base);
    r->next = g_table[b];
    g_table[b] = r;
    pthread_mutex_unlock(&g_mu);
}

static struct sg_alloc_rec **find_locked(CUdeviceptr base) {
    struct sg_alloc_rec **pp = &g_table[bucket(base)];
    while (*pp && (*pp)->base != base) pp = &(*pp)->next;
    return pp;
}

struct sg_alloc_rec *sg_table_take(CUdeviceptr base) {
    pthread_mutex_lock(&g_mu);
    struct sg_alloc_rec **pp = find_locked(base), *r = *pp;
    if (r) *pp = r->next;
    pthread_mutex_unlock(&g_mu);
    return r;
}

void *sg_host_range(CUdeviceptr p, size_t n) {
    void *host = NULL;
    pthread_mutex_lock(&g_mu);
    for (size_t b = 0; b < SG_BUCKETS && !host; b++)
        for (struct sg_alloc_rec *r = g_table[b]; r; r = r->next)
            if (p >= r->base && n <= r->bytes && p - r->base <= r->bytes - n) {
                host = (void *)(uintptr_t)p;
                break;
            }
    pthread_mutex_unlock(&g_mu);
    return host;
}

#define SG_SMALL_ALLOC (64u << 10)
#define SG_ALIGN 256 /* what cudaMalloc guarantees */

/* Host memory stands in for device memory, so copies really copy. Large
 * blocks are mapped, touched only where written; small ones come from the
 * heap (over-allocated and aligned by hand: memalign fragments glibc's heap),
 * so that allocating them costs about what a driver's cache does. */
static void *host_alloc(size_t bytes, void **raw) {
    if (bytes > SG_SMALL_ALLOC) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        return *raw = p == MAP_FAILED ? NULL : p;
    }
    *raw = malloc(bytes + SG_ALIGN - 1);
    return *raw ? (void *)(((uintptr_t)*raw + SG_ALIGN - 1) & ~(uintptr_t)(SG_ALIGN - 1)) : NULL;
}

static void host_free(void *raw, size_t bytes) {
    if (bytes > SG_SMALL_ALLOC) munmap(raw, bytes);
    else free(raw);
}

CUresult sg_alloc(struct CUctx_st *ctx, int index, size_t bytes, enum sg_alloc_kind kind, int charge,
                  CUdeviceptr *out) {
    struct sg_state *s = sg_ready();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (charge && !sg_mem_charge(s, index, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    struct sg_alloc_rec *r = calloc(1, sizeof *r);
    void *raw = NULL, *host = host_alloc(bytes, &raw);
    if (!r || !host) {
        free(r);
        if (host) host_free(raw, bytes);
        if (charge) sg_mem_uncharge(s, index, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->raw = raw;
    r->base = (CUdeviceptr)(uintptr_t)host;
    r->bytes = bytes;
    r->ctx = ctx;
    r->index = index;
    r->charged = charge;
    r->kind = kind;
    sg_table_add(r);
    *out = r->base;
    return CUDA_SUCCESS;
}

static void release(struct sg_alloc_rec *r) {
    host_free(r->raw, r->bytes);
    if (r->charged) sg_mem_uncharge(sg_ready(), r->index, r->bytes);
    free(r);
}

CUresult sg_free(CUdeviceptr p, int queued) {
    pthread_mutex_lock(&g_mu);
    struct sg_alloc_rec **pp = find_locked(p), *r = *pp;
    /* Only the queued free may free memory a cuMemFreeAsync already owns. */
    if (!r || r->kind == SG_ALLOC_MAPPED || r->free_pending != queued) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pp = r->next;
    pthread_mutex_unlock(&g_mu);
    release(r);
    return CUDA_SUCCESS;
}

void sg_free_ctx(struct CUctx_st *ctx) {
    pthread_mutex_lock(&g_mu);
    struct sg_alloc_rec *mine = NULL;
    for (size_t b = 0; b < SG_BUCKETS; b++) {
        struct sg_alloc_rec **pp = &g_table[b];
        while (*pp) {
            struct sg_alloc_rec *r = *pp;
            if (r->ctx == ctx && r->kind != SG_ALLOC_MAPPED) {
                *pp = r->next;
                r->next = mine;
                mine = r;
            } else {
                pp = &r->next;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    while (mine) {
        struct sg_alloc_rec *next = mine->next;
        release(mine);
        mine = next;
    }
}

SG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    return sg_alloc(c, c->index, bytesize, SG_ALLOC_LINEAR, 1, dptr);
}

SG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                      size_t Height, unsigned int ElementSizeBytes) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!dptr || !pPitch || !WidthInBytes || !Height) return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511; /* the texture alignment */
    if (Height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sg_alloc(c, c->index, pitch * Height, SG_ALLOC_LINEAR, 1, dptr);
    if (!rc) *pPitch = pitch;
    return rc;
}

SG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) return CUDA_ERROR_INVALID_VALUE;
    return sg_alloc(c, c->index, bytesize, SG_ALLOC_MANAGED, 1, dptr);
}

SG_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!dptr) return CUDA_SUCCESS; /* freeing NULL is a no-op, as in NVIDIA's driver */
    return sg_free(dptr, 0);
}

SG_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    struct sg_state *s = sg_ready();
    sg_reap_dead(s);
    struct sg_device *d = &s->dev[c->index];
    uint64_t used = atomic_load(&d->used_mem);
    *total = d->total_mem;
    *free_bytes = used < d->total_mem ? d->total_mem - used : 0;
    return CUDA_SUCCESS;
}

/* Stream-ordered allocation: charged when asked for, released when the
 * stream reaches the free. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, struct CUmemPoolHandle_st *pool, CUstream hStream) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    if ((rc = sg_stream_resolve(hStream, &st))) return rc;
    /* cuda-check fix: NVIDIA's cuMemAllocAsync takes memory "from the memory pool
     * current to the stream's device", not the current context's device. */
    int index = st->ctx->index, charge = 1;
    if (pool) {
        if (pool->magic != SG_MAGIC_POOL) return CUDA_ERROR_INVALID_VALUE;
        charge = pool->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
        if (charge) index = sg_dev_index(pool->location.id);
    }
    return sg_alloc(st->ctx, index, bytesize, SG_ALLOC_ASYNC, charge, dptr);
}

SG_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, NULL, hStream);
}
SG_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, NULL, hStream);
}
SG_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, hStream);
}
SG_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    struct CUstream_st *st;
    if ((rc = sg_stream_resolve(hStream, &st))) return rc;
    pthread_mutex_lock(&g_mu);
    struct sg_alloc_rec *r = *find_locked(dptr);
    int ok = r && r->kind != SG_ALLOC_MAPPED && !r->free_pending;
    if (ok) r->free_pending = 1;
    pthread_mutex_unlock(&g_mu);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    return sg_stream_push(st, (struct sg_op){.kind = SG_OP_FREE, .arg = dptr});
}

SG_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream); }
SG_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream); }

static struct CUmemPoolHandle_st g_default_pools[SG_MAX_DEVICES];

SG_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (sg_dev_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = &g_default_pools[dev];
    p->location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, dev};
    p->magic = SG_MAGIC_POOL;
    *pool = p;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    CUmemLocation loc = props->location;
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (sg_dev_index(loc.id) < 0) return CUDA_ERROR_INVALID_DEVICE;
    } else if (loc.type != CU_MEM_LOCATION_TYPE_HOST_NUMA) { /* NVIDIA takes no other host kind for pools */
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = SG_MAGIC_POOL;
    p->location = loc;
    *pool = p;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || pool->magic != SG_MAGIC_POOL) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < SG_MAX_DEVICES; i++)
        if (pool == &g_default_pools[i]) return CUDA_ERROR_INVALID_VALUE;
    pool->magic = 0;
    free(pool);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!ByteCount) return CUDA_SUCCESS;
    void *dst = sg_host_range(dstDevice, ByteCount);
    if (!dst || !srcHost) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, srcHost, ByteCount);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!ByteCount) return CUDA_SUCCESS;
    /* synchronous with the legacy stream, as NVIDIA's: kernels queued there
     * (a record kernel) write first */
    if ((rc = sg_stream_sync(c->null_stream))) return rc;
    void *src = sg_host_range(srcDevice, ByteCount);
    if (!src || !dstHost) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dstHost, src, ByteCount);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!N) return CUDA_SUCCESS;
    void *dst = sg_host_range(dstDevice, N);
    if (!dst) return CUDA_ERROR_INVALID_VALUE;
    memset(dst, uc, N);
    return CUDA_SUCCESS;
}
