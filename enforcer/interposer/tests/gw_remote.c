/* gw-remote: checks of a remote GPU session, one per subcommand. It links
 * libcuda.so.1 and libnvidia-ml.so.1 by soname, so the same program runs on
 * simgpu (its default) or remotely (LD_LIBRARY_PATH=bin/remote).
 *
 *   params        a record kernel's parameter bytes, by kernelParams and by extra
 *   quota BYTES   memory total by CUDA and NVML; an allocation over BYTES
 *   async         a launch with too short a parameter buffer, then two synchronizations
 *   hold          prints "ready", then synchronizes until a call fails
 *   module        loads a 200 KiB described image and launches its kernel
 *   launches N    N empty launches, a sync every 1000: BENCH launches per second
 *   queries N     N rounds of a framework's start-up questions (device count, handle,
 *                 name, attributes, UUID, a module's function), each round answered alike
 *   bandwidth MIB host-to-device and device-to-host copies of MIB MiB ("ready" once allocated): BENCH MiB/s
 *   roundtrip N   N synchronous calls (cuCtxSynchronize on an idle context): BENCH us per call
 *   threads N     N threads, each with its own stream, launching, filling and reading back
 *   images        loads an ELF (4096 bytes, sections after the section headers too) and a
 *                 fatbin (16 + 1000 bytes) image, each followed by bytes that are not its
 *   flush         launches a 100 ms kernel and an event, sleeps 500 ms, queries the event:
 *                 done, unless the launch waited for the query to be sent
 *   fork          prints "ready", waits for a line on stdin, forks: the child uses the GPU
 *                 (CUDA and NVML) in a session of its own, then the parent goes on in its own
 *   wait FLAGS MS [primary]
 *                 on a context created with FLAGS (primary: the primary context, its flags set
 *                 first), five synchronizes of an MS ms kernel each: the times the waiting thread
 *                 slept in each (voluntary context switches)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda.h"
#include "nvml.h"

static const char *name(CUresult rc) {
    const char *s = "?";
    cuGetErrorName(rc, &s);
    return s;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_) {                                                                                 \
            printf("fail %s: %s\n", #call, name(rc_));                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUcontext setup(void) {
    CUcontext c;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&c, 0));
    CHECK(cuCtxSetCurrent(c));
    return c;
}

/* sizes 8 (the output pointer), 1, 2, 4, 8, 3, 16, 12, 1: every alignment case */
static const char record_image[] = "simgpu-module 1\n"
                                   "kernel sleep sleep 8\n"
                                   "kernel rec record 8 1 2 4 8 3 16 12 1\n";

static int params(void) {
    setup();
    CUmodule m;
    CUfunction f;
    CHECK(cuModuleLoadData(&m, record_image));
    CHECK(cuModuleGetFunction(&f, m, "rec"));
    CUresult rc = cuModuleGetFunction(&f, m, "missing");
    if (rc != CUDA_ERROR_NOT_FOUND) {
        printf("fail missing kernel: %s\n", name(rc));
        return 1;
    }
    CHECK(cuModuleGetFunction(&f, m, "rec"));
    size_t n = 0, off, size, total = 0;
    while (cuFuncGetParamInfo(f, n, &off, &size) == CUDA_SUCCESS) {
        if (off + size > total) total = off + size;
        n++;
    }
    CUdeviceptr out;
    CHECK(cuMemAlloc_v2(&out, 4096));
    CHECK(cuMemsetD8_v2(out, 0xee, 4096));
    /* every parameter's bytes distinct from every other's */
    unsigned char vals[16][16], want[4096];
    void *kp[16];
    memset(want, 0, sizeof want);
    for (size_t i = 0; i < n; i++) {
        cuFuncGetParamInfo(f, i, &off, &size);
        for (size_t b = 0; b < size; b++) vals[i][b] = (unsigned char)(17 * i + b + 1);
        if (i == 0) memcpy(vals[0], &out, 8);
        memcpy(want + off, vals[i], size);
        kp[i] = vals[i];
    }
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, kp, NULL));
    unsigned char got[4096];
    CHECK(cuMemcpyDtoH_v2(got, out, total));
    if (memcmp(got, want, total)) {
        for (size_t i = 0; i < total; i++)
            if (got[i] != want[i]) {
                printf("fail kernelParams byte %zu of %zu: got %02x want %02x\n", i, total, got[i], want[i]);
                break;
            }
        return 1;
    }
    /* the same buffer, packed by the caller */
    CUdeviceptr out2;
    CHECK(cuMemAlloc_v2(&out2, 4096));
    memcpy(want, &out2, 8);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, want, CU_LAUNCH_PARAM_BUFFER_SIZE, &total, CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuMemcpyDtoH_v2(got, out2, total));
    if (memcmp(got, want, total)) {
        printf("fail extra bytes differ\n");
        return 1;
    }
    printf("params ok %zu params %zu bytes\n", n, total);
    return 0;
}

