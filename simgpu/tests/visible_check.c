/* visible-check: checks that simgpu's libcuda.so.1 enumerates the devices
 * CUDA_VISIBLE_DEVICES names, in its order, as NVIDIA's driver does, and that
 * each ordinal's memory, kernels and UUID land on the machine's device it
 * names, while NVML (unfiltered, as NVIDIA's) still sees every device.
 *
 * usage: visible-check --list    prints each NVML device's UUID, one a line
 *        visible-check EXPECT    EXPECT: the machine's device indices CUDA
 *                                should see, in order ("2,0"; "" for none)
 *
 * It prints cuda-check's lines (ok - <name>, not ok - <name>: <detail>, then
 * 1..<checks>) and exits 1 if any check failed. It expects a fresh machine
 * that no other process uses (simgpu/visible_test.go sets one up).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "nvml.h"

#define MiB (1ull << 20)
#define CONTEXT_COST (64 * MiB) /* what simgpu charges for a context */
#define MAX_DEV 8

static int g_expect[MAX_DEV], g_n; /* ordinal -> NVML index, as asked */
static unsigned g_ndev;            /* devices NVML sees */
static nvmlDevice_t g_nv[MAX_DEV];
static int g_checks, g_failed;
static char g_detail[512];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    if (g_detail[0]) return; /* the first failure is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_detail, sizeof g_detail, fmt, ap);
    va_end(ap);
}

static void run(const char *name, void (*check)(void)) {
    g_detail[0] = 0;
    check();
    g_checks++;
    if (g_detail[0]) g_failed++, printf("not ok - %s: %s\n", name, g_detail);
    else printf("ok - %s\n", name);
}

#define EXPECT_RC(expr, want)                                                                      \
    do {                                                                                           \
        CUresult rc_ = (expr);                                                                     \
        if (rc_ != (want)) fail("%s = %d, want %d", #expr, (int)rc_, (int)(want));                 \
    } while (0)

static unsigned long long nvml_used(unsigned i) {
    nvmlMemory_t m;
    return nvmlDeviceGetMemoryInfo(g_nv[i], &m) == NVML_SUCCESS ? m.used : ~0ull;
}

/* expected_use is what ordinal o's work should add to machine device i. */
static unsigned long long expected_use(unsigned i, unsigned long long (*per_ordinal)(int)) {
    for (int o = 0; o < g_n; o++)
        if ((unsigned)g_expect[o] == i) return per_ordinal(o);
    return 0;
}

static void expect_use(const unsigned long long *before, unsigned long long (*per_ordinal)(int)) {
    for (unsigned i = 0; i < g_ndev; i++) {
        unsigned long long got = nvml_used(i) - before[i], want = expected_use(i, per_ordinal);
        if (got != want) fail("NVML device %u: %llu bytes more used, want %llu", i, got, want);
    }
}

static void init(void) { EXPECT_RC(cuInit(0), g_n ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE); }

static void count(void) {
    int n = -1;
    CUdevice d;
    EXPECT_RC(cuDeviceGetCount(&n), g_n ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED);
    if (g_n && n != g_n) fail("cuDeviceGetCount = %d devices, want %d", n, g_n);
    if (g_n) EXPECT_RC(cuDeviceGet(&d, g_n), CUDA_ERROR_INVALID_DEVICE);
}

static void nvml_unfiltered(void) {
    unsigned n = 0;
    if (nvmlDeviceGetCount_v2(&n) != NVML_SUCCESS || n != g_ndev || n != (unsigned)atoi(getenv("SIMGPU_DEVICES")))
        fail("NVML sees %u devices, want all %s", n, getenv("SIMGPU_DEVICES"));
}

/* uuids: each ordinal is the device it names, by UUID and PCI bus. */
static void uuids(void) {
    for (int o = 0; o < g_n; o++) {
        CUdevice d;
        CUuuid u;
        char s[48], want[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlPciInfo_t pci;
        int bus = -1;
        EXPECT_RC(cuDeviceGet(&d, o), CUDA_SUCCESS);
        EXPECT_RC(cuDeviceGetUuid(&u, d), CUDA_SUCCESS);
        EXPECT_RC(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d), CUDA_SUCCESS);
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        nvmlDeviceGetUUID(g_nv[g_expect[o]], want, sizeof want);
        nvmlDeviceGetPciInfo_v3(g_nv[g_expect[o]], &pci);
        if (strcmp(s, want)) fail("ordinal %d has UUID %s, want NVML device %d's %s", o, s, g_expect[o], want);
        if ((unsigned)bus != pci.bus) fail("ordinal %d on PCI bus %d, want NVML device %d's %u", o, bus, g_expect[o], pci.bus);
    }
}

static unsigned long long alloc_size(int o) { return (unsigned long long)(o + 1) * 256 * MiB; }
static unsigned long long alloc_use(int o) { return CONTEXT_COST + alloc_size(o); }

/* memory: ordinal o's context and allocation are charged to the device it
 * names, and its cuMemGetInfo is that device's. */
