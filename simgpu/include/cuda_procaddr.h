/* cuGetProcAddress for a library that implements the driver API itself:
 * simgpu's libcuda.so.1 and gpuwarden's remote client both answer with
 * their own functions, from this one table of the API's versioned names.
 * The CUDA runtime finds every driver function this way, asking for a base
 * name ("cuMemAlloc") and the CUDA version it was built for; the answer is
 * the newest variant not newer than that version ("cuMemAlloc_v2" since
 * 3.2), and the per-thread-default-stream variant when asked for it; any
 * other name is CUDA_ERROR_NOT_FOUND.
 *
 * Include it in one .c file of the library, after cuda.h, where every
 * function of the table is declared. */
#ifndef CUDA_PROCADDR_H
#define CUDA_PROCADDR_H

#include <string.h>

#include "cuda.h"

#define CUDA_PROCADDR_EXPORT __attribute__((visibility("default")))

struct entry {
    const char *name; /* base name, as asked for */
    int version;      /* first CUDA version this variant answers for */
    void *fn;         /* legacy default stream */
    void *ptsz;       /* per-thread default stream, where it differs */
};

#define E(name, version, fn) {name, version, (void *)fn, NULL}
#define P(name, version, fn) {name, version, (void *)fn, (void *)fn##_ptsz}

static const struct entry table[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, cuCtxCreate_v3),
    E("cuCtxCreate", 12050, cuCtxCreate_v4),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxGetFlags", 7000, cuCtxGetFlags),
    E("cuCtxSetFlags", 12010, cuCtxSetFlags),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    E("cuMemsetD8", 3020, cuMemsetD8_v2),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuFuncGetParamInfo", 12040, cuFuncGetParamInfo),
    E("cuLaunchKernel", 4000, cuLaunchKernel),
    P("cuLaunchKernel", 7000, cuLaunchKernel), /* per-thread forms date from CUDA 7.0 */
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    E("cuStreamSynchronize", 2000, cuStreamSynchronize),
    E("cuStreamQuery", 2000, cuStreamQuery),
    E("cuEventCreate", 2000, cuEventCreate),
    E("cuEventRecord", 2000, cuEventRecord),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    E("cuStreamEndCapture", 10000, cuStreamEndCapture),
    E("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphLaunch", 10000, cuGraphLaunch),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn || cudaVersion <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    const struct entry *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, symbol)) continue;
        known = 1;
        if (table[i].version <= cudaVersion && (!best || table[i].version > best->version)) best = &table[i];
    }
    *pfn = NULL;
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz ? best->ptsz : best->fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUDA_PROCADDR_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUDA_PROCADDR_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                                  CUdriverProcAddressQueryResult *symbolStatus) {
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

#endif
