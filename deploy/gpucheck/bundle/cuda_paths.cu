// cuda-paths: each allocation path of the CUDA runtime, cuMemCreate, and a
// CUDA graph's allocation node, asked for 7 GiB and then 2 GiB more. Run
// under an 8 GiB quota (the GPU check builds it with nvcc on the GPU
// machine); each path prints "path NAME FIRST SECOND", ok or the error name.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>

static const size_t GiB = 1ull << 30;

static const char *rt(cudaError_t e) {
    cudaGetLastError(); // an allocation failure is not sticky: clear it
    return e == cudaSuccess ? "ok" : cudaGetErrorName(e);
}

static const char *drv(CUresult e) {
    const char *s = "CUDA_ERROR_UNKNOWN";
    if (e == CUDA_SUCCESS) return "ok";
    cuGetErrorName(e, &s);
    return s;
}

static void report(const char *path, const char *first, const char *second) {
    printf("path %s %s %s\n", path, first, second);
    fflush(stdout);
}

__global__ void touch(char *p) {
    if (p) p[0] = 1;
}

// graphAlloc runs a graph that allocates bytes, touches them and frees them.
static const char *graphAlloc(cudaStream_t s, size_t bytes) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    void *p = NULL;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e) return rt(e);
    cudaError_t ea = cudaMallocAsync(&p, bytes, s);
    touch<<<1, 1, 0, s>>>((char *)p);
    if (!ea) cudaFreeAsync(p, s);
    e = cudaStreamEndCapture(s, &g);
    if (ea) return rt(ea);
    if (e) return rt(e);
    e = cudaGraphInstantiate(&x, g, 0);
    if (!e) e = cudaGraphLaunch(x, s);
    if (!e) e = cudaStreamSynchronize(s);
    cudaGraphDestroy(g);
    return rt(e);
}

int main(void) {
    size_t freeb = 0, total = 0;
    cudaStream_t s;
    cudaFree(0);
    const char *info = rt(cudaMemGetInfo(&freeb, &total)); // before the printf: argument order is unspecified
    printf("meminfo %s %zu %zu\n", info, freeb, total);
    cudaStreamCreate(&s);
    {
        void *a = NULL, *b = NULL;
        const char *f = rt(cudaMalloc(&a, 7 * GiB)), *g = rt(cudaMalloc(&b, 2 * GiB));
        report("cudaMalloc", f, g);
        cudaFree(a);
        cudaFree(b);
    }
    {
        void *a = NULL, *b = NULL;
        const char *f = rt(cudaMallocAsync(&a, 7 * GiB, s)), *g = rt(cudaMallocAsync(&b, 2 * GiB, s));
        if (a) cudaFreeAsync(a, s);
        if (b) cudaFreeAsync(b, s);
        cudaStreamSynchronize(s);
        report("cudaMallocAsync", f, g);
    }
    {
        cudaMemPoolProps props = {};
        cudaMemPool_t pool;
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        const char *c = rt(cudaMemPoolCreate(&pool, &props));
        if (c[0] != 'o') {
            report("cudaMallocFromPoolAsync", c, "-");
        } else {
            void *a = NULL, *b = NULL;
            const char *f = rt(cudaMallocFromPoolAsync(&a, 7 * GiB, pool, s));
            const char *g = rt(cudaMallocFromPoolAsync(&b, 2 * GiB, pool, s));
            if (a) cudaFreeAsync(a, s);
            if (b) cudaFreeAsync(b, s);
            cudaStreamSynchronize(s);
            cudaMemPoolDestroy(pool);
            report("cudaMallocFromPoolAsync", f, g);
        }
    }
    {
        void *a = NULL, *b = NULL;
        const char *f = rt(cudaMallocManaged(&a, 7 * GiB)), *g = rt(cudaMallocManaged(&b, 2 * GiB));
        report("cudaMallocManaged", f, g);
        cudaFree(a);
        cudaFree(b);
    }
    {
        CUmemAllocationProp prop = {};
        CUmemGenericAllocationHandle a = 0, b = 0;
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        const char *f = drv(cuMemCreate(&a, 7 * GiB, &prop, 0)), *g = drv(cuMemCreate(&b, 2 * GiB, &prop, 0));
        report("cuMemCreate", f, g);
        if (a) cuMemRelease(a);
        if (b) cuMemRelease(b);
    }
    {
        // The graph's node alone fits; beside 7 GiB held, it must not.
        const char *f = graphAlloc(s, 2 * GiB);
        void *held = NULL;
        const char *h = rt(cudaMalloc(&held, 7 * GiB));
        const char *g = h[0] == 'o' ? graphAlloc(s, 2 * GiB) : h;
        report("graphAllocNode", f, g);
        cudaFree(held);
    }
    return 0;
}