static int quota(unsigned long long limit) {
    setup();
    size_t free_, total;
    CHECK(cuMemGetInfo_v2(&free_, &total));
    printf("total %zu\n", total);
    CUdeviceptr p;
    printf("alloc-over %s\n", name(cuMemAlloc_v2(&p, limit + (64 << 20))));
    printf("alloc-half %s\n", name(cuMemAlloc_v2(&p, limit / 2)));
    nvmlDevice_t d;
    nvmlMemory_t mem;
    if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &d) || nvmlDeviceGetMemoryInfo(d, &mem)) {
        printf("fail nvml\n");
        return 1;
    }
    printf("nvml-total %llu\n", mem.total);
    return 0;
}

/* A launch whose packed `extra` buffer is shorter than the kernel's
 * parameters: the driver refuses it at once, a remote session (which sends
 * the buffer as is) at the next synchronization. */
static int async_error(void) {
    setup();
    CUmodule m;
    CUfunction f;
    CHECK(cuModuleLoadData(&m, record_image));
    CHECK(cuModuleGetFunction(&f, m, "rec"));
    CUdeviceptr out;
    CHECK(cuMemAlloc_v2(&out, 4096));
    size_t size = sizeof out;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &out, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    printf("launch %s\n", name(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra)));
    printf("sync %s\n", name(cuCtxSynchronize()));
    printf("sync-again %s\n", name(cuCtxSynchronize()));
    return 0;
}

static int hold(void) {
    setup();
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 64 << 20));
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        double t0 = now_s();
        CUresult rc = cuCtxSynchronize();
        if (rc) {
            printf("failed %s after %.0f ms\n", name(rc), (now_s() - t0) * 1e3);
            CUdeviceptr q;
            printf("then %s\n", name(cuMemAlloc_v2(&q, 1)));
            return 0;
        }
        usleep(20000);
    }
}

static int module(void) {
    setup();
    size_t n = 200 << 10;
    char *img = malloc(n + 1);
    int k = snprintf(img, n, "%s", record_image);
    /* comment lines make the image large */
    for (int i = 0; (size_t)k + 64 < n; i++) k += snprintf(img + k, n - (size_t)k, "# padding line %06d\n", i);
    CUmodule m;
    CUfunction f;
    CHECK(cuModuleLoadData(&m, img));
    CHECK(cuModuleGetFunction(&f, m, "sleep"));
    uint64_t ns = 1000;
    void *kp[] = {&ns};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, kp, NULL));
    CHECK(cuCtxSynchronize());
    printf("module ok %zu bytes\n", strlen(img) + 1);
    return 0;
}

/* queries: n rounds of the questions a framework asks at start-up (device
 * count and handle, every attribute, UUID, a module's function), each
 * round's answers the same as the first's. */
