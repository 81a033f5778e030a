/* The NVML view from inside a container: memory as the quota, and only the
 * container's own processes (from the ledger's slots, with their pids as the
 * container sees them), so nvidia-smi in a container shows its own share. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define NV_ENTER(name, args)                                                                       \
    do {                                                                                           \
        if (gw_nvml_load() || !gw_be.name) return NVML_ERROR_LIBRARY_NOT_FOUND;                    \
        if (GW_DRIVER_REENTRY(gw_in_hook)) return gw_be.name args;                                 \
        if (gw_core() == GW_FAILED) return GW_FAILED_NVML;                                         \
    } while (0)

/* ordinal finds the CUDA ordinal of an NVML device: by UUID when a CUDA
 * process of the container recorded it, else by NVML's index. */
static int ordinal(nvmlDevice_t device) {
    char want[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (gw_be.nvmlDeviceGetUUID && gw_be.nvmlDeviceGetUUID(device, want, sizeof want) == NVML_SUCCESS) {
        for (int d = 0; d < GW_MAX_DEVICES; d++) {
            const uint8_t *u = gw_usage->dev_uuid[d];
            static const uint8_t zero[16];
            if (!memcmp(u, zero, 16)) continue;
            char s[48];
            snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                     u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
            if (!strcmp(s, want)) return d;
        }
    }
    unsigned idx;
    if (gw_be.nvmlDeviceGetIndex(device, &idx) != NVML_SUCCESS || idx >= GW_MAX_DEVICES) return -1;
    return (int)idx;
}

static void memory_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *free_bytes,
                        unsigned long long *used) {
    int d = ordinal(device);
    uint64_t limit = d >= 0 ? gw_limit(d) : 0;
    if (!limit) return;
    gw_reap_dead();
    uint64_t u = atomic_load(&gw_usage->reserved_bytes[d]);
    if (limit < *total) *total = limit;
    uint64_t f = u < limit ? limit - u : 0;
    if (f < *free_bytes) *free_bytes = f;
    *used = u < *total ? u : *total;
}

GW_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    NV_ENTER(nvmlDeviceGetMemoryInfo, (device, memory));
    nvmlReturn_t r = gw_be.nvmlDeviceGetMemoryInfo(device, memory);
    if (r == NVML_SUCCESS) memory_view(device, &memory->total, &memory->free, &memory->used);
    return r;
}

GW_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    NV_ENTER(nvmlDeviceGetMemoryInfo_v2, (device, memory));
    nvmlReturn_t r = gw_be.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (r == NVML_SUCCESS) {
        memory_view(device, &memory->total, &memory->free, &memory->used);
        if (memory->reserved > memory->total - memory->used) memory->reserved = 0;
    }
    return r;
}

struct found {
    unsigned pid;
    unsigned long long bytes;
};

/* own_processes lists the container's live processes holding memory on the
 * device, with NVML's sizing protocol; -1 means "pass the call through". */
static int own_processes(nvmlDevice_t device, unsigned *count, const void *infos, struct found *out,
                         nvmlReturn_t *ret) {
    unsigned idx;
    if ((*ret = gw_be.nvmlDeviceGetIndex(device, &idx)) != NVML_SUCCESS) return 0;
    if (!count || (*count && !infos)) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
        return 0;
    }
    int d = ordinal(device);
    if (d < 0) return -1;
    gw_reap_dead();
    unsigned n = 0;
    for (int i = 0; i < GW_MAX_SLOTS; i++) {
        struct gw_slot *s = &gw_usage->slots[i];
        if (atomic_load(&s->state) != GW_SLOT_LIVE) continue;
        uint64_t b = atomic_load(&s->bytes[d]);
        int pid = atomic_load(&s->pid);
        if (!b || pid <= 0) continue;
        out[n].pid = (unsigned)pid;
        out[n].bytes = b;
        n++;
    }
    *ret = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return 0;
}

GW_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_v1_t *infos) {
    NV_ENTER(nvmlDeviceGetComputeRunningProcesses, (device, infoCount, infos));
    struct found f[GW_MAX_SLOTS];
    nvmlReturn_t r;
    if (own_processes(device, infoCount, infos, f, &r) < 0)
        return gw_be.nvmlDeviceGetComputeRunningProcesses(device, infoCount, infos);
    for (unsigned i = 0; r == NVML_SUCCESS && i < *infoCount; i++)
        infos[i] = (nvmlProcessInfo_v1_t){.pid = f[i].pid, .usedGpuMemory = f[i].bytes};
    return r;
}

static void fill_v2(nvmlProcessInfo_v2_t *info, const struct found *f) {
    memset(info, 0, sizeof *info);
    info->pid = f->pid;
    info->usedGpuMemory = f->bytes;
    info->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
    info->computeInstanceId = 0xFFFFFFFFu;
}

GW_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_v2_t *infos) {
    NV_ENTER(nvmlDeviceGetComputeRunningProcesses_v2, (device, infoCount, infos));
    struct found f[GW_MAX_SLOTS];
    nvmlReturn_t r;
    if (own_processes(device, infoCount, infos, f, &r) < 0)
        return gw_be.nvmlDeviceGetComputeRunningProcesses_v2(device, infoCount, infos);
    for (unsigned i = 0; r == NVML_SUCCESS && i < *infoCount; i++) fill_v2(&infos[i], &f[i]);
    return r;
}

GW_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos) {
    NV_ENTER(nvmlDeviceGetComputeRunningProcesses_v3, (device, infoCount, infos));
    struct found f[GW_MAX_SLOTS];
    nvmlReturn_t r;
    if (own_processes(device, infoCount, infos, f, &r) < 0)
        return gw_be.nvmlDeviceGetComputeRunningProcesses_v3(device, infoCount, infos);
    for (unsigned i = 0; r == NVML_SUCCESS && i < *infoCount; i++) fill_v2(&infos[i], &f[i]);
    return r;
}
