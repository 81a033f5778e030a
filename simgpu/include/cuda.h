/* The part of NVIDIA's CUDA driver API (cuda.h, CUDA 12) that simgpu implements
 * and gpuwarden's interposer hooks: the same type names, enum values, struct
 * layouts and exported symbol names, so code built against this header runs
 * against NVIDIA's libcuda.so.1 unchanged.
 *
 * Unlike NVIDIA's header, this one has no `#define cuMemAlloc cuMemAlloc_v2`
 * style aliases: code names the exported, versioned symbol it means.
 */
#ifndef SIMGPU_CUDA_H
#define SIMGPU_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_VERSION 12080
#define CUDAAPI

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

typedef enum CUctx_flags_enum {
    CU_CTX_SCHED_AUTO = 0x00,
    CU_CTX_SCHED_SPIN = 0x01,
    CU_CTX_SCHED_YIELD = 0x02,
    CU_CTX_SCHED_BLOCKING_SYNC = 0x04,
    CU_CTX_SCHED_MASK = 0x07,
    CU_CTX_FLAGS_MASK = 0xff /* every flag a context may carry */
} CUctx_flags;

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT = 14,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
} CUdevice_attribute;

typedef enum CUmemAttach_flags_enum {
    CU_MEM_ATTACH_GLOBAL = 0x1,
    CU_MEM_ATTACH_HOST = 0x2,
    CU_MEM_ATTACH_SINGLE = 0x4
} CUmemAttach_flags;

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
} CUmemAllocationType;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
} CUmemAllocationHandleType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    CU_MEM_LOCATION_TYPE_HOST = 0x2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 0x3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 0x4
} CUmemLocationType;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
} CUmemAccess_flags;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef enum CUlaunchAttributeID_enum {
    CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
    CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY = 3,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT = 7,
    CU_LAUNCH_ATTRIBUTE_PRIORITY = 8,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP = 9,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN = 10,
    CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT = 12,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE = 13,
    CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 14
} CUlaunchAttributeID;

/* A subset of NVIDIA's members, all within the 64 bytes. Its pointer-holding
 * members make the union (and so CUlaunchAttribute) 8-byte aligned, as here. */
