/* Device memory and utilization, read from the shared machine state. */
#include <stdatomic.h>

#include "internal.h"

/* used and free of device i, after giving back what dead processes held, so
 * that a SIGKILLed process's memory disappears as it does on a real GPU. */
static void device_memory(struct sg_state *s, unsigned int i, unsigned long long *used,
                          unsigned long long *free_bytes) {
    sg_reap_dead(s);
    struct sg_device *d = &s->dev[i];
    unsigned long long u = atomic_load(&d->used_mem);
    if (u > d->total_mem) u = d->total_mem; /* never report negative free memory */
    *used = u;
    *free_bytes = d->total_mem - u;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = s->dev[i].total_mem;
    device_memory(s, i, &memory->used, &memory->free); /* v1 used = reserved + allocated */
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = s->dev[i].total_mem;
    memory->reserved = 0; /* simgpu's driver sets nothing aside */
    device_memory(s, i, &memory->used, &memory->free);
    return NVML_SUCCESS;
}

/* gpu: share of the last second a kernel ran. simgpu does not model memory
 * traffic; memory is reported as half of gpu, so that it moves with the load
 * the way it does for typical compute kernels. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                       nvmlUtilization_t *utilization) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int gpu = sg_busy_percent(&s->dev[i].busy, 0, NULL);
    utilization->gpu = gpu;
    utilization->memory = gpu / 2;
    return NVML_SUCCESS;
}
