/* gpuwarden-worker: runs one remote client's CUDA and NVML calls on this
 * node's GPU. It reads frames (proto.h) from one stream socket and executes
 * them in order on one thread, answering the synchronous ones.
 *
 *   gpuwarden-worker --fd N        serve the connected socket N
 *   gpuwarden-worker --listen PATH accept one connection on a unix socket, serve it
 *
 * One thread cannot deadlock with the client: the worker only ever blocks
 * reading a frame, writing a reply, or inside a driver call that finishes on
 * its own (a synchronize waits for work already queued). It writes only
 * replies, each to a client call that is waiting for it and reads it without
 * the client's send lock, so a reply write always completes; the client's
 * writes complete as the worker reads. Exit status: 0 when the peer closes,
 * 1 on a protocol error.
 *
 * With --fd, the socket is the agent's: its first frame may hand the
 * session's own connection over (proto.h), and the worker then serves that
 * connection's TLS records, and ends the session when the agent's socket
 * closes (the agent ended it, or is gone).
 *
 * GPUWARDEN_MODULE_CACHE=DIR keeps module images by content hash, so a
 * reconnecting or second client need not send them again. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "blocks.h"
#include "cuda.h"
#include "handover.h"
#include "nvml.h"
#include "proto.h"
#include "ring.h"
#include "spin.h"

#define PROTO_ERROR ((CUresult)-1)

static int g_fd = -1;
static struct gwr_tls *g_tls; /* the handed-over connection's records; NULL: plain frames on g_fd */
static struct gwr_ring g_ring; /* the client's bulk ring, on a unix socket straight from it */
static int g_passed = -1;      /* the last descriptor the client passed (its ring's memfd) */
static struct {
    unsigned long long frames, images_received, images_cached, bytes_in;
    unsigned long long ring_chunks, ring_wakes; /* device-to-host slots filled; of them announced by a frame, polled */
} g_stats;

/* ------------------------------------------------------------------------ */
/* Handles: the client names every object; this maps its names to ours.     */

enum kind { K_CTX = 1, K_STREAM, K_EVENT, K_MODULE, K_FUNC, K_GRAPH, K_EXEC, K_POOL, K_VMM };

struct hent {
    uint64_t id;     /* 0: empty */
    uint64_t parent; /* streams: their context; functions: their module */
    void *p;
    uint64_t vmm;    /* K_VMM: the allocation handle */
    uint32_t kind;
    int32_t refs;    /* primary contexts: retains */
    int32_t nparams; /* functions: -1 until asked */
    uint32_t *layout; /* functions: offset, size pairs */
};

#define MAX_HANDLES (1u << 22)
static struct hent *g_tab;
static size_t g_cap, g_used;

static size_t slot_of(uint64_t id) { return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) & (g_cap - 1); }

static struct hent *h_find(uint64_t id) {
    if (!g_cap || !id) return NULL;
    for (size_t i = slot_of(id);; i = (i + 1) & (g_cap - 1)) {
        if (g_tab[i].id == id) return &g_tab[i];
        if (!g_tab[i].id) return NULL;
    }
}

static void *h_get(uint64_t id, uint32_t kind) {
    struct hent *e = h_find(id);
    return e && e->kind == kind ? e->p : NULL;
}

static int grow(void) {
    size_t cap = g_cap ? g_cap * 2 : 1024;
    struct hent *t = calloc(cap, sizeof *t), *old = g_tab;
    if (!t) return -1;
    size_t oldcap = g_cap;
    g_tab = t;
    g_cap = cap;
    for (size_t i = 0; i < oldcap; i++) {
        if (!old[i].id) continue;
        size_t j = slot_of(old[i].id);
        while (t[j].id) j = (j + 1) & (cap - 1);
        t[j] = old[i];
    }
    free(old);
    return 0;
}

/* h_put maps a new client name; ids 0..2 are NULL and the default streams. */
static struct hent *h_put(uint64_t id, uint32_t kind, void *p, uint64_t parent) {
    if (id <= 2 || h_find(id) || g_used >= MAX_HANDLES) return NULL;
    if ((g_used + 1) * 2 > g_cap && grow()) return NULL;
    size_t i = slot_of(id);
    while (g_tab[i].id) i = (i + 1) & (g_cap - 1);
    g_tab[i] = (struct hent){.id = id, .kind = kind, .p = p, .parent = parent, .nparams = -1};
    g_used++;
    return &g_tab[i];
}

static void h_del(struct hent *e) {
    free(e->layout);
    size_t i = (size_t)(e - g_tab);
    g_tab[i].id = 0;
    g_used--;
    /* backward-shift deletion keeps every probe chain unbroken */
    for (size_t j = (i + 1) & (g_cap - 1); g_tab[j].id; j = (j + 1) & (g_cap - 1)) {
        size_t home = slot_of(g_tab[j].id);
        if (((j - home) & (g_cap - 1)) >= ((j - i) & (g_cap - 1))) {
            g_tab[i] = g_tab[j];
            g_tab[j].id = 0;
            i = j;
        }
    }
}

/* h_del_children forgets what went with a destroyed parent. */
static void h_del_children(uint64_t parent, uint32_t kind) {
    for (size_t i = 0; i < g_cap;) {
        if (g_tab[i].id && g_tab[i].kind == kind && g_tab[i].parent == parent) h_del(&g_tab[i]); /* may shift in another */
        else i++;
    }
}

