/* calibrate: measures on a GPU what simgpu's h200 model needs. The GPU
 * check's calibration part runs it, several at once, and writes the
 * profile. The same program runs on NVIDIA's driver and on simgpu: its
 * kernel is PTX (the driver compiles it at load; simgpu accepts any image
 * and runs a kernel for its first parameter in nanoseconds).
 *
 *   calibrate costs                    ns per call of cuEventRecord,
 *                                      cuEventQuery, cuStreamIsCapturing, and
 *                                      of cuLaunchKernel into a capturing
 *                                      stream and executed
 *   calibrate idle SECONDS             hold a context, run nothing
 *   calibrate run [options]            kernels back to back:
 *       --kernel-us K     each kernel needs K us on the engine (default 1000)
 *       --seconds S       launch for S seconds (default 2)
 *       --start-at NS     wait until CLOCK_REALTIME NS first (a common start)
 *       --events          an event after each kernel: prints "burst START END"
 *                         for each stretch of completions no more than
 *                         --gap-us (default 200) apart, ns from the first event
 *       --records         the kernels log when they ran by %globaltimer:
 *                         prints "run START END" for each stretch on the
 *                         engine (NVIDIA's driver only; simgpu writes none)
 *   calibrate nvml SECONDS             every 10 ms, read device 0's per-process
 *                                      utilization and print each new sample
 *                                      as "sample TS_US PID SM_PERCENT"
 *
 * Every mode prints "ready pid=PID" once its context is up and "done" at
 * the end; an error exits 1 with the failing call on stderr.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "nvml.h"

/* tl(work_ns, rec, cap): one thread spins until it has been on the engine
 * work_ns by %globaltimer; a read more than 4 us after the previous one
 * means the context was off the engine in between. With rec not 0, each
 * stretch on the engine is appended to rec: rec[0] counts them, stretch i
 * is rec[1+2i] (start) and rec[2+2i] (end), at most cap of them. */
static const char tl_ptx[] = ".version 7.0\n"
                             ".target sm_75\n"
                             ".address_size 64\n"
                             ".visible .entry tl(.param .u64 work_ns, .param .u64 rec, .param .u64 cap)\n"
                             "{\n"
                             "\t.reg .pred %p<4>;\n"
                             "\t.reg .b64 %rd<12>;\n"
                             "\tld.param.u64 %rd1, [work_ns];\n"
                             "\tld.param.u64 %rd2, [rec];\n"
                             "\tld.param.u64 %rd3, [cap];\n"
                             "\tmov.u64 %rd4, %globaltimer;\n" /* the stretch's start */
                             "\tmov.u64 %rd5, %rd4;\n"         /* the previous read */
                             "\tmov.u64 %rd6, 0;\n"            /* time on the engine */
                             "LOOP:\n"
                             "\tmov.u64 %rd7, %globaltimer;\n"
                             "\tsub.u64 %rd8, %rd7, %rd5;\n"
                             "\tsetp.gt.u64 %p1, %rd8, 4000;\n"
                             "\t@%p1 bra REC;\n"
                             "\tadd.u64 %rd6, %rd6, %rd8;\n"
                             "\tmov.u64 %rd5, %rd7;\n"
                             "\tsetp.lt.u64 %p2, %rd6, %rd1;\n"
                             "\t@%p2 bra LOOP;\n"
                             "REC:\n" /* the stretch [%rd4, %rd5] ended */
                             "\tsetp.eq.u64 %p3, %rd2, 0;\n"
                             "\t@%p3 bra NEXT;\n"
                             "\tld.u64 %rd9, [%rd2];\n"
                             "\tsetp.ge.u64 %p3, %rd9, %rd3;\n"
                             "\t@%p3 bra NEXT;\n"
                             "\tshl.b64 %rd10, %rd9, 4;\n"
                             "\tadd.u64 %rd10, %rd10, %rd2;\n"
                             "\tst.u64 [%rd10+8], %rd4;\n"
                             "\tst.u64 [%rd10+16], %rd5;\n"
                             "\tadd.u64 %rd9, %rd9, 1;\n"
                             "\tst.u64 [%rd2], %rd9;\n"
                             "NEXT:\n"
                             "\t@%p1 bra AGAIN;\n"
                             "\tret;\n"
                             "AGAIN:\n" /* back on the engine: a new stretch */
                             "\tmov.u64 %rd4, %rd7;\n"
                             "\tmov.u64 %rd5, %rd7;\n"
                             "\tbra LOOP;\n"
                             "}\n";

#define REC_CAP 65536ull /* stretches a run logs */
#define MAX_EVENTS 60000 /* events a run records */

static void die(const char *what, int rc) {
    const char *name = "?";
    cuGetErrorName((CUresult)rc, &name);
    fprintf(stderr, "calibrate: %s: %s (%d)\n", what, name, rc);
    exit(1);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) die(#call, rc_);                                                  \
    } while (0)

