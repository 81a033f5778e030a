/* gw-bench: the cost of one cuLaunchKernel and of one cuMemAlloc_v2 +
 * cuMemFree_v2 pair, measured where simgpu's own cost is small and steady:
 * launches go to a capturing stream (a launch is then an array append).
 * Run it with and without LD_PRELOAD=libgpuwarden.so and compare.
 *
 *   gw-bench launch N   prints "launch_ns <ns per launch>"
 *   gw-bench alloc N    prints "alloc_free_ns <ns per alloc+free>"
 *   gw-bench lockadd N  prints "locked_add_ns <ns>": what a lock-prefixed add
 *                       right after each launch costs beyond a plain add, in
 *                       alternating rounds (the median round). Run it with
 *                       SIMGPU_MODEL=h200, where a launch leaves stores
 *                       pending as NVIDIA's does, to see what a locked
 *                       instruction on the launch path costs there.
 */
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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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
        if (capturing(&fn, &st)) return 1;
        unsigned long long zero = 0;
        void *params[] = {&zero};
        for (long i = 0; i < 1000; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL)); /* warm */
        double t0 = now_ns();
        for (long i = 0; i < n; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL));
        double t1 = now_ns();
        CHECK(cuStreamEndCapture(st, &g));
        printf("launch_ns %.2f\n", (t1 - t0) / (double)n);
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