static CUresult stream_of(uint64_t id, CUstream *out) {
    if (id <= 2) {
        *out = (CUstream)(uintptr_t)id; /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
        return CUDA_SUCCESS;
    }
    *out = h_get(id, K_STREAM);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ------------------------------------------------------------------------ */
/* I/O                                                                       */

static uint8_t g_block[256 << 10];
static struct gwr_blocks g_in = {.b = g_block, .cap = sizeof g_block}; /* the session's plain frames (blocks.h) */

/* After a reply the client's next frame is mostly a round trip away (a
 * program that synchronized launches its next step, in the gap the device
 * sits idle): the next read polls for it that long (spin.h), while that
 * pays, that is while the client's last frame after a reply came within the
 * window. A client a relay away, or one that works between its steps, is
 * not polled for. */
#define SPIN_NS 60000u
static uint64_t g_spin_until; /* poll until then before the next read; 0: do not */
static uint64_t g_replied_ns; /* the last reply, until the next read */
static int g_spin_pays = 1;

/* read_socket reads the session; on a plain socket a descriptor passed with
 * the bytes is kept (one at a time) for the frame that names it. */
static ssize_t read_socket(void *dst, size_t n) {
    if (g_tls) return gwr_tls_read(g_tls, dst, n);
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec v = {dst, n};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    ssize_t r = recvmsg(g_fd, &m, MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *c = r > 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
            if (g_passed >= 0) close(g_passed);
            memcpy(&g_passed, CMSG_DATA(c), sizeof g_passed);
        }
    return r;
}

/* read_some reads the session, polling first where a reply was just sent. */
static ssize_t read_some(void *dst, size_t n) {
    if (g_spin_until) {
        gwr_spin_readable(g_fd, g_tls, g_spin_until, g_spin_until, NULL);
        g_spin_until = 0;
    }
    ssize_t r = read_socket(dst, n);
    if (g_replied_ns) {
        g_spin_pays = gwr_mono_ns() - g_replied_ns < SPIN_NS;
        g_replied_ns = 0;
    }
    return r;
}

static ssize_t read_more(void *ctx, void *dst, size_t max) {
    (void)ctx;
    return read_some(dst, max);
}

/* read_full reads n bytes of the session: 1, 0 at its end, -1 on an error. */
static int read_full(void *dst, size_t n) { return gwr_blocks_read(&g_in, dst, n, read_more, NULL); }

static int write_all(const struct iovec *iov, int n) {
    if (g_tls) return gwr_tls_writev(g_tls, iov, n);
    struct iovec v[4];
    memcpy(v, iov, (size_t)n * sizeof *v);
    struct iovec *p = v;
    while (n) {
        ssize_t w = writev(g_fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        while (n && (size_t)w >= p->iov_len) w -= (ssize_t)p->iov_len, p++, n--;
        if (n) p->iov_base = (char *)p->iov_base + w, p->iov_len -= (size_t)w;
    }
    return 0;
}

static int send_frame(uint16_t op, uint32_t seq, const void *a, size_t na, const void *b, size_t nb) {
    uint8_t hdr[GWR_HDR_SIZE];
    struct gwr_hdr h = {.len = (uint32_t)(na + nb), .op = op, .seq = seq};
    gwr_put_hdr(hdr, &h);
    struct iovec v[3] = {{hdr, sizeof hdr}, {(void *)a, na}, {(void *)b, nb}};
    return write_all(v, 3);
}

/* A reply's outputs, gathered by the handler. */
static struct {
    uint8_t b[64 << 10];
    size_t n;
} g_out;

static void out_bytes(const void *p, size_t n) {
    if (n > sizeof g_out.b - g_out.n) n = sizeof g_out.b - g_out.n;
    memcpy(g_out.b + g_out.n, p, n);
    g_out.n += n;
}
static void out_u32(uint32_t v) { out_bytes(&v, 4); }
static void out_u64(uint64_t v) { out_bytes(&v, 8); }

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpuwarden-worker: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* ------------------------------------------------------------------------ */
/* Contexts: the client's current context travels in every frame.           */

static uint64_t g_cur = UINT64_MAX; /* what this thread has current; MAX: unknown */

static void use_ctx(uint64_t id) {
    if (id == g_cur) return;
    CUcontext c = h_get(id, K_CTX);
    cuCtxSetCurrent(c); /* an unknown name leaves none current: calls fail with INVALID_CONTEXT */
    g_cur = c ? id : 0;
}

static CUresult ctx_dropped(uint64_t id) {
    h_del_children(id, K_STREAM); /* a context's streams go with it */
    g_cur = UINT64_MAX;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Module images, by content hash                                            */

struct image {
    uint8_t hash[GWR_HASH_SIZE];
    size_t size, got;
    uint8_t *data; /* size + 16 zero bytes: a text image always ends */
    struct image *next;
};
static struct image *g_images;
static size_t g_image_bytes;

static struct image *image_find(const uint8_t *hash) {
    for (struct image *m = g_images; m; m = m->next)
        if (!memcmp(m->hash, hash, GWR_HASH_SIZE)) return m;
    return NULL;
}

static struct image *image_new(const uint8_t *hash, size_t size) {
    if (!size || size > GWR_MAX_IMAGE || size > GWR_MAX_SESSION_IMAGES - g_image_bytes) return NULL;
    struct image *m = calloc(1, sizeof *m);
    if (!m || !(m->data = calloc(1, size + 16))) {
        free(m);
        return NULL;
    }
    memcpy(m->hash, hash, GWR_HASH_SIZE);
    m->size = size;
    m->next = g_images;
    g_images = m;
    g_image_bytes += size;
    return m;
}

static void image_drop(struct image *m) {
    for (struct image **pp = &g_images; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    g_image_bytes -= m->size;
    free(m->data);
    free(m);
}

static void cache_path(char *out, size_t n, const char *dir, const uint8_t *hash, const char *suffix) {
    int k = snprintf(out, n, "%s/", dir);
    for (int i = 0; i < GWR_HASH_SIZE && k + 2 < (int)n; i++) k += snprintf(out + k, n - (size_t)k, "%02x", hash[i]);
    snprintf(out + k, n - (size_t)k, "%s", suffix);
}

/* cache_load reads an image another session stored; the directory is shared,
 * so what is read is believed only if its hash matches. */
static struct image *cache_load(const uint8_t *hash, size_t size) {
    const char *dir = getenv("GPUWARDEN_MODULE_CACHE");
    if (!dir || !*dir) return NULL;
    char path[4096];
    cache_path(path, sizeof path, dir, hash, "");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    struct image *m = NULL;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == size && (m = image_new(hash, size))) {
        size_t got = 0;
        while (got < size) {
            ssize_t r = read(fd, m->data + got, size - got);
            if (r <= 0) break;
            got += (size_t)r;
        }
        uint8_t h[GWR_HASH_SIZE];
        if (got == size) gwr_sha256(m->data, size, h);
        if (got != size || memcmp(h, hash, GWR_HASH_SIZE)) {
            image_drop(m);
            m = NULL;
        } else {
            m->got = size;
            g_stats.images_cached++;
        }
    }
    close(fd);
    return m;
}

static void cache_store(const struct image *m) {
    const char *dir = getenv("GPUWARDEN_MODULE_CACHE");
    if (!dir || !*dir) return;
    char path[4096], tmp[4096], suffix[64];
    cache_path(path, sizeof path, dir, m->hash, "");
    if (access(path, F_OK) == 0) return;
    snprintf(suffix, sizeof suffix, ".%d.tmp", (int)getpid());
    cache_path(tmp, sizeof tmp, dir, m->hash, suffix);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t put = 0;
    while (put < m->size) {
        ssize_t w = write(fd, m->data + put, m->size - put);
        if (w <= 0) break;
        put += (size_t)w;
    }
    if (close(fd) == 0 && put == m->size && rename(tmp, path) == 0) return;
    unlink(tmp); /* a cache that cannot be written is only slower */
}

static CUresult module_load(const struct gwr_req *r) {
    size_t size = r->q[1];
    struct image *m = image_find(r->hash);
    if (m && m->size != size) return CUDA_ERROR_INVALID_IMAGE;
    if (!m) m = cache_load(r->hash, size);
    if (!m || m->got < m->size) return (CUresult)GWR_NEED_IMAGE;
    uint8_t h[GWR_HASH_SIZE];
    gwr_sha256(m->data, m->size, h);
    if (memcmp(h, r->hash, GWR_HASH_SIZE)) {
        image_drop(m); /* the client sent bytes that are not what it named */
        return CUDA_ERROR_INVALID_IMAGE;
    }
    cache_store(m);
    CUmodule mod;
    CUresult rc = cuModuleLoadData(&mod, m->data);
    if (rc) return rc;
    if (!h_put(r->q[0], K_MODULE, mod, 0)) {
        cuModuleUnload(mod);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult image_chunk(const struct gwr_req *r) {
    size_t size = r->q[0], off = r->q[1];
    struct image *m = image_find(r->hash);
    if (!m) {
        m = image_new(r->hash, size);
        if (!m) return CUDA_ERROR_INVALID_IMAGE;
    }
    if (m->size != size || off > size || r->ndata > size - off) return CUDA_ERROR_INVALID_IMAGE;
    memcpy(m->data + off, r->data, r->ndata);
    m->got += r->ndata;
    if (m->got >= m->size && m->got - r->ndata < m->size) g_stats.images_received++;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */

typedef CUresult (*param_info_fn)(CUfunction, size_t, size_t *, size_t *);

static param_info_fn param_info(void) {
    static param_info_fn fn;
    static int looked;
    if (!looked) {
        void *p = NULL;
        looked = 1;
        if (cuGetProcAddress("cuFuncGetParamInfo", &p, 12040, CU_GET_PROC_ADDRESS_DEFAULT) == CUDA_SUCCESS)
            fn = (param_info_fn)p;
    }
    return fn;
}

/* layout asks the driver for a function's parameters, once. */
static CUresult layout(struct hent *e) {
    if (e->nparams >= 0) return CUDA_SUCCESS;
    param_info_fn fn = param_info();
    if (!fn) return CUDA_ERROR_NOT_SUPPORTED;
    uint32_t *l = malloc(GWR_MAX_PARAMS * 2 * sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    int n = 0;
    size_t off, size;
    while (n < (int)GWR_MAX_PARAMS && fn(e->p, (size_t)n, &off, &size) == CUDA_SUCCESS) {
        if (off > GWR_MAX_PARAM_BYTES || size > GWR_MAX_PARAM_BYTES - off) {
            free(l);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        l[2 * n] = (uint32_t)off;
        l[2 * n + 1] = (uint32_t)size;
        n++;
    }
    e->layout = l;
    e->nparams = n;
    return CUDA_SUCCESS;
}

static CUresult launch(const struct gwr_req *r) {
    struct hent *e = h_find(r->q[0]);
    if (!e || e->kind != K_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    CUstream s;
    CUresult rc = stream_of(r->q[1], &s);
    if (rc) return rc;
    uint32_t kind = r->i[7], nattrs = r->i[8], has_params = r->i[9];
    if (nattrs > GWR_MAX_ATTRS || (size_t)nattrs * GWR_ATTR_SIZE > r->ndata) return CUDA_ERROR_INVALID_VALUE;
    size_t np = r->ndata - (size_t)nattrs * GWR_ATTR_SIZE;
    if (np > GWR_MAX_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    static _Alignas(16) uint8_t params[GWR_MAX_PARAM_BYTES];
    memcpy(params, r->data + (size_t)nattrs * GWR_ATTR_SIZE, np);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params, CU_LAUNCH_PARAM_BUFFER_SIZE, &np, CU_LAUNCH_PARAM_END};
    void **ex = has_params ? extra : NULL;
    const uint32_t *g = r->i, *b = r->i + 3;
    switch (kind) {
    case GWR_LAUNCH_PLAIN: return cuLaunchKernel(e->p, g[0], g[1], g[2], b[0], b[1], b[2], r->i[6], s, NULL, ex);
    case GWR_LAUNCH_PTSZ: return cuLaunchKernel_ptsz(e->p, g[0], g[1], g[2], b[0], b[1], b[2], r->i[6], s, NULL, ex);
    case GWR_LAUNCH_COOPERATIVE:
    case GWR_LAUNCH_COOPERATIVE_PTSZ: {
        /* no `extra` here: point kernelParams into the packed buffer */
        void *kp[GWR_MAX_PARAMS];
        if (has_params) {
            if ((rc = layout(e))) return rc;
            for (int i = 0; i < e->nparams; i++) {
                if (e->layout[2 * i] + e->layout[2 * i + 1] > np) return CUDA_ERROR_INVALID_VALUE;
                kp[i] = params + e->layout[2 * i];
            }
        }
        void **k = has_params ? kp : NULL;
        return kind == GWR_LAUNCH_COOPERATIVE
                   ? cuLaunchCooperativeKernel(e->p, g[0], g[1], g[2], b[0], b[1], b[2], r->i[6], s, k)
                   : cuLaunchCooperativeKernel_ptsz(e->p, g[0], g[1], g[2], b[0], b[1], b[2], r->i[6], s, k);
    }
    case GWR_LAUNCH_EX:
    case GWR_LAUNCH_EX_PTSZ: {
        CUlaunchAttribute attrs[GWR_MAX_ATTRS];
        _Static_assert(sizeof(CUlaunchAttribute) == GWR_ATTR_SIZE, "attribute size");
        memcpy(attrs, r->data, (size_t)nattrs * GWR_ATTR_SIZE);
        for (uint32_t i = 0; i < nattrs; i++) {
            if (attrs[i].id != CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT &&
                attrs[i].id != CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT)
                continue;
            CUevent ev = h_get((uint64_t)(uintptr_t)attrs[i].value.programmaticEvent.event, K_EVENT);
            if (!ev) return CUDA_ERROR_INVALID_HANDLE;
            attrs[i].value.programmaticEvent.event = ev;
        }
        CUlaunchConfig c = {g[0], g[1], g[2], b[0], b[1], b[2], r->i[6], s, nattrs ? attrs : NULL, nattrs};
        return kind == GWR_LAUNCH_EX ? cuLaunchKernelEx(&c, e->p, NULL, ex) : cuLaunchKernelEx_ptsz(&c, e->p, NULL, ex);
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------------ */
/* NVML: loaded when the first NVML frame arrives                            */

#define NVML_FUNCS(X)                                                                              \
    X(nvmlInit_v2) X(nvmlInitWithFlags) X(nvmlShutdown) X(nvmlSystemGetDriverVersion)              \
    X(nvmlSystemGetNVMLVersion) X(nvmlSystemGetCudaDriverVersion_v2) X(nvmlDeviceGetCount_v2)      \
    X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetHandleByPciBusId_v2) \
    X(nvmlDeviceGetIndex) X(nvmlDeviceGetName) X(nvmlDeviceGetUUID) X(nvmlDeviceGetPciInfo_v3)     \
    X(nvmlDeviceGetMinorNumber) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)           \
    X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetComputeRunningProcesses)                       \
    X(nvmlDeviceGetComputeRunningProcesses_v2) X(nvmlDeviceGetComputeRunningProcesses_v3)          \
    X(nvmlDeviceGetProcessUtilization)

static struct {
#define NVML_FIELD(name) __typeof__(&name) name;
    NVML_FUNCS(NVML_FIELD)
#undef NVML_FIELD
} nv;

static nvmlReturn_t nvml_load(void) {
    static int state; /* 0 not tried, 1 loaded, -1 failed */
    if (!state) {
        void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
        state = h ? 1 : -1;
#define NVML_LOAD(name)                                                                            \
    if (h && !(nv.name = (__typeof__(&name))dlsym(h, #name))) state = -1;
        NVML_FUNCS(NVML_LOAD)
#undef NVML_LOAD
        if (state < 0) fprintf(stderr, "gpuwarden-worker: libnvidia-ml.so.1: %s\n", h ? "a function is missing" : dlerror());
        /* initialised for the session: the client keeps its program's own
         * init state (a forked child's session starts without an init frame) */
        if (state > 0 && nv.nvmlInit_v2() != NVML_SUCCESS) state = -1;
    }
    return state > 0 ? NVML_SUCCESS : NVML_ERROR_LIBRARY_NOT_FOUND;
}

#define NVML_NULL_BUFFER 0x80000000u /* arg flag: the caller passed no buffer */

static nvmlReturn_t nvml_call(const struct gwr_req *r) {
    nvmlReturn_t rc = nvml_load();
    if (rc) return rc;
    uint32_t fn = r->i[0], index = r->i[1], arg = r->i[2];
    nvmlDevice_t dev = NULL;
    if (fn >= GWR_NVML_NAME) {
        rc = nv.nvmlDeviceGetHandleByIndex_v2(index, &dev);
        if (rc) return rc;
    }
    char s[256] = {0};
    unsigned u = 0;
    size_t len = arg < sizeof s ? arg : sizeof s;
    switch (fn) {
    case GWR_NVML_INIT: return arg ? nv.nvmlInitWithFlags(arg) : nv.nvmlInit_v2();
    case GWR_NVML_SHUTDOWN: return nv.nvmlShutdown();
    case GWR_NVML_DRIVER_VERSION:
    case GWR_NVML_NVML_VERSION:
    case GWR_NVML_NAME:
    case GWR_NVML_UUID:
        rc = fn == GWR_NVML_DRIVER_VERSION ? nv.nvmlSystemGetDriverVersion(s, (unsigned)len)
             : fn == GWR_NVML_NVML_VERSION ? nv.nvmlSystemGetNVMLVersion(s, (unsigned)len)
             : fn == GWR_NVML_NAME         ? nv.nvmlDeviceGetName(dev, s, (unsigned)len)
                                           : nv.nvmlDeviceGetUUID(dev, s, (unsigned)len);
        if (!rc) out_bytes(s, strnlen(s, len ? len - 1 : 0) + 1);
        return rc;
    case GWR_NVML_CUDA_VERSION: {
        int v = 0;
        rc = nv.nvmlSystemGetCudaDriverVersion_v2(&v);
        out_u32((uint32_t)v);
        return rc;
    }
    case GWR_NVML_COUNT:
        rc = nv.nvmlDeviceGetCount_v2(&u);
        out_u32(u);
        return rc;
    case GWR_NVML_BY_INDEX:
    case GWR_NVML_BY_UUID:
    case GWR_NVML_BY_PCI:
        rc = fn == GWR_NVML_BY_INDEX ? nv.nvmlDeviceGetHandleByIndex_v2(index, &dev)
             : fn == GWR_NVML_BY_UUID ? nv.nvmlDeviceGetHandleByUUID(r->str, &dev)
                                      : nv.nvmlDeviceGetHandleByPciBusId_v2(r->str, &dev);
        if (!rc) rc = nv.nvmlDeviceGetIndex(dev, &u);
        out_u32(u);
        return rc;
    case GWR_NVML_PCI: {
        nvmlPciInfo_t p;
        memset(&p, 0, sizeof p);
        if (!(rc = nv.nvmlDeviceGetPciInfo_v3(dev, &p))) out_bytes(&p, sizeof p);
        return rc;
    }
    case GWR_NVML_MINOR:
        rc = nv.nvmlDeviceGetMinorNumber(dev, &u);
        out_u32(u);
        return rc;
    case GWR_NVML_MEMORY: {
        nvmlMemory_t m;
        memset(&m, 0, sizeof m);
        if (!(rc = nv.nvmlDeviceGetMemoryInfo(dev, &m))) out_bytes(&m, sizeof m);
        return rc;
    }
    case GWR_NVML_MEMORY_V2: {
        nvmlMemory_v2_t m;
        memset(&m, 0, sizeof m);
        m.version = arg;
        if (!(rc = nv.nvmlDeviceGetMemoryInfo_v2(dev, &m))) out_bytes(&m, sizeof m);
        return rc;
    }
    case GWR_NVML_UTILIZATION: {
        nvmlUtilization_t m;
        memset(&m, 0, sizeof m);
        if (!(rc = nv.nvmlDeviceGetUtilizationRates(dev, &m))) out_bytes(&m, sizeof m);
        return rc;
    }
    case GWR_NVML_PROCESSES: {
        static nvmlProcessInfo_v2_t infos[256]; /* v2 and v3 share a layout; v1 is a prefix-sized struct */
        unsigned ver = arg & 0xff, count = r->q[0] > 256 ? 256 : (unsigned)r->q[0];
        void *buf = arg & NVML_NULL_BUFFER ? NULL : infos;
        if (ver == 1) rc = nv.nvmlDeviceGetComputeRunningProcesses(dev, &count, buf);
        else if (ver == 2) rc = nv.nvmlDeviceGetComputeRunningProcesses_v2(dev, &count, buf);
        else if (ver == 3) rc = nv.nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, buf);
        else return NVML_ERROR_INVALID_ARGUMENT;
        out_u32(count);
        size_t each = ver == 1 ? sizeof(nvmlProcessInfo_v1_t) : sizeof(nvmlProcessInfo_v2_t);
        if (!rc && buf) out_bytes(infos, (count > 256 ? 256 : count) * each);
        return rc;
    }
    case GWR_NVML_PROCESS_UTILIZATION: {
        static nvmlProcessUtilizationSample_t samples[256];
        unsigned count = (arg & ~NVML_NULL_BUFFER) > 256 ? 256 : (arg & ~NVML_NULL_BUFFER);
        void *buf = arg & NVML_NULL_BUFFER ? NULL : samples;
        rc = nv.nvmlDeviceGetProcessUtilization(dev, buf, &count, r->q[0]);
        out_u32(count);
        if (!rc && buf) out_bytes(samples, (count > 256 ? 256 : count) * sizeof *samples);
        return rc;
    }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* ------------------------------------------------------------------------ */
/* The dispatcher                                                            */

/* dtoh streams a copy back in chunks: through the ring where there is one
 * (the client empties a slot while the next fills), else in DATA frames.
 * A slot the client has not emptied within a second is not waited for. */
static CUresult dtoh(const struct gwr_req *r) {
    static uint8_t buf[GWR_CHUNK];
    uint64_t src = r->q[0], n = r->q[1];
    size_t chunk = g_ring.base ? GWR_RING_SLOT_BYTES : GWR_CHUNK;
    for (uint64_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? (size_t)(n - off) : chunk;
        int slot = g_ring.base ? gwr_ring_take(&g_ring, GWR_RING_DTOH, 1000) : -1;
        CUresult rc = cuMemcpyDtoH_v2(slot < 0 ? buf : gwr_ring_slot(&g_ring, (uint32_t)slot), (CUdeviceptr)(src + off), k);
        if (rc) {
            if (slot >= 0) gwr_ring_untake(&g_ring); /* unfilled: the client still waits for this slot next */
            return rc;
        }
        if (slot >= 0) {
            g_stats.ring_chunks++;
            if (g_ring.polled) {
                if (!gwr_ring_announce(&g_ring, (uint32_t)slot, r->h.seq, off, (uint32_t)k)) continue;
                g_stats.ring_wakes++; /* the client sleeps in a read: the frame wakes it */
            } else {
                gwr_ring_filled(&g_ring, (uint32_t)slot);
            }
            uint8_t f[16];
            gwr_encode(f, sizeof f, "qii", off, (uint32_t)slot, (uint32_t)k);
            if (send_frame(GWR_OP_DATA_RING, r->h.seq, f, sizeof f, NULL, 0)) return PROTO_ERROR;
        } else if (send_frame(GWR_OP_DATA, r->h.seq, &off, sizeof off, buf, k)) {
            return PROTO_ERROR;
        }
    }
    return CUDA_SUCCESS;
}

/* ring maps the memfd the client passed with its GWR_OP_RING frame. */
static CUresult ring(const struct gwr_req *r) {
    int fd = g_passed;
    g_passed = -1;
    CUresult rc = CUDA_ERROR_NOT_SUPPORTED; /* a relay between (no descriptor), or not a ring */
    if (fd >= 0 && !g_ring.base && r->i[0] == GWR_RING_SLOTS && r->i[1] == GWR_RING_SLOT_BYTES && gwr_ring_map(&g_ring, fd) == 0)
        rc = CUDA_SUCCESS;
    /* GPUWARDEN_WORKER_RING_FRAMES=1 keeps to frames, as a worker older
     * than announcing in the ring does (for the tests of both). */
    const char *frames = getenv("GPUWARDEN_WORKER_RING_FRAMES");
    if (g_ring.polled && frames && !strcmp(frames, "1")) g_ring.polled = 0;
    if (g_ring.polled) g_ring.hdr->worker_polls = GWR_RING_POLL;
    if (fd >= 0) close(fd);
    return rc;
}

/* htod_ring copies a chunk the client put in its slot, and empties it. */
static CUresult htod_ring(const struct gwr_req *r) {
    uint32_t slot = r->i[0], n = r->i[1];
    if (!g_ring.base || slot >= GWR_RING_DTOH || n > GWR_RING_SLOT_BYTES) return CUDA_ERROR_INVALID_VALUE;
    g_stats.bytes_in += n;
    CUresult rc = cuMemcpyHtoD_v2(r->q[0], gwr_ring_slot(&g_ring, slot), n);
    gwr_ring_emptied(&g_ring, slot);
    g_spin_until = gwr_mono_ns() + GWR_RING_SPIN_NS; /* the next chunk is being filled */
    return rc;
}

static CUresult prop_of(const struct gwr_req *r, size_t size, void *out) {
    if (r->ndata != size) return CUDA_ERROR_INVALID_VALUE;
    memcpy(out, r->data, size);
    return CUDA_SUCCESS;
}

/* new_handle maps a created object, or undoes its creation. */
#define NEW_HANDLE(id, kind, p, parent, undo)                                                      \
    do {                                                                                           \
        if (!h_put((id), (kind), (p), (parent))) {                                                 \
            undo;                                                                                  \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        }                                                                                          \
    } while (0)

static CUresult handle(const struct gwr_req *r) {
    const uint64_t *q = r->q;
    const uint32_t *i = r->i;
    CUresult rc;
    CUstream s;
    struct hent *e;
    switch (r->h.op) {
    case GWR_OP_INIT: return cuInit(i[0]);
    case GWR_OP_NVML: return (CUresult)nvml_call(r);
    case GWR_OP_DEVICE_GET: {
        CUdevice d = 0;
        rc = cuDeviceGet(&d, (int)i[0]);
        out_u32((uint32_t)d);
        return rc;
    }
    case GWR_OP_DEVICE_COUNT: {
        int n = 0;
        rc = cuDeviceGetCount(&n);
        out_u32((uint32_t)n);
        return rc;
    }
    case GWR_OP_DEVICE_NAME: {
        char name[256] = {0};
        int len = (int)i[1] > 0 && i[1] < sizeof name ? (int)i[1] : (int)sizeof name;
        if ((int)i[1] <= 0) return cuDeviceGetName(NULL, 0, (CUdevice)i[0]);
        if (!(rc = cuDeviceGetName(name, len, (CUdevice)i[0]))) out_bytes(name, strnlen(name, sizeof name - 1) + 1);
        return rc;
    }
    case GWR_OP_DEVICE_UUID: {
        CUuuid u;
        rc = i[1] ? cuDeviceGetUuid_v2(&u, (CUdevice)i[0]) : cuDeviceGetUuid(&u, (CUdevice)i[0]);
        if (!rc) out_bytes(u.bytes, 16);
        return rc;
    }
    case GWR_OP_DEVICE_TOTALMEM: {
        size_t b = 0;
        rc = cuDeviceTotalMem_v2(&b, (CUdevice)i[0]);
        out_u64(b);
        return rc;
    }
    case GWR_OP_DEVICE_ATTR: {
        int v = 0;
        rc = cuDeviceGetAttribute(&v, (CUdevice_attribute)i[0], (CUdevice)i[1]);
        out_u32((uint32_t)v);
        return rc;
    }
    default: break;
    }

    use_ctx(r->h.ctx);
    switch (r->h.op) {
    case GWR_OP_DEVICE_POOL: {
        CUmemoryPool p;
        if ((e = h_find(q[0]))) return e->kind == K_POOL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; /* asked again */
        if ((rc = cuDeviceGetDefaultMemPool(&p, (CUdevice)i[0]))) return rc;
        NEW_HANDLE(q[0], K_POOL, p, 0, (void)0);
        return CUDA_SUCCESS;
    }
    case GWR_OP_PRIMARY_RETAIN: {
        CUcontext c;
        if ((rc = cuDevicePrimaryCtxRetain(&c, (CUdevice)i[0]))) return rc;
        e = h_find(q[0]);
        if (e && e->kind != K_CTX) {
            cuDevicePrimaryCtxRelease_v2((CUdevice)i[0]);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (!e) NEW_HANDLE(q[0], K_CTX, c, 0, cuDevicePrimaryCtxRelease_v2((CUdevice)i[0]));
        e = h_find(q[0]);
        e->p = c;
        e->refs++;
        return CUDA_SUCCESS;
    }
    case GWR_OP_PRIMARY_RELEASE:
        if ((rc = cuDevicePrimaryCtxRelease_v2((CUdevice)i[0]))) return rc;
        if ((e = h_find(q[0])) && e->kind == K_CTX && --e->refs <= 0) {
            h_del(e);
            return ctx_dropped(q[0]);
        }
        return CUDA_SUCCESS;
    case GWR_OP_CTX_CREATE: {
        CUcontext c;
        if ((rc = cuCtxCreate_v2(&c, i[0], (CUdevice)i[1]))) return rc;
        cuCtxPopCurrent_v2(NULL); /* this thread keeps one current context, set per frame */
        g_cur = UINT64_MAX;
        NEW_HANDLE(q[0], K_CTX, c, 0, cuCtxDestroy_v2(c));
        return CUDA_SUCCESS;
    }
    case GWR_OP_CTX_DESTROY:
        if (!(e = h_find(q[0])) || e->kind != K_CTX || e->refs) return CUDA_ERROR_INVALID_CONTEXT;
        if ((rc = cuCtxDestroy_v2(e->p))) return rc;
        h_del(e);
        return ctx_dropped(q[0]);
    case GWR_OP_CTX_SYNC: return cuCtxSynchronize();
    case GWR_OP_MEM_ALLOC: {
        CUdeviceptr p = 0;
        rc = cuMemAlloc_v2(&p, q[0]);
        out_u64(p);
        return rc;
    }
    case GWR_OP_MEM_ALLOC_PITCH: {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        rc = cuMemAllocPitch_v2(&p, &pitch, q[0], q[1], i[0]);
        out_u64(p);
        out_u64(pitch);
        return rc;
    }
    case GWR_OP_MEM_FREE: return cuMemFree_v2(q[0]);
    case GWR_OP_MEM_INFO: {
        size_t f = 0, t = 0;
        rc = cuMemGetInfo_v2(&f, &t);
        out_u64(f);
        out_u64(t);
        return rc;
    }
    case GWR_OP_MEM_ALLOC_ASYNC: {
        CUdeviceptr p = 0;
        if ((rc = stream_of(q[1], &s))) return rc;
        if (q[2]) {
            CUmemoryPool pool = h_get(q[2], K_POOL);
            if (!pool) return CUDA_ERROR_INVALID_VALUE;
            rc = i[0] ? cuMemAllocFromPoolAsync_ptsz(&p, q[0], pool, s) : cuMemAllocFromPoolAsync(&p, q[0], pool, s);
        } else {
            rc = i[0] ? cuMemAllocAsync_ptsz(&p, q[0], s) : cuMemAllocAsync(&p, q[0], s);
        }
        out_u64(p);
        return rc;
    }
    case GWR_OP_MEM_FREE_ASYNC:
        if ((rc = stream_of(q[1], &s))) return rc;
        return i[0] ? cuMemFreeAsync_ptsz(q[0], s) : cuMemFreeAsync(q[0], s);
    case GWR_OP_POOL_CREATE: {
        CUmemPoolProps props;
        CUmemoryPool p;
        if ((rc = prop_of(r, sizeof props, &props))) return rc;
        props.win32SecurityAttributes = NULL;
        if ((rc = cuMemPoolCreate(&p, &props))) return rc;
        NEW_HANDLE(q[0], K_POOL, p, 0, cuMemPoolDestroy(p));
        return CUDA_SUCCESS;
    }
    case GWR_OP_POOL_DESTROY:
        if (!(e = h_find(q[0])) || e->kind != K_POOL) return CUDA_ERROR_INVALID_VALUE;
        if ((rc = cuMemPoolDestroy(e->p))) return rc;
        h_del(e);
        return CUDA_SUCCESS;
    case GWR_OP_MEM_GRANULARITY: {
        CUmemAllocationProp prop;
        size_t g = 0;
        if ((rc = prop_of(r, sizeof prop, &prop))) return rc;
        prop.win32HandleMetaData = NULL;
        rc = cuMemGetAllocationGranularity(&g, &prop, (CUmemAllocationGranularity_flags)i[0]);
        out_u64(g);
        return rc;
    }
    case GWR_OP_MEM_CREATE: {
        CUmemAllocationProp prop;
        CUmemGenericAllocationHandle h;
        if ((rc = prop_of(r, sizeof prop, &prop))) return rc;
        prop.win32HandleMetaData = NULL;
        if ((rc = cuMemCreate(&h, q[1], &prop, q[2]))) return rc;
        NEW_HANDLE(q[0], K_VMM, NULL, 0, cuMemRelease(h));
        h_find(q[0])->vmm = h;
        return CUDA_SUCCESS;
    }
    case GWR_OP_MEM_RELEASE:
        if (!(e = h_find(q[0])) || e->kind != K_VMM) return CUDA_ERROR_INVALID_VALUE;
        if ((rc = cuMemRelease(e->vmm))) return rc;
        h_del(e);
        return CUDA_SUCCESS;
    case GWR_OP_MEM_RESERVE: {
        CUdeviceptr p = 0;
        rc = cuMemAddressReserve(&p, q[0], q[1], q[2], q[3]);
        out_u64(p);
        return rc;
    }
    case GWR_OP_MEM_ADDR_FREE: return cuMemAddressFree(q[0], q[1]);
    case GWR_OP_MEM_MAP:
        if (!(e = h_find(q[3])) || e->kind != K_VMM) return CUDA_ERROR_INVALID_VALUE;
        return cuMemMap(q[0], q[1], q[2], e->vmm, q[4]);
    case GWR_OP_MEM_UNMAP: return cuMemUnmap(q[0], q[1]);
    case GWR_OP_MEM_SET_ACCESS: {
        CUmemAccessDesc d[64];
        size_t n = r->ndata / sizeof d[0];
        if (r->ndata % sizeof d[0] || n > 64) return CUDA_ERROR_INVALID_VALUE;
        memcpy(d, r->data, r->ndata);
        return cuMemSetAccess(q[0], q[1], n ? d : NULL, n);
    }
    case GWR_OP_HTOD: g_stats.bytes_in += r->ndata; return cuMemcpyHtoD_v2(q[0], r->data, r->ndata);
    case GWR_OP_DTOH: return dtoh(r);
    case GWR_OP_RING: return ring(r);
    case GWR_OP_HTOD_RING: return htod_ring(r);
    case GWR_OP_MEMSET8: return cuMemsetD8_v2(q[0], (unsigned char)i[0], q[1]);
    case GWR_OP_MODULE_LOAD: return module_load(r);
    case GWR_OP_IMAGE_CHUNK: return image_chunk(r);
    case GWR_OP_MODULE_FUNCTION: {
        CUmodule m = h_get(q[1], K_MODULE);
        CUfunction f;
        if (!m) return CUDA_ERROR_INVALID_HANDLE;
        if ((rc = cuModuleGetFunction(&f, m, r->str))) return rc;
        NEW_HANDLE(q[0], K_FUNC, f, q[1], (void)0);
        return CUDA_SUCCESS;
    }
    case GWR_OP_MODULE_UNLOAD:
        if (!(e = h_find(q[0])) || e->kind != K_MODULE) return CUDA_ERROR_INVALID_HANDLE;
        if ((rc = cuModuleUnload(e->p))) return rc;
        h_del(e);
        h_del_children(q[0], K_FUNC); /* its functions went with it */
        return CUDA_SUCCESS;
    case GWR_OP_FUNC_PARAMS:
        if (!(e = h_find(q[0])) || e->kind != K_FUNC) return CUDA_ERROR_INVALID_HANDLE;
        if ((rc = layout(e))) return rc;
        out_u32((uint32_t)e->nparams);
        out_bytes(e->layout, (size_t)e->nparams * 8);
        return CUDA_SUCCESS;
    case GWR_OP_LAUNCH: return launch(r);
    case GWR_OP_STREAM_CREATE: {
        CUstream st;
        if ((rc = cuStreamCreate(&st, i[0]))) return rc;
        NEW_HANDLE(q[0], K_STREAM, st, r->h.ctx, cuStreamDestroy_v2(st));
        return CUDA_SUCCESS;
    }
    case GWR_OP_STREAM_DESTROY:
        if (!(e = h_find(q[0])) || e->kind != K_STREAM) return CUDA_ERROR_INVALID_HANDLE;
        if ((rc = cuStreamDestroy_v2(e->p))) return rc;
        h_del(e);
        return CUDA_SUCCESS;
    case GWR_OP_STREAM_SYNC: return (rc = stream_of(q[0], &s)) ? rc : cuStreamSynchronize(s);
    case GWR_OP_STREAM_QUERY: return (rc = stream_of(q[0], &s)) ? rc : cuStreamQuery(s);
    case GWR_OP_EVENT_CREATE: {
        CUevent ev;
        if ((rc = cuEventCreate(&ev, i[0]))) return rc;
        NEW_HANDLE(q[0], K_EVENT, ev, 0, cuEventDestroy_v2(ev));
        return CUDA_SUCCESS;
    }
    case GWR_OP_EVENT_RECORD: {
        CUevent ev = h_get(q[0], K_EVENT);
        if (!ev) return CUDA_ERROR_INVALID_HANDLE;
        return (rc = stream_of(q[1], &s)) ? rc : cuEventRecord(ev, s);
    }
    case GWR_OP_EVENT_QUERY:
    case GWR_OP_EVENT_SYNC: {
        CUevent ev = h_get(q[0], K_EVENT);
        if (!ev) return CUDA_ERROR_INVALID_HANDLE;
        return r->h.op == GWR_OP_EVENT_QUERY ? cuEventQuery(ev) : cuEventSynchronize(ev);
    }
    case GWR_OP_EVENT_ELAPSED: {
        float ms = 0;
        CUevent a = h_get(q[0], K_EVENT), b = h_get(q[1], K_EVENT);
        if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
        rc = cuEventElapsedTime(&ms, a, b);
        out_bytes(&ms, sizeof ms);
        return rc;
    }
    case GWR_OP_EVENT_DESTROY:
        if (!(e = h_find(q[0])) || e->kind != K_EVENT) return CUDA_ERROR_INVALID_HANDLE;
        if ((rc = cuEventDestroy_v2(e->p))) return rc;
        h_del(e);
        return CUDA_SUCCESS;
    case GWR_OP_CAPTURE_BEGIN:
        return (rc = stream_of(q[0], &s)) ? rc : cuStreamBeginCapture_v2(s, (CUstreamCaptureMode)i[0]);
    case GWR_OP_CAPTURE_END: {
        CUgraph g;
        if ((rc = stream_of(q[0], &s)) || (rc = cuStreamEndCapture(s, &g))) return rc;
        NEW_HANDLE(q[1], K_GRAPH, g, 0, cuGraphDestroy(g));
        return CUDA_SUCCESS;
    }
    case GWR_OP_GRAPH_INSTANTIATE: {
        CUgraph g = h_get(q[1], K_GRAPH);
        CUgraphExec x;
        if (!g) return CUDA_ERROR_INVALID_VALUE;
        if ((rc = cuGraphInstantiateWithFlags(&x, g, q[2]))) return rc;
        NEW_HANDLE(q[0], K_EXEC, x, 0, cuGraphExecDestroy(x));
        return CUDA_SUCCESS;
    }
    case GWR_OP_GRAPH_LAUNCH: {
        CUgraphExec x = h_get(q[0], K_EXEC);
        if (!x) return CUDA_ERROR_INVALID_VALUE;
        if ((rc = stream_of(q[1], &s))) return rc;
        return i[0] ? cuGraphLaunch_ptsz(x, s) : cuGraphLaunch(x, s);
    }
    case GWR_OP_GRAPH_DESTROY:
    case GWR_OP_GRAPH_EXEC_DESTROY: {
        uint32_t kind = r->h.op == GWR_OP_GRAPH_DESTROY ? K_GRAPH : K_EXEC;
        if (!(e = h_find(q[0])) || e->kind != kind) return CUDA_ERROR_INVALID_VALUE;
        rc = kind == K_GRAPH ? cuGraphDestroy(e->p) : cuGraphExecDestroy(e->p);
        if (!rc) h_del(e);
        return rc;
    }
    }
    return PROTO_ERROR; /* HELLO again, or a worker-to-client op */
}

/* Ops whose reply reports an earlier asynchronous frame's error, as CUDA's
 * synchronizing calls report an earlier launch's. */
static int syncpoint(uint16_t op) {
    switch (op) {
    case GWR_OP_CTX_SYNC:
    case GWR_OP_STREAM_SYNC:
    case GWR_OP_STREAM_QUERY:
    case GWR_OP_EVENT_SYNC:
    case GWR_OP_EVENT_QUERY:
    case GWR_OP_DTOH: return 1;
    }
    return 0;
}

static int read_frame(struct gwr_req *r, uint8_t *payload) {
    uint8_t hdr[GWR_HDR_SIZE];
    struct gwr_hdr h;
    int rc = read_full(hdr, sizeof hdr);
    if (rc <= 0) return rc;
    if (gwr_get_hdr(hdr, &h)) die("protocol error: malformed frame header");
    if ((rc = read_full(payload, h.len)) <= 0) return rc < 0 ? rc : -1; /* EOF inside a frame */
    if (gwr_decode(&h, payload, r)) die("protocol error: malformed frame (op %u, %u bytes)", h.op, h.len);
    return 1;
}

static int serve(void) {
    static uint8_t payload[GWR_MAX_PAYLOAD];
    static struct gwr_req r;
    int rc = read_frame(&r, payload);
    if (rc <= 0) return 0; /* closed before hello: nothing to do */
    if (r.h.op != GWR_OP_HELLO || r.i[0] != GWR_MAGIC) die("protocol error: the first frame is not a hello");
    uint32_t reply[2] = {CUDA_SUCCESS, GWR_VERSION};
    if (r.i[1] != GWR_VERSION) {
        reply[0] = CUDA_ERROR_NOT_SUPPORTED;
        send_frame(GWR_OP_REPLY, r.h.seq, reply, sizeof reply, NULL, 0);
        die("client speaks protocol version %u, this worker %u", r.i[1], GWR_VERSION);
    }
    if (send_frame(GWR_OP_REPLY, r.h.seq, reply, sizeof reply, NULL, 0)) return 0;
    CUresult pending = CUDA_SUCCESS; /* the first failed asynchronous frame's error */
    while ((rc = read_frame(&r, payload)) > 0) {
        g_stats.frames++;
        g_out.n = 0;
        CUresult res = handle(&r);
        if (res == PROTO_ERROR) {
            if (r.h.op == GWR_OP_DTOH) return 0; /* the peer went away mid-reply */
            die("protocol error: op %u is not a request", r.h.op);
        }
        if (!(r.h.flags & GWR_F_SYNC)) {
            if (res && !pending && res != (CUresult)GWR_NEED_IMAGE) pending = res;
            continue;
        }
        if (syncpoint(r.h.op) && pending) {
            res = pending;
            pending = CUDA_SUCCESS;
        }
        uint32_t head = (uint32_t)res;
        if (send_frame(GWR_OP_REPLY, r.h.seq, &head, sizeof head, g_out.b, g_out.n)) return 0;
        g_replied_ns = gwr_mono_ns();
        g_spin_until = g_spin_pays ? g_replied_ns + SPIN_NS : 0;
    }
    return 0;
}

/* listen_once binds a temporary name and renames it into place once it
 * listens: whoever sees PATH can connect. */
static int listen_once(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof a.sun_path) die("--listen %s: path too long", path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(a.sun_path);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1) || rename(a.sun_path, path)) {
        unlink(a.sun_path);
        die("--listen %s: %s", path, strerror(errno));
    }
    int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) die("--listen %s: accept: %s", path, strerror(errno));
    close(s);
    unlink(path);
    return c;
}

/* watch_agent ends the session when the agent's socket closes: the
 * session's reads then see its end. */
static void *watch_agent(void *arg) {
    int ctl = (int)(intptr_t)arg;
    char b[64];
    for (;;) {
        ssize_t r = read(ctl, b, sizeof b);
        if (r == 0 || (r < 0 && errno != EINTR)) break;
    }
    shutdown(g_fd, SHUT_RDWR);
    return NULL;
}

/* take_over reads the agent's first frame: a handover switches g_fd to the
 * session's connection; anything else is the client's, left to serve. */
static void take_over(void) {
    static uint8_t payload[256];
    uint8_t hdr[GWR_HDR_SIZE];
    struct gwr_hdr h;
    int fd;
    if (gwr_recv_hdr(g_fd, hdr, &fd)) exit(0); /* closed before anything came */
    if (gwr_get_hdr(hdr, &h) || h.op != GWR_OP_HANDOVER) {
        if (fd >= 0) die("protocol error: a socket came with frame op %u", h.op);
        memcpy(g_in.b, hdr, sizeof hdr);
        g_in.at = 0, g_in.end = sizeof hdr;
        return;
    }
    if (h.len > sizeof payload || read_full(payload, h.len) <= 0) die("protocol error: a short handover frame");
    struct gwr_tls *t;
    if (gwr_handover_take(&h, payload, fd, &t) || !t) die("the session cannot be taken over: %s", strerror(errno));
    int ctl = g_fd;
    g_fd = fd;
    g_tls = t;
    pthread_t w;
    if (pthread_create(&w, NULL, watch_agent, (void *)(intptr_t)ctl)) die("no thread to watch the agent's socket");
    pthread_detach(w);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--fd")) {
        char *end;
        long fd = strtol(argv[2], &end, 10);
        if (*end || fd < 0 || fd > 1 << 20 || fcntl((int)fd, F_GETFD) < 0) die("--fd %s: not an open descriptor", argv[2]);
        g_fd = (int)fd;
        take_over();
    } else if (argc == 3 && !strcmp(argv[1], "--listen")) {
        g_fd = listen_once(argv[2]);
    } else {
        fprintf(stderr, "usage: gpuwarden-worker --fd N | --listen PATH\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int buf = GWR_SOCKET_BUFFER;
    setsockopt(g_fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(g_fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    int rc = serve();
    char path[160] = "plain";
    if (g_tls) {
        int n = snprintf(path, sizeof path, "over TLS, ");
        gwr_tls_in_kernel(g_tls, path + n, sizeof path - (size_t)n);
    } else if (g_ring.base && g_ring.polled) {
        snprintf(path, sizeof path, "bulk ring (%llu device-to-host chunks announced in it, %llu of them by a frame too)",
                 g_stats.ring_chunks, g_stats.ring_wakes);
    } else if (g_ring.base) {
        snprintf(path, sizeof path, "bulk ring (%llu device-to-host chunks announced by frames)", g_stats.ring_chunks);
    }
    fprintf(stderr, "gpuwarden-worker: session ended: %llu frames, %llu images received, %llu images from cache, %s\n",
            g_stats.frames, g_stats.images_received, g_stats.images_cached, path);
    return rc;
}