static int queries(long n) {
    setup();
    CUmodule m;
    CHECK(cuModuleLoadData(&m, record_image));
    enum { attrs = 160 };
    int count0 = 0, attr0[attrs], asked[attrs] = {0};
    char name0[256];
    CUdevice dev0 = -1;
    CUuuid uuid0;
    CUfunction f0 = NULL;
    for (long r = 0; r < n; r++) {
        int count, v;
        CUdevice dev;
        CUuuid u;
        CUfunction f;
        CHECK(cuDeviceGetCount(&count));
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuDeviceGetUuid_v2(&u, dev));
        char full[256], cut[5];
        CHECK(cuDeviceGetName(full, sizeof full, dev));
        CHECK(cuDeviceGetName(cut, sizeof cut, dev));
        if (!r) snprintf(name0, sizeof name0, "%s", full);
        if (strcmp(full, name0) || strncmp(cut, full, sizeof cut - 1) || strlen(cut) != sizeof cut - 1) {
            printf("round %ld: the device name \"%s\", cut to %zu bytes: \"%s\"\n", r, full, sizeof cut, cut);
            return 1;
        }
        CHECK(cuModuleGetFunction(&f, m, "sleep"));
        if (cuModuleGetFunction(&f, m, "no-such-kernel") != CUDA_ERROR_NOT_FOUND) {
            printf("a missing kernel was found\n");
            return 1;
        }
        if (!r) count0 = count, dev0 = dev, uuid0 = u, f0 = f;
        if (count != count0 || dev != dev0 || memcmp(&u, &uuid0, sizeof u) || f != f0) {
            printf("round %ld: the device's facts changed\n", r);
            return 1;
        }
        for (int a = 1; a < attrs; a++) {
            if (r && !asked[a]) continue;
            CUresult rc = cuDeviceGetAttribute(&v, (CUdevice_attribute)a, dev);
            if (!r && rc == CUDA_ERROR_INVALID_VALUE) continue; /* one the device does not answer */
            CHECK(rc);
            if (!r) attr0[a] = v, asked[a] = 1;
            else if (v != attr0[a]) {
                printf("round %ld: attribute %d changed\n", r, a);
                return 1;
            }
        }
    }
    printf("queries ok %ld\n", n);
    return 0;
}

static int launches(long n) {
    setup();
    CUmodule m;
    CUfunction f;
    CHECK(cuModuleLoadData(&m, "empty"));
    CHECK(cuModuleGetFunction(&f, m, "k"));
    uint64_t ns = 0;
    void *kp[] = {&ns};
    double t0 = now_s();
    for (long i = 1; i <= n; i++) {
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, kp, NULL));
        if (i % 1000 == 0) CHECK(cuCtxSynchronize());
    }
    CHECK(cuCtxSynchronize());
    printf("BENCH launches_per_sec %.0f launches/s\n", (double)n / (now_s() - t0));
    return 0;
}

static int bandwidth(size_t mib) {
    setup();
    size_t n = mib << 20;
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, n));
    printf("ready\n"); /* before the host buffer is filled: a test may stop the worker now */
    fflush(stdout);
    unsigned char *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 131 + 7);
    memset(back, 0, n); /* its pages exist: copies are timed, not first touches */
    CHECK(cuMemcpyHtoD_v2(d, h, n)); /* warm: the pages exist on both sides */
    CHECK(cuCtxSynchronize());
    double t0 = now_s();
    for (int i = 0; i < 4; i++) CHECK(cuMemcpyHtoD_v2(d, h, n));
    CHECK(cuCtxSynchronize());
    double htod = 4.0 * (double)mib / (now_s() - t0);
    t0 = now_s();
    for (int i = 0; i < 4; i++) CHECK(cuMemcpyDtoH_v2(back, d, n));
    double dtoh = 4.0 * (double)mib / (now_s() - t0);
    if (memcmp(h, back, n)) {
        printf("fail the bytes read back differ\n");
        return 1;
    }
    printf("BENCH htod_mib_per_sec %.0f MiB/s\nBENCH dtoh_mib_per_sec %.0f MiB/s\n", htod, dtoh);
    return 0;
}

static int roundtrip(long n) {
    setup();
    CHECK(cuCtxSynchronize());
    double t0 = now_s();
    for (long i = 0; i < n; i++) CHECK(cuCtxSynchronize());
    printf("BENCH sync_call_us %.2f us\n", (now_s() - t0) / (double)n * 1e6);
    return 0;
}