typedef union CUlaunchAttributeValue_union {
    char pad[64];
    int cooperative;
    struct {
        unsigned int x;
        unsigned int y;
        unsigned int z;
    } clusterDim;
    struct {
        CUevent event;
        int flags;
        int triggerAtBlockStart;
    } programmaticEvent;
    int priority;
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* Only passed through: simgpu has no execution affinity or CIG. */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;

typedef enum CUdriverProcAddress_flags_enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1
} CUdriverProcAddress_flags;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* The hooked and simulated entry points, as one list: X(return, name, params). */
#define SIMGPU_CUDA_API(X)                                                                         \
    X(CUresult, cuInit, (unsigned int Flags))                                                      \
    X(CUresult, cuDriverGetVersion, (int *driverVersion))                                          \
    X(CUresult, cuDeviceGet, (CUdevice * device, int ordinal))                                     \
    X(CUresult, cuDeviceGetCount, (int *count))                                                    \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev))                              \
    X(CUresult, cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev))                                    \
    X(CUresult, cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev))                                 \
    X(CUresult, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev))                               \
    X(CUresult, cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev))          \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev))                    \
    X(CUresult, cuGetErrorName, (CUresult error, const char **pStr))                               \
    X(CUresult, cuGetErrorString, (CUresult error, const char **pStr))                             \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev))                        \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                      \
    X(CUresult, cuDevicePrimaryCtxSetFlags_v2, (CUdevice dev, unsigned int flags))                 \
    X(CUresult, cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active))      \
    X(CUresult, cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev))              \
    X(CUresult, cuCtxCreate_v3,                                                                    \
      (CUcontext * pctx, CUexecAffinityParam * paramsArray, int numParams, unsigned int flags,     \
       CUdevice dev))                                                                              \
    X(CUresult, cuCtxCreate_v4,                                                                    \
      (CUcontext * pctx, CUctxCreateParams * ctxCreateParams, unsigned int flags, CUdevice dev))   \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx))                                                  \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx))                                                  \
    X(CUresult, cuCtxGetCurrent, (CUcontext * pctx))                                               \
    X(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx))                                              \
    X(CUresult, cuCtxPopCurrent_v2, (CUcontext * pctx))                                            \
    X(CUresult, cuCtxGetDevice, (CUdevice * device))                                               \
    X(CUresult, cuCtxGetFlags, (unsigned int *flags))                                              \
    X(CUresult, cuCtxSetFlags, (unsigned int flags))                                               \
    X(CUresult, cuCtxSynchronize, (void))                                                          \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))                              \
    X(CUresult, cuMemAllocPitch_v2,                                                                \
      (CUdeviceptr * dptr, size_t * pPitch, size_t WidthInBytes, size_t Height,                    \
       unsigned int ElementSizeBytes))                                                             \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags))      \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr))                                                  \
    X(CUresult, cuMemGetInfo_v2, (size_t * free, size_t * total))                                  \
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
    X(CUresult, cuMemGetAllocationGranularity,                                                     \
      (size_t * granularity, const CUmemAllocationProp *prop,                                      \
       CUmemAllocationGranularity_flags option))                                                   \
    X(CUresult, cuMemCreate,                                                                       \
      (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,        \
       unsigned long long flags))                                                                  \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle))                               \
    X(CUresult, cuMemAddressReserve,                                                               \
      (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,                         \
       unsigned long long flags))                                                                  \
    X(CUresult, cuMemAddressFree, (CUdeviceptr ptr, size_t size))                                  \
    X(CUresult, cuMemMap,                                                                          \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,           \
       unsigned long long flags))                                                                  \
    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size))                                        \
    X(CUresult, cuMemSetAccess,                                                                    \
      (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))                   \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))  \
    X(CUresult, cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))        \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N))               \
    X(CUresult, cuModuleLoadData, (CUmodule * module, const void *image))                          \
    X(CUresult, cuModuleGetFunction, (CUfunction * hfunc, CUmodule hmod, const char *name))       \
    X(CUresult, cuModuleUnload, (CUmodule hmod))                                                   \
    X(CUresult, cuLaunchKernel,                                                                    \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,          \
       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                     \
       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra))          \
    X(CUresult, cuLaunchKernel_ptsz,                                                               \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,          \
       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                     \
       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra))          \
    X(CUresult, cuLaunchKernelEx,                                                                  \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))            \
    X(CUresult, cuLaunchKernelEx_ptsz,                                                             \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))            \
    X(CUresult, cuLaunchCooperativeKernel,                                                         \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,          \
       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                     \
       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams))                        \
    X(CUresult, cuLaunchCooperativeKernel_ptsz,                                                    \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,          \
       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                     \
       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams))                        \
    X(CUresult, cuStreamCreate, (CUstream * phStream, unsigned int Flags))                         \
    X(CUresult, cuStreamDestroy_v2, (CUstream hStream))                                            \
    X(CUresult, cuStreamSynchronize, (CUstream hStream))                                           \
    X(CUresult, cuStreamQuery, (CUstream hStream))                                                 \
    X(CUresult, cuEventCreate, (CUevent * phEvent, unsigned int Flags))                            \
    X(CUresult, cuEventRecord, (CUevent hEvent, CUstream hStream))                                 \
    X(CUresult, cuEventQuery, (CUevent hEvent))                                                    \
    X(CUresult, cuEventSynchronize, (CUevent hEvent))                                              \
    X(CUresult, cuEventElapsedTime, (float *pMilliseconds, CUevent hStart, CUevent hEnd))         \
    X(CUresult, cuEventDestroy_v2, (CUevent hEvent))                                               \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode))             \
    X(CUresult, cuStreamEndCapture, (CUstream hStream, CUgraph * phGraph))                         \
    X(CUresult, cuGraphInstantiateWithFlags,                                                       \
      (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags))                       \
    X(CUresult, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))                         \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))                    \
    X(CUresult, cuGraphDestroy, (CUgraph hGraph))                                                  \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec hGraphExec))                                      \
    X(CUresult, cuGetProcAddress,                                                                  \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))                         \
    X(CUresult, cuGetProcAddress_v2,                                                               \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                          \
       CUdriverProcAddressQueryResult *symbolStatus))

#define SIMGPU_DECLARE(ret, name, params) ret CUDAAPI name params;
SIMGPU_CUDA_API(SIMGPU_DECLARE)
#undef SIMGPU_DECLARE

/* A kernel's parameter layout (CUDA 12.4). */
CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                    size_t *paramSize);

/* Whether a stream is capturing: exported for the interposer's completion
 * marks (found by dlsym), not in the list above that gpuwarden's remote
 * client serves. */
CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);

/* cuGraphInstantiate's CUDA 11 form, still exported for old callers. */
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize);

#ifdef __cplusplus
}
#endif
#endif
