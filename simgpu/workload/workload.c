/* workload: a training loop on the CUDA driver API. It allocates memory, runs
 * steps of N kernels of a given duration, synchronizes after each step, and
 * prints its rate as BENCH lines. It reaches the driver either by direct
 * linking or as the CUDA runtime does (dlopen + cuGetProcAddress_v2).
 *
 *   workload [--alloc 1Gi] [--steps N | --seconds S] [--kernels 8] [--kernel-ns 100000]
 *            [--batch 32] [--device 0] [--resolve direct|procaddr] [--graph]
 *            [--sync-every-launch] [--hold] [--label NAME] [--launch-cost N] [--try-alloc SIZE]
 *            [--start-after S] [--also-device D [--also-kernels N]] [--hold-after]
 *            [--uneven] [--host-ns N] [--progress]
 *
 * --try-alloc asks for SIZE more after --alloc and goes on whether or not it
 * gets it, printing "try-alloc <result>": an over-quota attempt. --start-after
 * holds the context idle for S seconds before the loop (a container that
 * wakes up); --seconds counts from then. --also-device runs each step on a
 * second device too: N more kernels (default --kernels) in a context and
 * stream of its own, made current for them. --hold-after prints "done
 * launches=<on --device> also=<on --also-device>" after the loop and waits
 * to be killed, so the process (and its slot) outlives the loop.
 *
 * --uneven and --host-ns shape a step as a training step is: kernels of
 * uneven lengths (a fixed cycle from a quarter to twice --kernel-ns, the
 * mean --kernel-ns) and N ns of host work (a spin) before each launch.
 *
 * --progress prints, after the first step and then about four times a
 * second, "progress <unix time> <images> <device ms>" as the GPU check's
 * train.py does: device ms sums each step's span between an event recorded
 * before its launches and one after them.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"

/* The driver functions the loop uses, however they were found. */
#define FUNCS(X)                                                                                   \
    X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc_v2)       \
    X(cuMemFree_v2) X(cuMemsetD8_v2) X(cuModuleLoadData) X(cuModuleGetFunction) X(cuLaunchKernel)  \
    X(cuStreamCreate) X(cuStreamSynchronize) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture)      \
    X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGetErrorName) X(cuEventCreate)          \
    X(cuEventRecord) X(cuEventElapsedTime)

static struct {
#define FIELD(name) __typeof__(&name) name;
    FUNCS(FIELD)
#undef FIELD
} cu;

static void die(const char *what, CUresult rc) {
    const char *name = "?";
    if (cu.cuGetErrorName) cu.cuGetErrorName(rc, &name);
    fprintf(stderr, "workload: %s: %s (%d)\n", what, name, (int)rc);
    exit(rc == CUDA_ERROR_OUT_OF_MEMORY ? 3 : 1);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) die(#call, rc_);                                                  \
    } while (0)

static void resolve_direct(void) {
#define SET(name) cu.name = name;
    FUNCS(SET)
#undef SET
}

/* The CUDA runtime's path: only cuGetProcAddress_v2 comes from dlsym. */
static void resolve_procaddr(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "workload: dlopen libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    __typeof__(&cuGetProcAddress_v2) gpa = (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "workload: libcuda.so.1 has no cuGetProcAddress_v2\n");
        exit(1);
    }
    static const char *const names[] = {
#define NAME(name) #name,
        FUNCS(NAME)
#undef NAME
    };
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char base[64];
        snprintf(base, sizeof base, "%s", names[i]);
        size_t n = strlen(base); /* ask by base name, as the runtime does */
        if (n > 3 && !strcmp(base + n - 3, "_v2")) base[n - 3] = 0;
        CUdriverProcAddressQueryResult status;
        CUresult rc = gpa(base, &slots[i], CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "workload: cuGetProcAddress_v2(%s): %d, status %d\n", base, (int)rc, (int)status);
            exit(1);
        }
    }
}

/* SIGINT or SIGTERM end the loop early; the rate so far is still printed. */
static volatile sig_atomic_t stopping;
static void on_stop(int sig) {
    (void)sig;
    stopping = 1;
}

/* CPU time of the calling thread, in seconds: the launch path's own cost,
 * steadier than wall time on a shared machine. */
static double thread_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* spin_ns busies the host for ns, as a framework's per-operator work does. */
static void spin_ns(long ns) {
    double until = now_s() + (double)ns / 1e9;
    while (now_s() < until) {
    }
}

