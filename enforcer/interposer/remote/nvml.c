/* NVML of the remote client: every function simgpu's nvml.h declares,
 * forwarded to the worker's libnvidia-ml.so.1, where the interposer reports
 * the session's quota as the memory total, so nvidia-smi-like tools in the
 * container see the slice. A device handle is the worker's device index. */
#include <stdarg.h>
#include <string.h>

#include "client.h"
#include "nvml.h"

#define MAX_DEVICES 64
#define NULL_BUFFER 0x80000000u /* the caller passed no buffer: it asks for a count */

struct nvmlDevice_st {
    unsigned index;
};
static struct nvmlDevice_st g_devs[MAX_DEVICES];
static int g_nvml_init;

static nvmlReturn_t of_cuda(CUresult rc) {
    if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE || rc == CUDA_ERROR_UNKNOWN) return NVML_ERROR_GPU_IS_LOST;
    if (rc == CUDA_ERROR_NO_DEVICE) return NVML_ERROR_DRIVER_NOT_LOADED;
    return (nvmlReturn_t)rc; /* the worker's answer is already an nvmlReturn_t */
}

/* call forwards one NVML function; out gets up to cap bytes (*got of them). */
static nvmlReturn_t call(uint32_t fn, unsigned index, uint32_t arg, uint64_t arg64, const char *str, void *out,
                         size_t cap, size_t *got) {
    if (!gwr_connected()) {
        if (gwr_dead()) return NVML_ERROR_GPU_IS_LOST;
        /* NVML alone opens the session too, and so does a forked child's first call */
        if (fn != GWR_NVML_INIT && !__atomic_load_n(&g_nvml_init, __ATOMIC_ACQUIRE)) return NVML_ERROR_UNINITIALIZED;
        CUresult rc = gwr_connect();
        if (rc) return of_cuda(rc);
    }
    if (fn != GWR_NVML_INIT && !__atomic_load_n(&g_nvml_init, __ATOMIC_ACQUIRE)) return NVML_ERROR_UNINITIALIZED;
    uint8_t b[32];
    size_t n = gwr_encode(b, sizeof b, "iiiq", fn, (uint32_t)index, arg, arg64), k = 0;
    size_t ns = str ? strnlen(str, GWR_MAX_NAME + 1) : 0;
    if (ns > GWR_MAX_NAME) return NVML_ERROR_INVALID_ARGUMENT;
    CUresult rc = gwr_call(GWR_OP_NVML, b, n, str, ns, out, cap, &k, NULL, 0);
    if (got) *got = k;
    return of_cuda(rc);
}

static int dev_index(nvmlDevice_t d, unsigned *index) {
    if (d < g_devs || d >= g_devs + MAX_DEVICES) return -1;
    *index = (unsigned)(d - g_devs);
    return 0;
}

#define DEV(d, idx)                                                                                \
    unsigned idx;                                                                                  \
    if (dev_index((d), &idx)) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t init(unsigned flags) {
    nvmlReturn_t rc = call(GWR_NVML_INIT, 0, flags, 0, NULL, NULL, 0, NULL);
    if (!rc) __atomic_store_n(&g_nvml_init, 1, __ATOMIC_RELEASE);
    return rc;
}
GWR_EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(0); }
GWR_EXPORT nvmlReturn_t nvmlInit(void) { return init(0); }
GWR_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init(flags); }
GWR_EXPORT nvmlReturn_t nvmlShutdown(void) { return call(GWR_NVML_SHUTDOWN, 0, 0, 0, NULL, NULL, 0, NULL); }

/* Error texts: the table shared with simgpu. */
#include "nvml_errors.h"

static nvmlReturn_t string(uint32_t fn, unsigned index, char *dst, unsigned int length) {
    char tmp[256];
    size_t got = 0;
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = call(fn, index, length, 0, NULL, tmp, sizeof tmp, &got);
    if (rc) return rc;
    if (!got || got > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, tmp, got);
    dst[got - 1] = 0;
    return NVML_SUCCESS;
}

GWR_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return string(GWR_NVML_DRIVER_VERSION, 0, version, length);
}
GWR_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return string(GWR_NVML_NVML_VERSION, 0, version, length);
}

static nvmlReturn_t u32(uint32_t fn, unsigned index, const char *str, unsigned *out) {
    uint32_t v;
    size_t got = 0;
    nvmlReturn_t rc = call(fn, index, 0, 0, str, &v, 4, &got);
    if (!rc && got != 4) rc = NVML_ERROR_UNKNOWN;
    if (!rc) *out = v;
    return rc;
}