static void memory(void) {
    unsigned long long before[MAX_DEV];
    CUcontext ctx[MAX_DEV] = {0};
    CUdeviceptr p[MAX_DEV] = {0};
    for (unsigned i = 0; i < g_ndev; i++) before[i] = nvml_used(i);
    for (int o = 0; o < g_n; o++) {
        EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx[o], o), CUDA_SUCCESS);
        EXPECT_RC(cuCtxPushCurrent_v2(ctx[o]), CUDA_SUCCESS);
        EXPECT_RC(cuMemAlloc_v2(&p[o], alloc_size(o)), CUDA_SUCCESS);
        CUdevice d = -1;
        EXPECT_RC(cuCtxGetDevice(&d), CUDA_SUCCESS);
        if (d != o) fail("cuCtxGetDevice = %d in ordinal %d's context", d, o);
        EXPECT_RC(cuCtxPopCurrent_v2(NULL), CUDA_SUCCESS);
    }
    expect_use(before, alloc_use);
    for (int o = 0; o < g_n; o++) {
        size_t free_bytes = 0, total = 0;
        nvmlMemory_t m = {0};
        cuCtxPushCurrent_v2(ctx[o]);
        EXPECT_RC(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
        nvmlDeviceGetMemoryInfo(g_nv[g_expect[o]], &m);
        if (free_bytes != m.free) fail("ordinal %d: %zu bytes free, NVML device %d has %llu", o, free_bytes, g_expect[o], m.free);
        cuMemFree_v2(p[o]);
        cuCtxPopCurrent_v2(NULL);
        cuDevicePrimaryCtxRelease_v2(o);
    }
}

static unsigned long long last_only(int o) { return o == g_n - 1 ? 4 * MiB : 0; }

/* vmm_and_pool: a location's id is an ordinal too. */
static void vmm_and_pool(void) {
    unsigned long long before[MAX_DEV];
    CUcontext ctx;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, g_n - 1}};
    CUmemPoolProps pp = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, g_n - 1}};
    CUmemGenericAllocationHandle h = 0;
    CUmemoryPool pool = NULL;
    CUdeviceptr p = 0;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
    for (unsigned i = 0; i < g_ndev; i++) before[i] = nvml_used(i);
    EXPECT_RC(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    EXPECT_RC(cuMemAllocFromPoolAsync(&p, 2 * MiB, pool, NULL), CUDA_SUCCESS);
    expect_use(before, last_only);
    cuMemFreeAsync(p, NULL);
    cuCtxSynchronize();
    cuMemPoolDestroy(pool);
    cuMemRelease(h);
    cuCtxPopCurrent_v2(NULL);
    cuDevicePrimaryCtxRelease_v2(0);
}

/* kernels: the last ordinal's kernels keep its device busy, no other. */
static void kernels(void) {
    CUcontext ctx;
    CUmodule m;
    CUfunction f;
    unsigned long long ns = 300000000ull;
    void *params[] = {&ns};
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, g_n - 1), CUDA_SUCCESS);
    EXPECT_RC(cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
    EXPECT_RC(cuModuleLoadData(&m, "image"), CUDA_SUCCESS);
    EXPECT_RC(cuModuleGetFunction(&f, m, "kernel"), CUDA_SUCCESS);
    EXPECT_RC(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
    for (unsigned i = 0; i < g_ndev; i++) {
        nvmlUtilization_t u = {0};
        nvmlDeviceGetUtilizationRates(g_nv[i], &u);
        int want_busy = (int)i == g_expect[g_n - 1];
        if ((u.gpu > 0) != want_busy) fail("NVML device %u is %u%% busy, want %s", i, u.gpu, want_busy ? "busy" : "idle");
    }
    cuModuleUnload(m);
    cuCtxPopCurrent_v2(NULL);
    cuDevicePrimaryCtxRelease_v2(g_n - 1);
}

static int parse_expect(const char *s) {
    for (char *end; *s; s = *end ? end + 1 : end) {
        long v = strtol(s, &end, 10);
        if (end == s || (*end && *end != ',') || v < 0 || v >= MAX_DEV || g_n == MAX_DEV) return -1;
        g_expect[g_n++] = (int)v;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2 || nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetCount_v2(&g_ndev) != NVML_SUCCESS ||
        g_ndev > MAX_DEV) {
        fprintf(stderr, "usage: visible-check --list | EXPECT (and a machine NVML can read)\n");
        return 2;
    }
    for (unsigned i = 0; i < g_ndev; i++) nvmlDeviceGetHandleByIndex_v2(i, &g_nv[i]);
    if (!strcmp(argv[1], "--list")) {
        for (unsigned i = 0; i < g_ndev; i++) {
            char u[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            nvmlDeviceGetUUID(g_nv[i], u, sizeof u);
            printf("%s\n", u);
        }
        return 0;
    }
    if (parse_expect(argv[1])) {
        fprintf(stderr, "visible-check: EXPECT %s: want device indices such as 2,0\n", argv[1]);
        return 2;
    }
    run("init", init);
    run("count", count);
    run("nvml-unfiltered", nvml_unfiltered);
    if (g_n) {
        run("uuids", uuids);
        run("memory", memory);
        run("vmm-and-pool", vmm_and_pool);
        run("kernels", kernels);
    }
    printf("1..%d\n", g_checks);
    return g_failed ? 1 : 0;
}