static double now_ns(clockid_t clk) {
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static CUfunction g_fn;
static CUstream g_stream;

static void setup(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, tl_ptx));
    CHECK(cuModuleGetFunction(&g_fn, mod, "tl"));
    CHECK(cuStreamCreate(&g_stream, 0));
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
}

static void launch(unsigned long long work_ns, CUdeviceptr rec) {
    unsigned long long cap = REC_CAP;
    void *params[] = {&work_ns, &rec, &cap};
    CHECK(cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, g_stream, params, NULL));
}

/* costs: ns per call by the host's clock. Records go in batches of 1000
 * with a sync between, so a full queue never makes the call wait for the GPU. */
static void costs(void) {
    const long n = 100000, batch = 1000;
    CUevent ev;
    CUstreamCaptureStatus st;
    CHECK(cuEventCreate(&ev, 0x2 /* CU_EVENT_DISABLE_TIMING, as the interposer's marks */));
    launch(0, 0);
    CHECK(cuStreamSynchronize(g_stream));
    double rec_ns = 0;
    for (long b = 0; b < n / batch; b++) {
        double t0 = now_ns(CLOCK_MONOTONIC);
        for (long i = 0; i < batch; i++) CHECK(cuEventRecord(ev, g_stream));
        rec_ns += now_ns(CLOCK_MONOTONIC) - t0;
        CHECK(cuStreamSynchronize(g_stream));
    }
    double t2 = now_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) CHECK(cuEventQuery(ev));
    double t3 = now_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) CHECK(cuStreamIsCapturing(g_stream, &st));
    double t4 = now_ns(CLOCK_MONOTONIC);
    /* A launch of an empty kernel into a capturing stream, and executed
     * with a sync every 100 (the sync's time included, as gw-bench's). */
    const long launches = 20000;
    CUgraph g;
    CHECK(cuStreamBeginCapture_v2(g_stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    double t5 = now_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < launches; i++) launch(0, 0);
    double t6 = now_ns(CLOCK_MONOTONIC);
    CHECK(cuStreamEndCapture(g_stream, &g));
    CHECK(cuGraphDestroy(g));
    double t7 = now_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < launches; i++) {
        launch(0, 0);
        if (i % 100 == 99) CHECK(cuStreamSynchronize(g_stream));
    }
    double t8 = now_ns(CLOCK_MONOTONIC);
    printf("event_record_ns %.1f\n", rec_ns / (double)n);
    printf("event_query_ns %.1f\n", (t3 - t2) / (double)n);
    printf("stream_is_capturing_ns %.1f\n", (t4 - t3) / (double)n);
    printf("launch_capture_ns %.1f\n", (t6 - t5) / (double)launches);
    printf("launch_exec_ns %.1f\n", (t8 - t7) / (double)launches);
}

