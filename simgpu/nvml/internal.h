/* Shared by simgpu's NVML sources; not installed, not part of the API. */
#ifndef SIMGPU_NVML_INTERNAL_H
#define SIMGPU_NVML_INTERNAL_H

#include "nvml.h"
#include "state.h"

/* The library is built with -fvisibility=hidden, so that the simgpu state
 * functions linked into it stay private; only NVML entry points are exported. */
#define NVML_EXPORT __attribute__((visibility("default")))

/* What the simulated driver stack claims to be: CUDA 12.8, driver branch 570. */
#define SG_NVML_DRIVER_VERSION "570.124.06"
#define SG_NVML_VERSION "12.570.124.06"
#define SG_NVML_CUDA_VERSION 12080

/* A device handle points at one of these, in a static per-process array; the
 * magic tells a handle we gave out from a stray pointer. */
#define SG_NVML_HANDLE_MAGIC 0x4e564d4cu /* "NVML" */
struct nvmlDevice_st {
    unsigned int magic;
    unsigned int index;
};

/* nvml_state returns the mapped machine while the library is initialized
 * (nvmlInit* called more often than nvmlShutdown), else NULL. */
struct sg_state *nvml_state(void);

/* nvml_device resolves a handle: NVML_ERROR_UNINITIALIZED before init,
 * NVML_ERROR_INVALID_ARGUMENT for anything we did not hand out. */
nvmlReturn_t nvml_device(nvmlDevice_t handle, struct sg_state **s, unsigned int *index);

/* nvml_handle returns the handle of device index (index < ndev). */
nvmlDevice_t nvml_handle(unsigned int index);

/* nvml_copy_string copies src into dst of length bytes, NUL included, or
 * returns NVML_ERROR_INSUFFICIENT_SIZE (NULL dst: NVML_ERROR_INVALID_ARGUMENT). */
nvmlReturn_t nvml_copy_string(char *dst, unsigned int length, const char *src);

#endif