/* put writes a little-endian value. */
static void put(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int images(void) {
    setup();
    static unsigned char elf[8192], fat[4096];
    memset(elf, 0xab, sizeof elf); /* no NUL: a size taken from a string would be wrong */
    memset(elf, 0, 64); /* the ELF header: no program headers */
    memcpy(elf, "\177ELF\2\1\1", 7);
    put(elf + 0x28, 1024, 8);    /* e_shoff */
    put(elf + 0x3a, 64, 2);      /* e_shentsize */
    put(elf + 0x3c, 3, 2);       /* e_shnum: headers end at 1216 */
    for (int i = 0; i < 3; i++) {
        unsigned char *sh = elf + 1024 + 64 * i;
        memset(sh, 0, 64);
        put(sh + 4, i == 2 ? 8 : 1, 4);          /* sh_type: PROGBITS; the last NOBITS */
        put(sh + 0x18, i == 0 ? 64 : 3000, 8);   /* sh_offset */
        put(sh + 0x20, i == 0 ? 900 : 1096, 8);  /* sh_size: the second ends at 4096 */
    }
    memset(fat, 0xcd, sizeof fat);
    put(fat, 0xBA55ED50u, 4);
    put(fat + 4, 1, 2);
    put(fat + 6, 16, 2);  /* header size */
    put(fat + 8, 1000, 8); /* body size */
    CUmodule m;
    CHECK(cuModuleLoadData(&m, elf));
    CHECK(cuModuleUnload(m));
    CHECK(cuModuleLoadData(&m, fat));
    CHECK(cuModuleUnload(m));
    printf("images ok\n");
    return 0;
}

static int flush(void) {
    setup();
    CUmodule m;
    CUfunction f;
    CUevent e;
    CHECK(cuModuleLoadData(&m, record_image));
    CHECK(cuModuleGetFunction(&f, m, "sleep"));
    CHECK(cuEventCreate(&e, 0));
    CHECK(cuCtxSynchronize());
    uint64_t ns = 100 * 1000000ull;
    void *kp[] = {&ns};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, kp, NULL));
    CHECK(cuEventRecord(e, NULL));
    usleep(500000);
    printf("query %s\n", name(cuEventQuery(e)));
    return 0;
}

static int wait_sleeps(unsigned flags, uint64_t ms, int primary) {
    CUcontext c;
    CUdevice dev;
    CUmodule m;
    CUfunction f;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    if (primary) {
        CHECK(cuDevicePrimaryCtxSetFlags_v2(dev, flags));
        CHECK(cuDevicePrimaryCtxRetain(&c, dev));
        CHECK(cuCtxSetCurrent(c));
    } else {
        CHECK(cuCtxCreate_v2(&c, flags, dev));
    }
    CHECK(cuModuleLoadData(&m, record_image));
    CHECK(cuModuleGetFunction(&f, m, "sleep"));
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < 5; i++) {
        uint64_t ns = ms * 1000000ull;
        void *kp[] = {&ns};
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, kp, NULL));
        struct rusage a, b;
        getrusage(RUSAGE_THREAD, &a);
        CHECK(cuCtxSynchronize());
        getrusage(RUSAGE_THREAD, &b);
        printf("sleeps %ld\n", b.ru_nvcsw - a.ru_nvcsw);
    }
    return 0;
}

static CUcontext g_ctx;
static CUfunction g_sleep;

static void *thread_main(void *arg) {
    long me = (long)arg;
    if (cuCtxSetCurrent(g_ctx)) return "set current";
    CUstream s;
    CUdeviceptr d;
    if (cuStreamCreate(&s, 0) || cuMemAlloc_v2(&d, 1 << 16)) return "create";
    unsigned char back[1 << 16];
    for (int round = 0; round < 50; round++) {
        uint64_t ns = 1000;
        void *kp[] = {&ns};
        for (int i = 0; i < 20; i++)
            if (cuLaunchKernel(g_sleep, 1, 1, 1, 1, 1, 1, 0, s, kp, NULL)) return "launch";
        unsigned char v = (unsigned char)(me * 31 + round);
        if (cuMemsetD8_v2(d, v, sizeof back) || cuStreamSynchronize(s) || cuMemcpyDtoH_v2(back, d, sizeof back))
            return "sync";
        for (size_t i = 0; i < sizeof back; i++)
            if (back[i] != v) return "another thread's bytes";
    }
    if (cuStreamDestroy_v2(s) || cuMemFree_v2(d)) return "destroy";
    return NULL;
}

