/* nvml_api: checks the C-level contract of simgpu's libnvidia-ml.so.1 that
 * go-nvml cannot reach (NULL pointers, short buffers, stray handles, the
 * init reference count, the v1/v2 entry points). Built against simgpu's
 * nvml.h and run by simgpu/nvml_test.go; prints one line per failed check and
 * exits 1 if there was any.
 *
 * usage: nvml_api api NDEV              (no process may use a device meanwhile)
 *        nvml_api procs DEV PID BYTES   (PID holds BYTES on DEV)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "nvml.h"

static int failures;

static void fail_at(int line, const char *what) {
    printf("nvml_api.c:%d: %s\n", line, what);
    failures++;
}

/* EXPECT_RET checks a call's return code and names both codes on failure. */
#define EXPECT_RET(call, want)                                                                  \
    do {                                                                                        \
        nvmlReturn_t got_ = (call);                                                             \
        if (got_ != (want)) {                                                                   \
            char msg_[512];                                                                     \
            snprintf(msg_, sizeof msg_, "%s = %d (%s), want %d (%s)", #call, got_,             \
                     nvmlErrorString(got_), (want), nvmlErrorString(want));                    \
            fail_at(__LINE__, msg_);                                                            \
        }                                                                                       \
    } while (0)

#define CHECK(cond)                                 \
    do {                                            \
        if (!(cond)) fail_at(__LINE__, #cond);      \
    } while (0)

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ull + (unsigned long long)tv.tv_usec;
}