/* run: kernels of kernel_us for seconds; see the top of the file. */
static void run(double kernel_us, double seconds, double start_at, int events, int records, double gap_us) {
    CUdeviceptr rec = 0;
    size_t rec_bytes = (size_t)(1 + 2 * REC_CAP) * sizeof(unsigned long long);
    if (records) {
        CHECK(cuMemAlloc_v2(&rec, rec_bytes));
        CHECK(cuMemsetD8_v2(rec, 0, rec_bytes));
    }
    /* An event after each kernel: timed with --events; either way the
     * launcher waits on the one from depth kernels back, so about 20 ms of
     * work is queued at a time and the run ends when its time does. */
    static CUevent ev[MAX_EVENTS];
    int nev = 0;
    long depth = kernel_us >= 10000 ? 2 : (long)(20000 / (kernel_us > 1 ? kernel_us : 1));
    for (int i = 0; i < MAX_EVENTS; i++) CHECK(cuEventCreate(&ev[i], events ? 0 : 0x2));
    while (start_at > 0 && now_ns(CLOCK_REALTIME) < start_at) usleep(1000);
    unsigned long long work = (unsigned long long)(kernel_us * 1000);
    long kernels = 0;
    double t0 = now_ns(CLOCK_MONOTONIC);
    CHECK(cuEventRecord(ev[nev++], g_stream));
    while (now_ns(CLOCK_MONOTONIC) - t0 < seconds * 1e9 && nev < MAX_EVENTS) {
        if (kernels >= depth) CHECK(cuEventSynchronize(ev[kernels - depth + 1]));
        launch(work, rec);
        kernels++;
        CHECK(cuEventRecord(ev[nev++], g_stream));
    }
    CHECK(cuStreamSynchronize(g_stream));
    double t1 = now_ns(CLOCK_MONOTONIC);
    printf("kernels %ld\nwall_ms %.3f\n", kernels, (t1 - t0) / 1e6);
    if (events && nev > 1) {
        /* Completions gap_us or less apart are one burst on the engine; a
         * burst starts a kernel's length before its first completion. */
        double start = -1, prev = 0;
        for (int i = 1; i < nev; i++) {
            float ms;
            CHECK(cuEventElapsedTime(&ms, ev[0], ev[i]));
            double t = (double)ms * 1e6;
            if (start >= 0 && t - prev > gap_us * 1000) {
                printf("burst %.0f %.0f\n", start, prev);
                start = -1;
            }
            if (start < 0) start = t - kernel_us * 1000 > 0 ? t - kernel_us * 1000 : 0;
            prev = t;
        }
        printf("burst %.0f %.0f\n", start, prev);
    }
    if (records) {
        unsigned long long *r = malloc(rec_bytes);
        if (!r) die("malloc", CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(cuMemcpyDtoH_v2(r, rec, rec_bytes));
        unsigned long long n = r[0] < REC_CAP ? r[0] : REC_CAP;
        /* Stretches of consecutive kernels less than 20 us apart are one
         * stretch on the engine: the gap is the stream's, not a switch. */
        for (unsigned long long i = 0; i < n; i++) {
            unsigned long long s = r[1 + 2 * i], e = r[2 + 2 * i];
            while (i + 1 < n && r[1 + 2 * (i + 1)] >= e && r[1 + 2 * (i + 1)] - e < 20000) e = r[2 + 2 * ++i];
            printf("run %llu %llu\n", s, e);
        }
        printf("records %llu\n", r[0]);
        free(r);
    }
}

/* nvml: every new per-process sample of device 0, for seconds. */
static void nvml(double seconds) {
    nvmlDevice_t dev;
    nvmlReturn_t ret = nvmlInit_v2();
    if (ret == NVML_SUCCESS) ret = nvmlDeviceGetHandleByIndex_v2(0, &dev);
    if (ret != NVML_SUCCESS) {
        fprintf(stderr, "calibrate: NVML: %s\n", nvmlErrorString(ret));
        exit(1);
    }
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    static nvmlProcessUtilizationSample_t s[256];
    unsigned long long last = (unsigned long long)(now_ns(CLOCK_REALTIME) / 1000);
    double end = now_ns(CLOCK_MONOTONIC) + seconds * 1e9;
    while (now_ns(CLOCK_MONOTONIC) < end) {
        usleep(10000);
        unsigned int n = 256;
        ret = nvmlDeviceGetProcessUtilization(dev, s, &n, last);
        if (ret == NVML_ERROR_NOT_FOUND) continue;
        if (ret != NVML_SUCCESS) {
            fprintf(stderr, "calibrate: nvmlDeviceGetProcessUtilization: %s\n", nvmlErrorString(ret));
            exit(1);
        }
        unsigned long long newest = last;
        for (unsigned int i = 0; i < n; i++) {
            if (s[i].timeStamp <= last) continue; /* not new: some drivers repeat */
            printf("sample %llu %u %u\n", s[i].timeStamp, s[i].pid, s[i].smUtil);
            if (s[i].timeStamp > newest) newest = s[i].timeStamp;
        }
        last = newest;
    }
    nvmlShutdown();
}

static void usage(void) {
    fprintf(stderr, "usage: calibrate costs | idle SECONDS | nvml SECONDS | run [--kernel-us K] [--seconds S] "
                    "[--start-at NS] [--events [--gap-us G]] [--records]\n");
    exit(2);
}

/* number parses a non-negative decimal argument or exits with usage. */
static double number(const char *s) {
    char *end;
    double v = s ? strtod(s, &end) : -1;
    if (!s || end == s || *end || v < 0) usage();
    return v;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *mode = argv[1];
    if (!strcmp(mode, "nvml") && argc == 3) {
        nvml(number(argv[2]));
    } else if (!strcmp(mode, "costs") && argc == 2) {
        setup();
        costs();
    } else if (!strcmp(mode, "idle") && argc == 3) {
        double secs = number(argv[2]);
        setup();
        struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
        nanosleep(&ts, NULL);
    } else if (!strcmp(mode, "run")) {
        double kernel_us = 1000, seconds = 2, start_at = 0, gap_us = 200;
        int events = 0, records = 0;
        for (int i = 2; i < argc; i++) {
            const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
            if (!strcmp(a, "--kernel-us")) kernel_us = number(v), i++;
            else if (!strcmp(a, "--seconds")) seconds = number(v), i++;
            else if (!strcmp(a, "--start-at")) start_at = number(v), i++;
            else if (!strcmp(a, "--gap-us")) gap_us = number(v), i++;
            else if (!strcmp(a, "--events")) events = 1;
            else if (!strcmp(a, "--records")) records = 1;
            else usage();
        }
        setup();
        run(kernel_us, seconds, start_at, events, records, gap_us);
    } else {
        usage();
    }
    printf("done\n");
    return 0;
}