GWR_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    return u32(GWR_NVML_CUDA_VERSION, 0, NULL, (unsigned *)v);
}
GWR_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

GWR_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = u32(GWR_NVML_COUNT, 0, NULL, deviceCount);
    if (!rc && *deviceCount > MAX_DEVICES) *deviceCount = MAX_DEVICES;
    return rc;
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

static nvmlReturn_t handle(uint32_t fn, unsigned index, const char *str, nvmlDevice_t *device) {
    if (!device || (fn != GWR_NVML_BY_INDEX && !str)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned got;
    nvmlReturn_t rc = u32(fn, index, str, &got);
    if (rc) return rc;
    if (got >= MAX_DEVICES) return NVML_ERROR_NOT_SUPPORTED;
    *device = &g_devs[got];
    g_devs[got].index = got;
    return NVML_SUCCESS;
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle(GWR_NVML_BY_INDEX, index, NULL, device);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle(GWR_NVML_BY_INDEX, index, NULL, device);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return handle(GWR_NVML_BY_UUID, 0, uuid, device);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return handle(GWR_NVML_BY_PCI, 0, pciBusId, device);
}

GWR_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV(device, i);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = i;
    return NVML_SUCCESS;
}

GWR_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV(device, i);
    return string(GWR_NVML_NAME, i, name, length);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV(device, i);
    return string(GWR_NVML_UUID, i, uuid, length);
}

/* fixed fetches a struct of a known size. */
static nvmlReturn_t fixed(uint32_t fn, unsigned index, uint32_t arg, void *out, size_t size) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    uint8_t tmp[256];
    size_t got = 0;
    nvmlReturn_t rc = call(fn, index, arg, 0, NULL, tmp, sizeof tmp, &got);
    if (!rc && got != size) rc = NVML_ERROR_UNKNOWN;
    if (!rc) memcpy(out, tmp, size);
    return rc;
}

GWR_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV(device, i);
    return fixed(GWR_NVML_PCI, i, 0, pci, sizeof *pci);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    DEV(device, i);
    if (!minorNumber) return NVML_ERROR_INVALID_ARGUMENT;
    return u32(GWR_NVML_MINOR, i, NULL, minorNumber);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEV(device, i);
    return fixed(GWR_NVML_MEMORY, i, 0, memory, sizeof *memory);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEV(device, i);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    return fixed(GWR_NVML_MEMORY_V2, i, memory->version, memory, sizeof *memory);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEV(device, i);
    return fixed(GWR_NVML_UTILIZATION, i, 0, utilization, sizeof *utilization);
}

/* The worker's processes are what its GPU runs for this session: the
 * worker itself, as seen on the GPU node. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned ver, unsigned *count, void *infos, size_t each) {
    DEV(device, i);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    static _Thread_local uint8_t tmp[4 + 256 * sizeof(nvmlProcessInfo_v2_t)];
    size_t got = 0;
    unsigned want = *count > 256 ? 256 : *count;
    nvmlReturn_t rc = call(GWR_NVML_PROCESSES, i, ver | (infos ? 0 : NULL_BUFFER), want, NULL, tmp, sizeof tmp, &got);
    if (got < 4) return rc ? rc : NVML_ERROR_UNKNOWN;
    uint32_t n;
    memcpy(&n, tmp, 4);
    *count = n;
    if (!rc && infos) memcpy(infos, tmp + 4, (got - 4) / each * each);
    return rc;
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_v1_t *infos) {
    return processes(device, 1, infoCount, infos, sizeof *infos);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                                 nvmlProcessInfo_v2_t *infos) {
    return processes(device, 2, infoCount, infos, sizeof *infos);
}
GWR_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos) {
    return processes(device, 3, infoCount, infos, sizeof *infos);
}

GWR_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t *utilization,
                                                        unsigned int *processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp) {
    DEV(device, i);
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    static _Thread_local uint8_t tmp[4 + 256 * sizeof(nvmlProcessUtilizationSample_t)];
    size_t got = 0;
    unsigned want = *processSamplesCount > 256 ? 256 : *processSamplesCount;
    nvmlReturn_t rc = call(GWR_NVML_PROCESS_UTILIZATION, i, want | (utilization ? 0 : NULL_BUFFER), lastSeenTimeStamp,
                           NULL, tmp, sizeof tmp, &got);
    if (got < 4) return rc ? rc : NVML_ERROR_UNKNOWN;
    uint32_t n;
    memcpy(&n, tmp, 4);
    *processSamplesCount = n;
    if (!rc && utilization)
        memcpy(utilization, tmp + 4, (got - 4) / sizeof *utilization * sizeof *utilization);
    return rc;
}