static void before_init(void) {
    unsigned int n;
    nvmlDevice_t d;
    char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int v = 0;
    EXPECT_RET(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(0, &d), NVML_ERROR_UNINITIALIZED);
    EXPECT_RET(nvmlDeviceGetHandleByUUID("GPU-x", &d), NVML_ERROR_UNINITIALIZED);
    EXPECT_RET(nvmlSystemGetDriverVersion(buf, sizeof buf), NVML_ERROR_UNINITIALIZED);
    EXPECT_RET(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    /* documented to work without init */
    EXPECT_RET(nvmlSystemGetNVMLVersion(buf, sizeof buf), NVML_SUCCESS);
    EXPECT_RET(nvmlSystemGetCudaDriverVersion(&v), NVML_SUCCESS);
    CHECK(v == 12080);
    CHECK(!strcmp(nvmlErrorString(NVML_ERROR_UNINITIALIZED), "Uninitialized"));
    CHECK(!strcmp(nvmlErrorString((nvmlReturn_t)12345), "Unknown Error"));
}

static void system_queries(void) {
    char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int v = 0;
    EXPECT_RET(nvmlSystemGetDriverVersion(buf, sizeof buf), NVML_SUCCESS);
    CHECK(strlen(buf) > 0);
    EXPECT_RET(nvmlSystemGetDriverVersion(buf, 3), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT_RET(nvmlSystemGetDriverVersion(NULL, sizeof buf), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlSystemGetNVMLVersion(buf, 3), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT_RET(nvmlSystemGetCudaDriverVersion_v2(&v), NVML_SUCCESS);
    CHECK(v == 12080);
    EXPECT_RET(nvmlSystemGetCudaDriverVersion(NULL), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlSystemGetCudaDriverVersion_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
}

static void enumeration(unsigned int ndev) {
    unsigned int n1 = 0, n2 = 0, idx = 99;
    nvmlDevice_t d = NULL, d1 = NULL;
    EXPECT_RET(nvmlDeviceGetCount_v2(&n2), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetCount(&n1), NVML_SUCCESS);
    CHECK(n2 == ndev && n1 == ndev);
    EXPECT_RET(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(ndev, &d), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(0, NULL), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByIndex(ndev, &d), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(ndev - 1, &d), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetHandleByIndex(ndev - 1, &d1), NVML_SUCCESS);
    CHECK(d == d1);
    EXPECT_RET(nvmlDeviceGetIndex(d, &idx), NVML_SUCCESS);
    CHECK(idx == ndev - 1);
    EXPECT_RET(nvmlDeviceGetIndex(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetMinorNumber(d, &idx), NVML_SUCCESS);
    CHECK(idx == ndev - 1);
    EXPECT_RET(nvmlDeviceGetMinorNumber(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
}

/* Handles nobody handed out must be refused, not followed. */
static void stray_handles(void) {
    struct {
        unsigned int magic, index;
    } fake = {0x4e564d4cu, 0};
    nvmlDevice_t good = NULL;
    unsigned int idx;
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(0, &good), NVML_SUCCESS);
    nvmlDevice_t bad[] = {NULL, (nvmlDevice_t)&fake, (nvmlDevice_t)((char *)good + 1),
                          (nvmlDevice_t)((char *)good - 4096)};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nvmlMemory_t m;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        EXPECT_RET(nvmlDeviceGetIndex(bad[i], &idx), NVML_ERROR_INVALID_ARGUMENT);
        EXPECT_RET(nvmlDeviceGetName(bad[i], name, sizeof name), NVML_ERROR_INVALID_ARGUMENT);
        EXPECT_RET(nvmlDeviceGetMemoryInfo(bad[i], &m), NVML_ERROR_INVALID_ARGUMENT);
    }
}

static void identity(unsigned int ndev) {
    for (unsigned int i = 0; i < ndev; i++) {
        nvmlDevice_t d, byid;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlPciInfo_t pci;
        EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(i, &d), NVML_SUCCESS);
        EXPECT_RET(nvmlDeviceGetName(d, name, sizeof name), NVML_SUCCESS);
        EXPECT_RET(nvmlDeviceGetName(d, name, 1), NVML_ERROR_INSUFFICIENT_SIZE);
        EXPECT_RET(nvmlDeviceGetName(d, NULL, sizeof name), NVML_ERROR_INVALID_ARGUMENT);
        EXPECT_RET(nvmlDeviceGetUUID(d, uuid, sizeof uuid), NVML_SUCCESS);
        CHECK(strlen(uuid) == 40 && !strncmp(uuid, "GPU-", 4));
        EXPECT_RET(nvmlDeviceGetUUID(d, uuid, 40), NVML_ERROR_INSUFFICIENT_SIZE);
        EXPECT_RET(nvmlDeviceGetUUID(d, NULL, 80), NVML_ERROR_INVALID_ARGUMENT);
        EXPECT_RET(nvmlDeviceGetUUID(d, uuid, sizeof uuid), NVML_SUCCESS);
        EXPECT_RET(nvmlDeviceGetHandleByUUID(uuid, &byid), NVML_SUCCESS);
        CHECK(byid == d);
        EXPECT_RET(nvmlDeviceGetHandleByUUID(uuid, NULL), NVML_ERROR_INVALID_ARGUMENT);

        EXPECT_RET(nvmlDeviceGetPciInfo_v3(d, &pci), NVML_SUCCESS);
        EXPECT_RET(nvmlDeviceGetPciInfo_v3(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        CHECK((pci.pciDeviceId & 0xffff) == 0x10de);
        /* every form NVIDIA accepts finds the same device */
        char forms[4][64];
        snprintf(forms[0], sizeof forms[0], "%s", pci.busId);
        snprintf(forms[1], sizeof forms[1], "%s", pci.busIdLegacy);
        snprintf(forms[2], sizeof forms[2], "%x:%x:%x", pci.domain, pci.bus, pci.device);
        snprintf(forms[3], sizeof forms[3], "%02x:%02x.0", pci.bus, pci.device);
        for (int f = 0; f < 4; f++) {
            byid = NULL;
            EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2(forms[f], &byid), NVML_SUCCESS);
            if (byid != d) {
                printf("bus id %s: ", forms[f]);
                fail_at(__LINE__, "found another device");
            }
        }
    }
    nvmlDevice_t d;
    EXPECT_RET(nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &d),
               NVML_ERROR_NOT_FOUND);
    EXPECT_RET(nvmlDeviceGetHandleByUUID(NULL, &d), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2("00000000:7F:00.0", &d), NVML_ERROR_NOT_FOUND);
    EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2("not a bus id", &d), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2("0:18:0.0 ", &d), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2(NULL, &d), NVML_ERROR_INVALID_ARGUMENT);
}

static void memory_and_utilization(unsigned int ndev) {
    for (unsigned int i = 0; i < ndev; i++) {
        nvmlDevice_t d;
        nvmlMemory_t m1;
        nvmlMemory_v2_t m2;
        nvmlUtilization_t u;
        EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(i, &d), NVML_SUCCESS);
        EXPECT_RET(nvmlDeviceGetMemoryInfo(d, &m1), NVML_SUCCESS);
        CHECK(m1.total > 0 && m1.free + m1.used == m1.total);
        EXPECT_RET(nvmlDeviceGetMemoryInfo(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        memset(&m2, 0, sizeof m2);
        EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        m2.version = (unsigned int)(sizeof m2 | 1u << 24);
        EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        m2.version = nvmlMemory_v2;
        EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, &m2), NVML_SUCCESS);
        CHECK(m2.total == m1.total && m2.reserved == 0 && m2.free + m2.used == m2.total);
        EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
        EXPECT_RET(nvmlDeviceGetUtilizationRates(d, &u), NVML_SUCCESS);
        CHECK(u.gpu <= 100 && u.memory <= u.gpu);
        EXPECT_RET(nvmlDeviceGetUtilizationRates(d, NULL), NVML_ERROR_INVALID_ARGUMENT);
    }
}

/* With no users: the count query succeeds with 0; bad arguments are refused. */
static void no_processes(unsigned int ndev) {
    for (unsigned int i = 0; i < ndev; i++) {
        nvmlDevice_t d;
        unsigned int n = 0;
        nvmlProcessInfo_t one;
        nvmlProcessUtilizationSample_t sample;
        EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(i, &d), NVML_SUCCESS);
        EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL), NVML_SUCCESS);
        CHECK(n == 0);
        n = 0;
        EXPECT_RET(nvmlDeviceGetComputeRunningProcesses(d, &n, NULL), NVML_SUCCESS);
        n = 0;
        EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v2(d, &n, NULL), NVML_SUCCESS);
        n = 1;
        EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL),
                   NVML_ERROR_INVALID_ARGUMENT);
        EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, NULL, &one),
                   NVML_ERROR_INVALID_ARGUMENT);
        n = 1;
        EXPECT_RET(nvmlDeviceGetProcessUtilization(d, &sample, &n, now_us()), NVML_ERROR_NOT_FOUND);
        EXPECT_RET(nvmlDeviceGetProcessUtilization(d, NULL, &n, now_us() + 10000000),
                   NVML_ERROR_NOT_FOUND);
        EXPECT_RET(nvmlDeviceGetProcessUtilization(d, &sample, NULL, 0),
                   NVML_ERROR_INVALID_ARGUMENT);
    }
}

