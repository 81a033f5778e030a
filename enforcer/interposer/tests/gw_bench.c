/* gw-bench: the cost of one cuLaunchKernel and of one cuMemAlloc_v2 +
 * cuMemFree_v2 pair, measured where simgpu's own cost is small and steady:
 * launches go to a capturing stream (a launch is then an array append).
 * Alloc/free: run it with and without LD_PRELOAD=libgpuwarden.so and
 * compare.
 *
 *   gw-bench launch N   run under LD_PRELOAD=libgpuwarden.so: prints
 *                       "launch_ns <driver> <hooked>", ns per launch of
 *                       libcuda's own cuLaunchKernel and of the one the
 *                       program links (the interposer's hook), timed in
 *                       alternating batches in this one process
 *   gw-bench alloc N    prints "alloc_free_ns <ns per alloc+free>"
 *   gw-bench lockadd N  prints "locked_add_ns <ns>": what a lock-prefixed add
 *                       right after each launch costs beyond a plain add, in
 *                       alternating rounds (the median round). Run it with
 *                       SIMGPU_MODEL=h200, where a launch leaves stores
 *                       pending as NVIDIA's does, to see what a locked
 *                       instruction on the launch path costs there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_) {                                                                                 \
            fprintf(stderr, "gw-bench: %s: %d\n", #call, (int)rc_);                                \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* NVIDIA's driver runs threads of its own; simgpu's does not until a stream
 * runs work. An idle thread in both runs keeps the cost of simgpu's munmap
 * (a TLB shootdown once a process has two threads) out of the difference. */
static void *idle(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

static uint64_t counter;

/* launches runs n launches, each followed by an add to counter: locked or plain. */
static int launches(CUfunction fn, CUstream st, long n, int locked, double *ns) {
    unsigned long long zero = 0;
    void *params[] = {&zero};
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
        if (locked) __asm__ volatile("lock addq $1, %0" : "+m"(counter));
        else __asm__ volatile("addq $1, %0" : "+m"(counter));
    }
    *ns = (now_ns() - t0) / (double)n;
    return 0;
}

/* capturing loads the bench kernel and starts a stream capturing: a launch
 * into it costs the host side alone, on simgpu and NVIDIA's driver alike. */
static int capturing(CUfunction *fn, CUstream *st) {
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, "bench"));
    CHECK(cuModuleGetFunction(fn, mod, "k"));
    CHECK(cuStreamCreate(st, 0));
    CHECK(cuStreamBeginCapture_v2(*st, CU_STREAM_CAPTURE_MODE_GLOBAL));
    return 0;
}

/* Launches are timed in batches of 64, short enough that most see no timer
 * tick, steal of this virtual CPU or preemption. Those only ever add time,
 * so a series' figure is its lower quartile: the cost of a launch when
 * nothing else ran. */
#define LAUNCH_BATCH 64

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double lower_quartile(double *v, long n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 4];
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

/* batch_ns is the ns per launch of one batch through launch. */
static int batch_ns(launch_fn launch, CUfunction fn, CUstream st, double *ns) {
    unsigned long long zero = 0;
    void *params[] = {&zero};
    double t0 = now_ns();
    for (long i = 0; i < LAUNCH_BATCH; i++) CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
    *ns = (now_ns() - t0) / LAUNCH_BATCH;
    return 0;
}

/* hook_cost times the driver's launch and the hook's side by side in one
 * process: where each process's memory lands (ASLR, cache sets) moves a
 * launch under simgpu's H200 model by more from one process to the next
 * than the hook costs, and here both see the same. */
static int hook_cost(CUfunction fn, CUstream st, long n) {
    /* glibc's own dlsym: the interposer's answers libcuda's launch with its hook */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD), *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *(*real_dlsym)(void *, const char *) = libc ? dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
    if (!real_dlsym && libc) real_dlsym = dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    launch_fn driver = cuda && real_dlsym ? (launch_fn)real_dlsym(cuda, "cuLaunchKernel") : NULL;
    if (!driver || driver == cuLaunchKernel) {
        fprintf(stderr, "gw-bench: launch: libcuda's cuLaunchKernel is not interposed (run it under LD_PRELOAD)\n");
        return 1;
    }
    long nb = n / (2 * LAUNCH_BATCH) + 1;
    double *d = calloc((size_t)nb, sizeof *d), *h = calloc((size_t)nb, sizeof *h);
    if (!d || !h) return 1;
    double warm;
    if (batch_ns(driver, fn, st, &warm) || batch_ns(cuLaunchKernel, fn, st, &warm)) return 1;
    for (long b = 0; b < nb; b++) {
        int hook_first = b & 1; /* alternate which goes first */
        if (batch_ns(hook_first ? cuLaunchKernel : driver, fn, st, hook_first ? &h[b] : &d[b])) return 1;
        if (batch_ns(hook_first ? driver : cuLaunchKernel, fn, st, hook_first ? &d[b] : &h[b])) return 1;
    }
    printf("launch_ns %.2f %.2f\n", lower_quartile(d, nb), lower_quartile(h, nb));
    return 0;
}

int main(int argc, char **argv) {
    pthread_t t;
    pthread_create(&t, NULL, idle, NULL);
    if (argc != 3) {
        fprintf(stderr, "usage: gw-bench launch|alloc|lockadd N\n");
        return 2;
    }
    long n = atol(argv[2]);
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    if (!strcmp(argv[1], "launch")) {
        CUfunction fn;
        CUstream st;
        CUgraph g;
        if (capturing(&fn, &st) || hook_cost(fn, st, n)) return 1;
        CHECK(cuStreamEndCapture(st, &g));
        return 0;
    }
    if (!strcmp(argv[1], "lockadd")) {
        CUfunction fn;
        CUstream st;
        CUgraph g;
        if (capturing(&fn, &st)) return 1;
        double warm, plain, locked, diff[9];
        if (launches(fn, st, 1000, 0, &warm)) return 1;
        for (int r = 0; r < 9; r++) {
            if (launches(fn, st, n / 9 + 1, r & 1, r & 1 ? &locked : &plain)) return 1;
            if (launches(fn, st, n / 9 + 1, !(r & 1), r & 1 ? &plain : &locked)) return 1;
            diff[r] = locked - plain;
        }
        CHECK(cuStreamEndCapture(st, &g));
        qsort(diff, 9, sizeof *diff, cmp_double);
        printf("locked_add_ns %.2f\n", diff[4]);
        return 0;
    }
    CUdeviceptr p;
    for (long i = 0; i < 100; i++) {
        CHECK(cuMemAlloc_v2(&p, 4096));
        CHECK(cuMemFree_v2(p));
    }
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CHECK(cuMemAlloc_v2(&p, 4096));
        CHECK(cuMemFree_v2(p));
    }
    double t1 = now_ns();
    printf("alloc_free_ns %.2f\n", (t1 - t0) / (double)n);
    return 0;
}
