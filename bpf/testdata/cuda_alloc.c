/* cuda-alloc: a driver-API program the eBPF tests steer line by line on stdin,
 * so they can look at the probes' view while memory is held. Each command
 * prints one line: "ok [id]" or "err <CUresult>".
 *
 *   ctx DEV                  retain DEV's primary context and make it current
 *   ctxnew DEV               cuCtxCreate_v2 (pushed and current)
 *   ctxdestroy               destroy the last context ctxnew made
 *   alloc KIND BYTES [DEV]   KIND: linear managed async async_ptsz pool pool_ptsz vmm
 *                            (pool: DEV's default pool; vmm: cuMemCreate on DEV)
 *   pitch WIDTH HEIGHT       cuMemAllocPitch_v2, prints "ok ID PITCH"
 *   free ID                  frees by the path that allocated it
 *   freethread ID            the same, from a new thread (current context set first)
 *   launch N [KIND]          N launches; KIND: kernel (default) ex graph
 *   launchthread N           N cuLaunchKernel from a thread of its own
 *   launchfor MS             cuLaunchKernel in a loop for MS milliseconds, prints "ok N"
 *   launchcapture N          N launches into a capturing stream (the launch's host cost
 *                            alone), prints "ok NS" per launch
 *   meminfo                  cuMemGetInfo_v2, prints "ok FREE TOTAL"
 *   copyalloc BYTES PATH     load the libcuda at PATH in a link-map namespace of its own
 *                            (dlmopen: no LD_PRELOAD there) and allocate BYTES on device 0
 *                            through it, past any interposer
 *   quit
 *
 * Its kernel is PTX, so the same program runs on NVIDIA's driver (which
 * compiles it at load) and on simgpu (which accepts any image).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda.h"

#define MAXA 256

static struct {
    int used;
    char kind[16];
    CUdeviceptr ptr;
    CUmemGenericAllocationHandle handle;
} g_allocs[MAXA];
static int g_n;
static CUcontext g_cur, g_created;
static CUfunction g_fn;
static CUstream g_stream;

static void reply(CUresult rc) {
    if (rc) printf("err %d\n", (int)rc);
    else printf("ok\n");
}

static CUresult do_alloc(const char *kind, size_t bytes, int dev, int *id) {
    CUresult rc;
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h = 0;
    if (!strcmp(kind, "linear")) rc = cuMemAlloc_v2(&p, bytes);
    else if (!strcmp(kind, "managed")) rc = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    else if (!strcmp(kind, "async")) rc = cuMemAllocAsync(&p, bytes, g_stream);
    else if (!strcmp(kind, "async_ptsz")) rc = cuMemAllocAsync_ptsz(&p, bytes, g_stream);
    else if (!strcmp(kind, "pool") || !strcmp(kind, "pool_ptsz")) {
        CUmemoryPool pool;
        if ((rc = cuDeviceGetDefaultMemPool(&pool, dev))) return rc;
        rc = kind[4] ? cuMemAllocFromPoolAsync_ptsz(&p, bytes, pool, g_stream)
                     : cuMemAllocFromPoolAsync(&p, bytes, pool, g_stream);
    } else if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}};
        rc = cuMemCreate(&h, bytes, &prop, 0);
    } else if (!strcmp(kind, "vmmhost")) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_HOST, 0}};
        rc = cuMemCreate(&h, bytes, &prop, 0);
    } else return CUDA_ERROR_INVALID_VALUE;
    if (rc) return rc;
    if (g_n == MAXA) return CUDA_ERROR_OUT_OF_MEMORY;
    *id = g_n++;
    g_allocs[*id].used = 1;
    snprintf(g_allocs[*id].kind, sizeof g_allocs[*id].kind, "%s", kind);
    g_allocs[*id].ptr = p;
    g_allocs[*id].handle = h;
    return CUDA_SUCCESS;
}

static CUresult do_free(int id) {
    if (id < 0 || id >= g_n || !g_allocs[id].used) return CUDA_ERROR_INVALID_VALUE;
    const char *k = g_allocs[id].kind;
    CUresult rc;
    if (!strncmp(k, "vmm", 3)) rc = cuMemRelease(g_allocs[id].handle);
    else if (!strncmp(k, "async", 5) || !strncmp(k, "pool", 4)) {
        rc = !strcmp(k, "async_ptsz") ? cuMemFreeAsync_ptsz(g_allocs[id].ptr, g_stream)
                                      : cuMemFreeAsync(g_allocs[id].ptr, g_stream);
        if (!rc) rc = cuStreamSynchronize(g_stream);
    } else rc = cuMemFree_v2(g_allocs[id].ptr);
    if (!rc) g_allocs[id].used = 0;
    return rc;
}

struct free_arg {
    int id;
    CUresult rc;
};

static void *free_thread(void *p) {
    struct free_arg *a = p;
    a->rc = cuCtxSetCurrent(g_cur);
    if (!a->rc) a->rc = do_free(a->id);
    return NULL;
}

/* launchthread: launches from a thread of their own (a probe attached to a
 * process must count every thread's). */