static unsigned long long parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!strcmp(end, "Ki")) return v << 10;
    if (!strcmp(end, "Mi")) return v << 20;
    if (!strcmp(end, "Gi")) return v << 30;
    if (*end) {
        fprintf(stderr, "workload: bad size %s\n", s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    unsigned long long alloc = 0, kernel_ns = 100000, try_alloc = 0;
    long steps = 0, kernels = 8, batch = 32, launch_cost = 0;
    double seconds = 0, start_after = 0;
    int device = 0, graph = 0, sync_each = 0, hold = 0, also_device = -1, hold_after = 0, uneven = 0, progress = 0;
    long host_ns = 0;
    long also_kernels = -1;
    const char *resolve = "direct", *label = "workload";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(flag) (!strcmp(a, flag) && v && ++i)
        if (OPT("--alloc")) alloc = parse_size(v);
        else if (OPT("--steps")) steps = atol(v);
        else if (OPT("--seconds")) seconds = atof(v);
        else if (OPT("--kernels")) kernels = atol(v);
        else if (OPT("--kernel-ns")) kernel_ns = strtoull(v, NULL, 10);
        else if (OPT("--batch")) batch = atol(v);
        else if (OPT("--device")) device = atoi(v);
        else if (OPT("--resolve")) resolve = v;
        else if (OPT("--label")) label = v;
        else if (OPT("--launch-cost")) launch_cost = atol(v);
        else if (OPT("--try-alloc")) try_alloc = parse_size(v);
        else if (OPT("--start-after")) start_after = atof(v);
        else if (OPT("--also-device")) also_device = atoi(v);
        else if (OPT("--also-kernels")) also_kernels = atol(v);
        else if (OPT("--host-ns")) host_ns = atol(v);
        else if (!strcmp(a, "--uneven")) uneven = 1;
        else if (!strcmp(a, "--progress")) progress = 1;
        else if (!strcmp(a, "--graph")) graph = 1;
        else if (!strcmp(a, "--sync-every-launch")) sync_each = 1;
        else if (!strcmp(a, "--hold")) hold = 1;
        else if (!strcmp(a, "--hold-after")) hold_after = 1;
        else {
            fprintf(stderr, "workload: unknown or incomplete option %s\n", a);
            return 2;
        }
#undef OPT
    }
    if (!strcmp(resolve, "direct")) resolve_direct();
    else if (!strcmp(resolve, "procaddr")) resolve_procaddr();
    else {
        fprintf(stderr, "workload: --resolve wants direct or procaddr\n");
        return 2;
    }
    if (!steps && !seconds && !hold && !launch_cost) steps = 100;

    CUdevice dev;
    CUcontext ctx;
    CHECK(cu.cuInit(0));
    CHECK(cu.cuDeviceGet(&dev, device));
    CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cu.cuCtxSetCurrent(ctx));
    CUdeviceptr buf = 0;
    if (alloc) {
        CHECK(cu.cuMemAlloc_v2(&buf, alloc));
        CHECK(cu.cuMemsetD8_v2(buf, 0, alloc < 4096 ? alloc : 4096));
    }
    if (try_alloc) {
        CUdeviceptr extra;
        CUresult rc = cu.cuMemAlloc_v2(&extra, try_alloc);
        const char *name = "?";
        cu.cuGetErrorName(rc, &name);
        printf("try-alloc %s\n", name);
    }
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    static const char image[] = "simulated";
    CHECK(cu.cuModuleLoadData(&mod, image));
    CHECK(cu.cuModuleGetFunction(&fn, mod, "train_step"));
    CHECK(cu.cuStreamCreate(&stream, 0));
    CUcontext also_ctx = NULL;
    CUfunction also_fn = NULL;
    CUstream also_stream = NULL;
    if (also_device >= 0) {
        CUdevice d2;
        CUmodule mod2;
        if (also_kernels < 0) also_kernels = kernels;
        CHECK(cu.cuDeviceGet(&d2, also_device));
        CHECK(cu.cuDevicePrimaryCtxRetain(&also_ctx, d2));
        CHECK(cu.cuCtxSetCurrent(also_ctx));
        CHECK(cu.cuModuleLoadData(&mod2, image));
        CHECK(cu.cuModuleGetFunction(&also_fn, mod2, "train_step"));
        CHECK(cu.cuStreamCreate(&also_stream, 0));
        CHECK(cu.cuCtxSetCurrent(ctx));
    }
    printf("ready pid=%d alloc=%llu\n", (int)getpid(), alloc);
    fflush(stdout);
    if (hold) {
        for (;;) pause();
    }

    /* The cost of one asynchronous launch, with nothing to run. */
    if (launch_cost) {
        unsigned long long zero = 0;
        void *params[] = {&zero};
        double t0 = now_s();
        for (long i = 0; i < launch_cost; i++)
            CHECK(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
        double t1 = now_s();
        CHECK(cu.cuStreamSynchronize(stream));
        printf("BENCH %s_launch_ns %.1f ns\n", label, (t1 - t0) * 1e9 / (double)launch_cost);
        return 0;
    }

    /* A step's kernel lengths: all --kernel-ns, or (--uneven) a cycle of
     * eighths of it with mean 1. */
    static const unsigned long long eighths[] = {2, 4, 14, 4, 16, 6, 12, 6};
    unsigned long long kernel_len = kernel_ns;
    void *params[] = {&kernel_len};
#define KERNEL_LEN(k) (uneven ? kernel_ns * eighths[(k) % 8] / 8 : kernel_ns)
    CUgraphExec exec = NULL;
    if (graph) {
        CUgraph g;
        CHECK(cu.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (long k = 0; k < kernels; k++) {
            kernel_len = KERNEL_LEN(k);
            CHECK(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
        }
        CHECK(cu.cuStreamEndCapture(stream, &g));
        CHECK(cu.cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    if (start_after > 0) {
        struct timespec idle = {(time_t)start_after, (long)((start_after - (double)(time_t)start_after) * 1e9)};
        nanosleep(&idle, NULL);
    }
    CUevent ev0 = NULL, ev1 = NULL;
    double device_ms = 0, last_progress = 0;
    if (progress) {
        CHECK(cu.cuEventCreate(&ev0, 0));
        CHECK(cu.cuEventCreate(&ev1, 0));
    }
    double start = now_s(), end = start, cpu0 = thread_cpu_s();
    long done = 0, launched = 0, also_launched = 0;
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    while (!stopping && ((steps && done < steps) || (seconds && end - start < seconds))) {
        if (progress) CHECK(cu.cuEventRecord(ev0, stream));
        if (graph) {
            CHECK(cu.cuGraphLaunch(exec, stream));
            launched++;
        } else {
            for (long k = 0; k < kernels; k++) {
                if (host_ns) spin_ns(host_ns);
                kernel_len = KERNEL_LEN(k);
                CHECK(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
                launched++;
                if (sync_each) CHECK(cu.cuStreamSynchronize(stream));
            }
        }
        if (also_ctx) {
            kernel_len = kernel_ns;
            CHECK(cu.cuCtxSetCurrent(also_ctx));
            for (long k = 0; k < also_kernels; k++) {
                CHECK(cu.cuLaunchKernel(also_fn, 1, 1, 1, 32, 1, 1, 0, also_stream, params, NULL));
                also_launched++;
            }
            CHECK(cu.cuStreamSynchronize(also_stream));
            CHECK(cu.cuCtxSetCurrent(ctx));
        }
        if (progress) CHECK(cu.cuEventRecord(ev1, stream));
        CHECK(cu.cuStreamSynchronize(stream));
        done++;
        end = now_s();
        if (progress) {
            float ms;
            CHECK(cu.cuEventElapsedTime(&ms, ev0, ev1));
            device_ms += ms;
            if (done == 1 || end - last_progress >= 0.25) {
                printf("progress %.3f %ld %.3f\n", wall_s(), done * batch, device_ms);
                fflush(stdout);
                last_progress = end;
            }
        }
    }
    double elapsed = end - start;
    printf("BENCH %s_launch_thread_cpu_us_per_step %.3f us\n", label, (thread_cpu_s() - cpu0) * 1e6 / (double)(done ? done : 1));
    printf("BENCH %s_steps_per_sec %.2f steps/s\n", label, (double)done / elapsed);
    printf("BENCH %s_images_per_sec %.2f images/s\n", label, (double)done * (double)batch / elapsed);
    printf("BENCH %s_device_busy_ratio %.3f ratio\n", label,
           (double)done * (double)kernels * (double)kernel_ns / 1e9 / elapsed);
    if (hold_after) {
        printf("done launches=%ld also=%ld\n", launched, also_launched);
        fflush(stdout);
        for (;;) pause();
    }
    if (buf) CHECK(cu.cuMemFree_v2(buf));
    return 0;
}