static int threads(int n) {
    g_ctx = setup();
    CUmodule m;
    CHECK(cuModuleLoadData(&m, record_image));
    CHECK(cuModuleGetFunction(&g_sleep, m, "sleep"));
    pthread_t t[64];
    if (n > 64) n = 64;
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, thread_main, (void *)i);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        void *why;
        pthread_join(t[i], &why);
        if (why) printf("fail thread %d: %s\n", i, (const char *)why), bad = 1;
    }
    CHECK(cuCtxSynchronize());
    if (!bad) printf("threads ok %d\n", n);
    return bad;
}

/* The child of a fork opens a session of its own (the CUDA runtime's
 * children re-initialise too); the parent's goes on untouched. */
static int fork_check(void) {
    setup();
    if (nvmlInit_v2()) {
        printf("fail nvmlInit_v2\n");
        return 1;
    }
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, 4096));
    CHECK(cuMemsetD8_v2(d, 0x5a, 4096));
    printf("ready\n");
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        CUcontext c;
        CUdeviceptr e;
        unsigned char b[64];
        CHECK(cuInit(0));
        CHECK(cuDevicePrimaryCtxRetain(&c, 0));
        CHECK(cuCtxSetCurrent(c));
        CHECK(cuMemAlloc_v2(&e, 64));
        CHECK(cuMemsetD8_v2(e, 0xc3, 64));
        CHECK(cuMemcpyDtoH_v2(b, e, 64));
        nvmlDevice_t nd;
        nvmlMemory_t mem;
        if (nvmlDeviceGetHandleByIndex_v2(0, &nd) || nvmlDeviceGetMemoryInfo(nd, &mem) || !mem.total) b[0] = 0;
        printf("child %s\n", b[0] == 0xc3 && b[63] == 0xc3 ? "ok" : "bad bytes or NVML");
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    unsigned char b[4096];
    CHECK(cuMemcpyDtoH_v2(b, d, sizeof b));
    printf("parent %s\n", b[0] == 0x5a && b[4095] == 0x5a ? "ok" : "bad bytes");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "params")) return params();
    if (!strcmp(cmd, "quota") && argc > 2) return quota(strtoull(argv[2], NULL, 10));
    if (!strcmp(cmd, "async")) return async_error();
    if (!strcmp(cmd, "hold")) return hold();
    if (!strcmp(cmd, "module")) return module();
    if (!strcmp(cmd, "launches") && argc > 2) return launches(atol(argv[2]));
    if (!strcmp(cmd, "queries") && argc > 2) return queries(atol(argv[2]));
    if (!strcmp(cmd, "bandwidth") && argc > 2) return bandwidth((size_t)atol(argv[2]));
    if (!strcmp(cmd, "roundtrip") && argc > 2) return roundtrip(atol(argv[2]));
    if (!strcmp(cmd, "threads") && argc > 2) return threads(atoi(argv[2]));
    if (!strcmp(cmd, "fork")) return fork_check();
    if (!strcmp(cmd, "flush")) return flush();
    if (!strcmp(cmd, "images")) return images();
    if (!strcmp(cmd, "wait") && argc > 3)
        return wait_sleeps((unsigned)strtoul(argv[2], NULL, 0), strtoull(argv[3], NULL, 10),
                           argc > 4 && !strcmp(argv[4], "primary"));
    fprintf(stderr, "usage: gw-remote params|quota BYTES|async|hold|module|launches N|queries N|bandwidth MIB|roundtrip N|threads N|images|flush|fork|wait FLAGS MS [primary]\n");
    return 2;
}