struct launch_arg {
    long n;
    CUresult rc;
};

static CUresult launch(long n, const char *kind);

static void *launch_thread(void *p) {
    struct launch_arg *a = p;
    a->rc = cuCtxSetCurrent(g_cur);
    if (!a->rc) a->rc = launch(a->n, "kernel");
    return NULL;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static CUresult launch(long n, const char *kind) {
    unsigned long long zero = 0;
    void *params[] = {&zero};
    CUresult rc = CUDA_SUCCESS;
    if (!strcmp(kind, "graph")) {
        CUgraph g;
        CUgraphExec exec;
        if ((rc = cuStreamBeginCapture_v2(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL))) return rc;
        if ((rc = cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, g_stream, params, NULL))) return rc;
        if ((rc = cuStreamEndCapture(g_stream, &g))) return rc;
        if ((rc = cuGraphInstantiateWithFlags(&exec, g, 0))) return rc;
        for (long i = 0; i < n && !rc; i++) rc = cuGraphLaunch(exec, g_stream);
    } else if (!strcmp(kind, "ex")) {
        CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1,
                              .blockDimZ = 1, .hStream = g_stream};
        for (long i = 0; i < n && !rc; i++) rc = cuLaunchKernelEx(&cfg, g_fn, params, NULL);
    } else {
        for (long i = 0; i < n && !rc; i++) rc = cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, g_stream, params, NULL);
    }
    if (!rc) rc = cuStreamSynchronize(g_stream);
    return rc;
}

/* An empty kernel k(u64): simgpu runs a kernel for its first parameter in
 * nanoseconds (0 here); NVIDIA's driver compiles the PTX for the device. */
static const char k_ptx[] = ".version 7.0\n"
                            ".target sm_75\n"
                            ".address_size 64\n"
                            ".visible .entry k(.param .u64 ns)\n"
                            "{\n"
                            "\tret;\n"
                            "}\n";

/* launch_capture times n launches into a capturing stream: nothing runs, so
 * the time is the launch call's own (driver and interposer), not the GPU's. */
static CUresult launch_capture(long n, double *ns) {
    unsigned long long zero = 0;
    void *params[] = {&zero};
    CUgraph g;
    CUresult rc = cuStreamBeginCapture_v2(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    for (long i = 0; i < 1000 && !rc; i++) rc = cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, g_stream, params, NULL);
    double t0 = now_ms();
    for (long i = 0; i < n && !rc; i++) rc = cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, g_stream, params, NULL);
    double t1 = now_ms();
    CUresult end = cuStreamEndCapture(g_stream, &g);
    if (!rc) rc = end;
    if (!end) cuGraphDestroy(g);
    *ns = (t1 - t0) * 1e6 / (double)(n > 0 ? n : 1);
    return rc;
}

static CUresult setup_stream(void) {
    const char *image = k_ptx;
    CUmodule mod;
    CUresult rc;
    if ((rc = cuModuleLoadData(&mod, image))) return rc;
    if ((rc = cuModuleGetFunction(&g_fn, mod, "k"))) return rc;
    return cuStreamCreate(&g_stream, 0);
}

/* copy_alloc allocates through a second driver: a copy of libcuda loaded
 * where no preloaded library can see its calls. */
static CUresult copy_alloc(const char *path, size_t bytes) {
    void *h = dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlmopen %s: %s\n", path, dlerror());
        return CUDA_ERROR_NOT_FOUND;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    if (!init || !get || !retain || !set || !alloc) return CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CUresult rc = init(0);
    if (!rc) rc = get(&dev, 0);
    if (!rc) rc = retain(&ctx, dev);
    if (!rc) rc = set(ctx);
    if (!rc) rc = alloc(&p, bytes);
    return rc; /* the copy stays loaded, its memory held */
}

