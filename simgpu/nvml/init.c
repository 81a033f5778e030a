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
    /* The model is read at every first init, so that one process can read
     * machines of either model in turn (the bench does). */
    if (!atomic_load(&g_state) || (!atomic_load(&g_refs) && sg_model_load() < 0))
        ret = NVML_ERROR_DRIVER_NOT_LOADED; /* as NVIDIA's without a driver; said why on stderr */
    else
        atomic_fetch_add(&g_refs, 1);
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

/* Error texts: the table shared with the remote client. */
#include "nvml_errors.h"

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
