/* Initialisation, devices and error names. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

int sg_initialized;
static struct sg_state *g_machine;

struct sg_state *sg_ready(void) {
    return __atomic_load_n(&sg_initialized, __ATOMIC_ACQUIRE) ? g_machine : NULL;
}

SG_EXPORT CUresult cuInit(unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    struct sg_state *s = sg_state_get();
    if (!s) return CUDA_ERROR_NO_DEVICE; /* sg_state_get said why on stderr */
    if (!sg_ready() && sg_model_load() < 0) return CUDA_ERROR_NO_DEVICE; /* said why on stderr */
    sg_launch_model_init();
    if (!sg_visible_count()) return CUDA_ERROR_NO_DEVICE;
    if (!sg_proc_self(s)) {
        fprintf(stderr, "simgpu: no free process slot (%d processes use the device)\n", SG_MAX_PROCS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_machine = s;
    __atomic_store_n(&sg_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION;
    return CUDA_SUCCESS;
}

/* device_of checks the machine and the ordinal every device call needs. */
static CUresult device_of(CUdevice dev, struct sg_device **out) {
    struct sg_state *s = sg_ready();
    if (!s) return CUDA_ERROR_NOT_INITIALIZED;
    int index = sg_dev_index(dev);
    if (index < 0) return CUDA_ERROR_INVALID_DEVICE;
    *out = &s->dev[index];
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    struct sg_state *s = sg_ready();
    if (!s) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (sg_dev_index(ordinal) < 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceGetCount(int *count) {
    struct sg_state *s = sg_ready();
    if (!s) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = sg_visible_count();
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    struct sg_device *d;
    CUresult rc = device_of(dev, &d);
    if (rc) return rc;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", d->name);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    struct sg_device *d;
    CUresult rc = device_of(dev, &d);
    if (rc) return rc;
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid->bytes, d->uuid_bytes, sizeof uuid->bytes);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

SG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    struct sg_device *d;
    CUresult rc = device_of(dev, &d);
    if (rc) return rc;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = d->total_mem;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    struct sg_device *d;
    CUresult rc = device_of(dev, &d);
    if (rc) return rc;
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    /* An H200's figures, since simgpu stands in for one. */
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *pi = 512; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = (int)d->pci_bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *pi = 6144; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Error names and texts: the table shared with the remote client. */
#include "cuda_errors.h"