int main(void) {
    char line[1024];
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUresult rc = cuInit(0);
    if (rc) {
        printf("err %d\n", (int)rc);
        return 1;
    }
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = "", a[32] = "", bs[32] = "", cs[32] = "";
        int n = sscanf(line, "%31s %31s %31s %31s", cmd, a, bs, cs);
        unsigned long long b = strtoull(bs, NULL, 10), c = strtoull(cs, NULL, 10);
        if (n < 1) continue;
        if (!strcmp(cmd, "quit")) break;
        char path[900];
        if (!strcmp(cmd, "copyalloc") && sscanf(line, "copyalloc %llu %899s", &b, path) == 2) {
            reply(copy_alloc(path, (size_t)b));
            continue;
        }
        if (!strcmp(cmd, "ctx")) {
            CUdevice dev;
            rc = cuDeviceGet(&dev, atoi(a));
            if (!rc) rc = cuDevicePrimaryCtxRetain(&g_cur, dev);
            if (!rc) rc = cuCtxSetCurrent(g_cur);
            if (!rc) rc = setup_stream();
            reply(rc);
        } else if (!strcmp(cmd, "ctxnew")) {
            rc = cuCtxCreate_v2(&g_created, 0, atoi(a));
            if (!rc) {
                g_cur = g_created;
                rc = setup_stream();
            }
            reply(rc);
        } else if (!strcmp(cmd, "ctxdestroy")) {
            reply(cuCtxDestroy_v2(g_created));
        } else if (!strcmp(cmd, "alloc")) {
            int id = -1;
            rc = do_alloc(a, (size_t)b, n >= 4 ? (int)c : 0, &id);
            if (rc) printf("err %d\n", (int)rc);
            else printf("ok %d\n", id);
        } else if (!strcmp(cmd, "pitch")) {
            CUdeviceptr p;
            size_t pitch = 0;
            rc = cuMemAllocPitch_v2(&p, &pitch, (size_t)strtoull(a, NULL, 10), (size_t)b, 4);
            if (rc) {
                printf("err %d\n", (int)rc);
                continue;
            }
            int id = g_n++;
            g_allocs[id].used = 1;
            snprintf(g_allocs[id].kind, sizeof g_allocs[id].kind, "pitch");
            g_allocs[id].ptr = p;
            printf("ok %d %zu\n", id, pitch);
        } else if (!strcmp(cmd, "free")) {
            reply(do_free(atoi(a)));
        } else if (!strcmp(cmd, "freethread")) {
            pthread_t t;
            struct free_arg fa = {.id = atoi(a)};
            pthread_create(&t, NULL, free_thread, &fa);
            pthread_join(t, NULL);
            reply(fa.rc);
        } else if (!strcmp(cmd, "launch")) {
            reply(launch(atol(a), n >= 3 ? bs : "kernel"));
        } else if (!strcmp(cmd, "launchthread")) {
            pthread_t t;
            struct launch_arg la = {.n = atol(a)};
            pthread_create(&t, NULL, launch_thread, &la);
            pthread_join(t, NULL);
            reply(la.rc);
        } else if (!strcmp(cmd, "launchcapture")) {
            double ns = 0;
            rc = launch_capture(atol(a), &ns);
            if (rc) printf("err %d\n", (int)rc);
            else printf("ok %.2f\n", ns);
        } else if (!strcmp(cmd, "meminfo")) {
            size_t free_b = 0, total_b = 0;
            rc = cuMemGetInfo_v2(&free_b, &total_b);
            if (rc) printf("err %d\n", (int)rc);
            else printf("ok %zu %zu\n", free_b, total_b);
        } else if (!strcmp(cmd, "launchfor")) {
            double end = now_ms() + atof(a);
            long count = 0;
            rc = CUDA_SUCCESS;
            while (!rc && now_ms() < end) {
                rc = launch(100, "kernel");
                count += 100;
            }
            if (rc) printf("err %d\n", (int)rc);
            else printf("ok %ld\n", count);
        } else {
            printf("err unknown command %s\n", cmd);
        }
    }
    return 0;
}
