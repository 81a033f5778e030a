/* The one list of functions libgpuwarden.so hooks, as X-macros:
 * X(return type, name, parameter list). From it come the backend table the
 * hooks call (struct gw_backend), the exported hook prototypes, and the table
 * that dlsym and cuGetProcAddress use to substitute a hook for the driver's
 * function. Every name listed must have a hook (the link fails otherwise);
 * a function not listed passes straight through to the driver. */
#ifndef GW_HOOKS_H
#define GW_HOOKS_H

#include "cuda.h"
#include "nvml.h"

#define GW_CUDA_HOOKS(X)                                                                           \
    X(CUresult, cuInit, (unsigned int Flags))                                                      \
    X(CUresult, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev))                               \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev))                    \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev))                        \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                      \
    X(CUresult, cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev))              \
    X(CUresult, cuCtxCreate_v3,                                                                    \
      (CUcontext * pctx, CUexecAffinityParam * paramsArray, int numParams, unsigned int flags,     \
       CUdevice dev))                                                                              \
    X(CUresult, cuCtxCreate_v4,                                                                    \
      (CUcontext * pctx, CUctxCreateParams * ctxCreateParams, unsigned int flags, CUdevice dev))   \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx))                                                  \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx))                                                  \
    X(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx))                                              \
    X(CUresult, cuCtxPopCurrent_v2, (CUcontext * pctx))                                            \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))                              \
    X(CUresult, cuMemAllocPitch_v2,                                                                \
      (CUdeviceptr * dptr, size_t * pPitch, size_t WidthInBytes, size_t Height,                    \
       unsigned int ElementSizeBytes))                                                             \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags))      \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr))                                                  \
    X(CUresult, cuMemGetInfo_v2, (size_t * free, size_t * total))                                 \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))          \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))     \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))                              \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream))                         \
    X(CUresult, cuMemAllocFromPoolAsync,                                                           \
      (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))                  \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz,                                                      \
      (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))                  \
    X(CUresult, cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps *poolProps))          \
    X(CUresult, cuMemPoolDestroy, (CUmemoryPool pool))                                             \
    X(CUresult, cuMemCreate,                                                                       \
      (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,        \
       unsigned long long flags))                                                                  \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle))                               \
    X(CUresult, cuMemMap,                                                                          \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,           \
       unsigned long long flags))                                                                  \
    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size))                                        \
    X(CUresult, cuCtxSynchronize, (void))                                                          \
    X(CUresult, cuStreamSynchronize, (CUstream hStream))                                           \
    X(CUresult, cuStreamSynchronize_ptsz, (CUstream hStream))                                      \
    X(CUresult, cuEventSynchronize, (CUevent hEvent))                                              \
    X(CUresult, cuLaunchKernel, GW_LAUNCH_PARAMS)                                                  \
    X(CUresult, cuLaunchKernel_ptsz, GW_LAUNCH_PARAMS)                                             \
    X(CUresult, cuLaunchKernelEx,                                                                  \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))            \
    X(CUresult, cuLaunchKernelEx_ptsz,                                                             \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))            \
    X(CUresult, cuLaunchCooperativeKernel, GW_COOP_PARAMS)                                         \
    X(CUresult, cuLaunchCooperativeKernel_ptsz, GW_COOP_PARAMS)                                    \
    X(CUresult, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))                         \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))                    \
    X(CUresult, cuGetProcAddress,                                                                  \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))                         \
    X(CUresult, cuGetProcAddress_v2,                                                               \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                          \
       CUdriverProcAddressQueryResult *symbolStatus))

#define GW_LAUNCH_PARAMS                                                                           \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,            \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                       \
     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
#define GW_COOP_PARAMS                                                                             \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,            \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                       \
     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)

/* Driver functions the hooks call but do not hook. */
#define GW_CUDA_USED(X)                                                                            \
    X(CUresult, cuCtxGetCurrent, (CUcontext * pctx))                                               \
    X(CUresult, cuCtxGetDevice, (CUdevice * device))                                               \
    X(CUresult, cuDeviceGetCount, (int *count))                                                    \
    X(CUresult, cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev))                                    \
    X(CUresult, cuEventCreate, (CUevent * phEvent, unsigned int Flags))                            \
    X(CUresult, cuEventRecord, (CUevent hEvent, CUstream hStream))                                 \
    X(CUresult, cuEventQuery, (CUevent hEvent))                                                    \
    X(CUresult, cuEventDestroy_v2, (CUevent hEvent))                                               \
    X(CUresult, cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus * captureStatus))

#define GW_NVML_HOOKS(X)                                                                           \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t * memory))         \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t * memory))   \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses,                                          \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos))                 \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v2,                                       \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos))                 \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v3,                                       \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))

#define GW_NVML_USED(X)                                                                            \
    X(nvmlReturn_t, nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int *index))                \
    X(nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length))

/* The backend: what the hooks call to reach a GPU. Today it is the local
 * driver, loaded from libcuda.so.1 and libnvidia-ml.so.1; a remote backend
 * would fill the same table with forwarding functions. */
struct gw_backend {
#define GW_BACKEND_FIELD(ret, name, params) ret(*name) params;
    GW_CUDA_HOOKS(GW_BACKEND_FIELD)
    GW_CUDA_USED(GW_BACKEND_FIELD)
    GW_NVML_HOOKS(GW_BACKEND_FIELD)
    GW_NVML_USED(GW_BACKEND_FIELD)
#undef GW_BACKEND_FIELD
};

#define GW_EXPORT __attribute__((visibility("default")))

#define GW_DECLARE_HOOK(ret, name, params) GW_EXPORT ret name params;
GW_CUDA_HOOKS(GW_DECLARE_HOOK)
GW_NVML_HOOKS(GW_DECLARE_HOOK)
#undef GW_DECLARE_HOOK

#endif
