/* Virtual memory management: physical handles (cuMemCreate), address
 * reservations and the mappings between them. A handle's memory is a memfd,
 * so every mapping of it shares the same bytes, as on a GPU. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define SG_GRANULARITY (2ull << 20)

struct sg_handle {
    uint32_t magic;
    size_t bytes;
    int index;        /* the machine's device charged, or -1 for host memory */
    int fd;
    int refs;         /* the handle itself and each mapping of it */
    int released;
};

struct sg_range {
    CUdeviceptr base;
    size_t bytes;
    struct sg_handle *h; /* mappings only */
    struct sg_range *next;
};

#define SG_MAGIC_HANDLE 0x484e444c

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_range *g_reserved, *g_mapped;

static int prop_valid(const CUmemAllocationProp *prop) {
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return 0;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: return sg_dev_index(prop->location.id) >= 0;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return 1;
    default: return 0;
    }
}

SG_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!granularity || !prop_valid(prop) || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = SG_GRANULARITY;
    return CUDA_SUCCESS;
}

static struct sg_handle *handle_of(CUmemGenericAllocationHandle h) {
    struct sg_handle *p = (struct sg_handle *)(uintptr_t)h;
    return p && p->magic == SG_MAGIC_HANDLE && !p->released ? p : NULL;
}

static void handle_unref_locked(struct sg_handle *h) {
    if (--h->refs) return;
    close(h->fd);
    if (h->index >= 0) sg_mem_uncharge(sg_ready(), h->index, h->bytes);
    h->magic = 0;
    free(h);
}

SG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    struct sg_state *s = sg_ready();
    if (!s) return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !prop_valid(prop) || flags || !size || size % SG_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int index = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? sg_dev_index(prop->location.id) : -1;
    if (index >= 0 && !sg_mem_charge(s, index, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    struct sg_handle *h = calloc(1, sizeof *h);
    int fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
    if (!h || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        free(h);
        if (fd >= 0) close(fd);
        if (index >= 0) sg_mem_uncharge(s, index, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct sg_handle){.magic = SG_MAGIC_HANDLE, .bytes = size, .index = index, .fd = fd, .refs = 1};
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

/* The memory goes back when the handle is released and no mapping uses it. */
SG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    struct sg_handle *h = handle_of(handle);
    if (h) {
        h->released = 1;
        handle_unref_locked(h);
    }
    pthread_mutex_unlock(&g_mu);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SG_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || !size || size % SG_GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    if (alignment && (alignment & (alignment - 1))) return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > SG_GRANULARITY ? alignment : SG_GRANULARITY;
    /* Over-reserve, then trim to an aligned window of the asked size. */
    char *raw = mmap((void *)(uintptr_t)addr, size + align, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)raw) munmap(raw, base - (uintptr_t)raw);
    size_t tail = (uintptr_t)raw + size + align - (base + size);
    if (tail) munmap((void *)(base + size), tail);
    struct sg_range *r = calloc(1, sizeof *r);
    if (!r) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = base;
    r->bytes = size;
    pthread_mutex_lock(&g_mu);
    r->next = g_reserved;
    g_reserved = r;
    pthread_mutex_unlock(&g_mu);
    *ptr = base;
    return CUDA_SUCCESS;
}

static struct sg_range **range_find(struct sg_range **list, CUdeviceptr base, size_t bytes) {
    while (*list && ((*list)->base != base || (*list)->bytes != bytes)) list = &(*list)->next;
    return list;
}

static int inside_reservation_locked(CUdeviceptr p, size_t n) {
    for (struct sg_range *r = g_reserved; r; r = r->next)
        if (p >= r->base && n <= r->bytes && p - r->base <= r->bytes - n) return 1;
    return 0;
}

static int overlaps_mapping_locked(CUdeviceptr p, size_t n) {
    for (struct sg_range *m = g_mapped; m; m = m->next)
        if (p < m->base + m->bytes && m->base < p + n) return 1;
    return 0;
}

SG_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    struct sg_range **pp = range_find(&g_reserved, ptr, size), *r = *pp;
    int busy = r && overlaps_mapping_locked(ptr, size);
    if (r && !busy) *pp = r->next;
    pthread_mutex_unlock(&g_mu);
    if (!r || busy) return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)ptr, size);
    free(r);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!size || size % SG_GRANULARITY || offset % SG_GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    struct sg_alloc_rec *rec = calloc(1, sizeof *rec);
    struct sg_range *m = calloc(1, sizeof *m);
    if (!rec || !m) {
        free(rec);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    struct sg_handle *h = handle_of(handle);
    /* cuda-check fix: NVIDIA documents CUDA_ERROR_INVALID_VALUE (not
     * INVALID_HANDLE) for cuMemMap, as cuMemRelease here returns for a bad handle. */
    if (!h) rc = CUDA_ERROR_INVALID_VALUE;
    else if (offset > h->bytes || size > h->bytes - offset) rc = CUDA_ERROR_INVALID_VALUE;
    else if (!inside_reservation_locked(ptr, size) || overlaps_mapping_locked(ptr, size)) rc = CUDA_ERROR_INVALID_VALUE;
    else if (mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->fd,
                  (off_t)offset) == MAP_FAILED)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!rc) {
        h->refs++;
        *m = (struct sg_range){.base = ptr, .bytes = size, .h = h, .next = g_mapped};
        g_mapped = m;
    }
    pthread_mutex_unlock(&g_mu);
    if (rc) {
        free(rec);
        free(m);
        return rc;
    }
    /* mapped ranges take part in copies, not in cuMemFree */
    *rec = (struct sg_alloc_rec){.base = ptr, .bytes = size, .index = h->index, .kind = SG_ALLOC_MAPPED};
    sg_table_add(rec);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    struct sg_range **pp = range_find(&g_mapped, ptr, size), *m = *pp;
    if (m) {
        *pp = m->next;
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        handle_unref_locked(m->h);
    }
    pthread_mutex_unlock(&g_mu);
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    free(m);
    free(sg_table_take(ptr));
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!desc || !count || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    size_t covered = 0;
    for (struct sg_range *m = g_mapped; m; m = m->next)
        if (m->base >= ptr && m->base + m->bytes <= ptr + size) covered += m->bytes;
    pthread_mutex_unlock(&g_mu);
    return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