/* nvmlShutdown undoes one nvmlInit*; the library works until the last one. */
static void refcount(void) {
    unsigned int n;
    EXPECT_RET(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT_RET(nvmlInit(), NVML_SUCCESS);
    EXPECT_RET(nvmlInitWithFlags(NVML_INIT_FLAG_NO_GPUS), NVML_SUCCESS);
    EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
    EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
    EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
    EXPECT_RET(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    EXPECT_RET(nvmlInit_v2(), NVML_SUCCESS); /* and it comes back */
    EXPECT_RET(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
    EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
}

static void api(unsigned int ndev) {
    before_init();
    refcount();
    EXPECT_RET(nvmlInit_v2(), NVML_SUCCESS);
    system_queries();
    enumeration(ndev);
    stray_handles();
    identity(ndev);
    memory_and_utilization(ndev);
    no_processes(ndev);
    EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
}

/* All three versions of the process query report the holder, and follow the
 * sizing protocol. */
static void procs(unsigned int dev, unsigned int pid, unsigned long long bytes) {
    nvmlDevice_t d;
    EXPECT_RET(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(dev, &d), NVML_SUCCESS);
    unsigned int n = 0;
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(n >= 1);
    nvmlProcessInfo_v1_t v1[64];
    nvmlProcessInfo_v2_t v2[64];
    nvmlProcessInfo_t v3[64];
    unsigned int short_n = n - 1;
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &short_n, v3),
               NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(short_n == n);
    unsigned int n1 = 64, n2 = 64, n3 = 64;
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses(d, &n1, v1), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v2(d, &n2, v2), NVML_SUCCESS);
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &n3, v3), NVML_SUCCESS);
    int seen1 = 0, seen2 = 0, seen3 = 0;
    for (unsigned int i = 0; i < n1 && i < 64; i++)
        seen1 += v1[i].pid == pid && v1[i].usedGpuMemory == bytes;
    for (unsigned int i = 0; i < n2 && i < 64; i++)
        seen2 += v2[i].pid == pid && v2[i].usedGpuMemory == bytes &&
                 v2[i].gpuInstanceId == 0xFFFFFFFFu && v2[i].computeInstanceId == 0xFFFFFFFFu;
    for (unsigned int i = 0; i < n3 && i < 64; i++)
        seen3 += v3[i].pid == pid && v3[i].usedGpuMemory == bytes &&
                 v3[i].gpuInstanceId == 0xFFFFFFFFu && v3[i].computeInstanceId == 0xFFFFFFFFu;
    CHECK(seen1 == 1);
    CHECK(seen2 == 1);
    CHECK(seen3 == 1);
    EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "api")) {
        api((unsigned int)strtoul(argv[2], NULL, 10));
    } else if (argc == 5 && !strcmp(argv[1], "procs")) {
        procs((unsigned int)strtoul(argv[2], NULL, 10), (unsigned int)strtoul(argv[3], NULL, 10),
              strtoull(argv[4], NULL, 10));
    } else {
        fprintf(stderr, "usage: nvml_api api NDEV | nvml_api procs DEV PID BYTES\n");
        return 2;
    }
    if (failures) {
        printf("%d checks failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
