/* Initialization (reference counted, as NVIDIA's), error strings, versions. */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "internal.h"

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned int g_refs;     /* nvmlInit* calls not yet matched by nvmlShutdown */
static struct sg_state *_Atomic g_state; /* set before the first g_refs increment */

struct sg_state *nvml_state(void) {
    return atomic_load(&g_refs) ? atomic_load(&g_state) : NULL;
}

/* Every init flavour maps the shared machine once per process. NVML never
 * claims a process slot: a monitor such as nvidia-smi is not a GPU user. */
static nvmlReturn_t init(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_mu);
    if (!atomic_load(&g_state)) {
        struct sg_state *s = sg_state_get(); /* explains a failure on stderr */
        if (s) atomic_store(&g_state, s);
    }
    if (atomic_load(&g_state))
        atomic_fetch_add(&g_refs, 1);
    else
        ret = NVML_ERROR_DRIVER_NOT_LOADED; /* as NVIDIA's without a driver */
    pthread_mutex_unlock(&g_init_mu);
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }

/* v1 skipped devices it had no permission to use; simgpu has no such devices. */
NVML_EXPORT nvmlReturn_t nvmlInit(void) { return init(); }

/* NO_GPUS and NO_ATTACH change nothing: simgpu always has devices, and
 * attaching to them costs nothing. */
NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init();
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_mu);
    if (atomic_load(&g_refs))
        atomic_fetch_sub(&g_refs, 1);
    else
        ret = NVML_ERROR_UNINITIALIZED;
    /* The mapping stays: state.c maps once per process, and another init may follow. */
    pthread_mutex_unlock(&g_init_mu);
    return ret;
}

/* The texts NVIDIA's library returns, so logs read the same with either. */
NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

nvmlReturn_t nvml_copy_string(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (n >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!nvml_state()) return NVML_ERROR_UNINITIALIZED;
    return nvml_copy_string(version, length, SG_NVML_DRIVER_VERSION);
}

/* The next three work before nvmlInit, as NVIDIA documents (no UNINITIALIZED). */
NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return nvml_copy_string(version, length, SG_NVML_VERSION);
}

static nvmlReturn_t cuda_version(int *out) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = SG_NVML_CUDA_VERSION;
    return NVML_SUCCESS;
}

/* Exported functions call static helpers, never each other, so that an
 * LD_PRELOAD hook on one entry point does not see calls made to another. */
NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    return cuda_version(cudaDriverVersion);
}

/* v2 asks libcuda's cuDriverGetVersion; simgpu's libcuda reports the same number. */
NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return cuda_version(cudaDriverVersion);
}
