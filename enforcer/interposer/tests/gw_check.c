/* gw-check: runs a script of CUDA/NVML steps given as arguments and prints
 * one line per step, so Go tests can drive every hook path and allocation
 * path of libgpuwarden.so through a real process on simgpu.
 *
 *   gw-check [--resolve direct|direct-ptsz|dlsym|dlsym225|procaddr|procaddr-ptsz|procaddr-v1] STEP...
 *
 * Steps: init, ctx D, release D, ctxcreate[3|4] D (cuCtxCreate_v2, _v3, _v4), ctxdestroy, alloc SIZE,
 * pitch W H, managed SIZE, async SIZE, pool-dev SIZE D, pool-host SIZE,
 * defpool SIZE, vmm SIZE D, vmm-host SIZE, vmm-release, vmm-unmap, free,
 * freeall, sync, meminfo, totalmem D, launch N, launchex N, coop N, graph N,
 * hold, fork, storm THREADS ITERS MAXSIZE linear|mixed, prethreads N SIZE,
 * prethreads-go, nvml, sleep MS, kernel NS (one kernel of NS nanoseconds on the stream, not waited for),
 * sigalloc SIZE MS (in MS milliseconds a SIGUSR1 reaches the main thread, whose handler
 * allocates SIZE), sigwait (waits for that handler; prints its result and the step it interrupted),
 * threads T N (T threads each make the current context theirs, launch N kernels and exit),
 * siglaunch N (the main thread launches while another sends it N signals, whose handler launches one
 * kernel on a stream of its own; prints main=<launches> handler=<launches>),
 * calls (prints getdevice=<cuCtxGetDevice calls simgpu counted>, with SIMGPU_COUNT_CALLS=1),
 * bypass D (makes device D's primary context current through the driver's own cuCtxSetCurrent,
 * found by libc's dlsym, which the interposer does not substitute: a path behind the hooks' back).
 * Each prints "<step> <CUDA result> [k=v...]".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "nvml.h"

#define FUNCS(X)                                                                                   \
    X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDevicePrimaryCtxRetain)                       \
    X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent) X(cuCtxCreate_v2) X(cuCtxDestroy_v2)        \
    X(cuCtxCreate_v3) X(cuCtxCreate_v4)                                                            \
    X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemFree_v2) X(cuMemGetInfo_v2) \
    X(cuDeviceTotalMem_v2) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemAllocFromPoolAsync)         \
    X(cuMemPoolCreate) X(cuDeviceGetDefaultMemPool) X(cuStreamCreate) X(cuStreamSynchronize)       \
    X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap)          \
    X(cuMemUnmap) X(cuMemSetAccess) X(cuModuleLoadData) X(cuModuleGetFunction) X(cuLaunchKernel)  \
    X(cuLaunchKernelEx) X(cuLaunchCooperativeKernel) X(cuGraphLaunch) X(cuStreamBeginCapture_v2)   \
    X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags) X(cuGetErrorName) X(cuCtxSynchronize)       \
    X(cuCtxGetCurrent)

static struct {
#define FIELD(name) __typeof__(&name) name;
    FUNCS(FIELD)
#undef FIELD
} cu;
static const char *const names[] = {
#define NAME(name) #name,
    FUNCS(NAME)
#undef NAME
};

static const char *ptsz_names[] = {"cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync", "cuLaunchKernel",
                                   "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"};

static int is_ptsz(const char *n) {
    for (size_t i = 0; i < sizeof ptsz_names / sizeof *ptsz_names; i++)
        if (!strcmp(n, ptsz_names[i])) return 1;
    return 0;
}

extern void *dlsym225(void *, const char *);
__asm__(".symver dlsym225, dlsym@GLIBC_2.2.5");

static void resolve(const char *how) {
    void **slots = (void **)&cu;
    size_t n = sizeof names / sizeof *names;
    if (!strcmp(how, "direct") || !strcmp(how, "direct-ptsz")) {
        void *self = dlopen(NULL, RTLD_NOW);
        for (size_t i = 0; i < n; i++) {
            char name[96];
            snprintf(name, sizeof name, "%s%s", names[i], !strcmp(how, "direct-ptsz") && is_ptsz(names[i]) ? "_ptsz" : "");
            slots[i] = dlsym(self, name); /* the global scope: what direct linking binds to */
        }
        /* and the link-time binding itself, for the common calls */
        if (!strcmp(how, "direct")) {
            cu.cuInit = cuInit;
            cu.cuMemAlloc_v2 = cuMemAlloc_v2;
            cu.cuMemFree_v2 = cuMemFree_v2;
            cu.cuLaunchKernel = cuLaunchKernel;
        }
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "gw-check: dlopen libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    if (!strcmp(how, "dlsym") || !strcmp(how, "dlsym225")) {
        for (size_t i = 0; i < n; i++) slots[i] = strcmp(how, "dlsym") ? dlsym225(lib, names[i]) : dlsym(lib, names[i]);
        return;
    }
    int v1 = !strcmp(how, "procaddr-v1"), ptsz = !strcmp(how, "procaddr-ptsz");
    __typeof__(&cuGetProcAddress_v2) gpa2 = dlsym(lib, "cuGetProcAddress_v2");
    __typeof__(&cuGetProcAddress) gpa1 = dlsym(lib, "cuGetProcAddress");
    for (size_t i = 0; i < n; i++) {
        char base[96];
        snprintf(base, sizeof base, "%s", names[i]);
        size_t k = strlen(base);
        if (k > 3 && base[k - 3] == '_' && base[k - 2] == 'v' && base[k - 1] >= '2' && base[k - 1] <= '4') base[k - 3] = 0;
        /* "cuCtxCreate" answers with the form of the version asked for */
        int version = !strcmp(names[i], "cuCtxCreate_v2") ? 11000 : !strcmp(names[i], "cuCtxCreate_v3") ? 12000 : CUDA_VERSION;
        cuuint64_t flags = ptsz && is_ptsz(names[i]) ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
        CUresult rc = v1 ? gpa1(base, &slots[i], version < 12000 ? version : 12000, flags)
                         : gpa2(base, &slots[i], version, flags, NULL);
        if (rc) {
            fprintf(stderr, "gw-check: cuGetProcAddress(%s): %d\n", base, (int)rc);
            exit(1);
        }
    }
}

static const char *rcname(CUresult rc) {
    const char *s = "?";
    if (cu.cuGetErrorName) cu.cuGetErrorName(rc, &s);
    return s;
}

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!strcmp(end, "Ki")) v <<= 10;
    else if (!strcmp(end, "Mi")) v <<= 20;
    else if (!strcmp(end, "Gi")) v <<= 30;
    return (size_t)v;
}

enum kind { LINEAR, ASYNC, VMM };
struct alloc {
    enum kind kind;
    CUdeviceptr p;
    size_t size;
    CUmemGenericAllocationHandle h;
    int released, mapped;
};
#define MAXA 4096
static struct alloc allocs[MAXA];
static int nalloc;
static CUstream stream;
static CUcontext created[16];
static int ncreated;
static CUfunction fn;

static void push(enum kind k, CUdeviceptr p, size_t size, CUmemGenericAllocationHandle h) {
    if (nalloc < MAXA) allocs[nalloc++] = (struct alloc){.kind = k, .p = p, .size = size, .h = h, .mapped = k == VMM && p};
}

static CUresult ensure_stream(void) {
    if (stream) return CUDA_SUCCESS;
    return cu.cuStreamCreate(&stream, 0);
}


/* vmm_make creates a handle at a location, reserves an address range and maps it. */
static CUresult vmm_make(size_t size, CUmemLocationType type, int dev, CUmemGenericAllocationHandle *h, CUdeviceptr *p) {
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {type, dev}};
    CUresult rc = cu.cuMemCreate(h, size, &prop, 0);
    if (rc) return rc;
    if ((rc = cu.cuMemAddressReserve(p, size, 0, 0, 0))) return rc;
    if ((rc = cu.cuMemMap(*p, size, 0, *h, 0))) return rc;
    CUmemAccessDesc d = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, dev < 0 ? 0 : dev}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return cu.cuMemSetAccess(*p, size, &d, 1);
}

static CUresult free_one(struct alloc *a, CUstream s) {
    switch (a->kind) {
    case LINEAR: return cu.cuMemFree_v2(a->p);
    case ASYNC: {
        CUresult rc = cu.cuMemFreeAsync(a->p, s);
        return rc ? rc : cu.cuStreamSynchronize(s);
    }
    case VMM: {
        CUresult rc = CUDA_SUCCESS;
        if (a->mapped) {
            rc = cu.cuMemUnmap(a->p, a->size);
            if (!rc) rc = cu.cuMemAddressFree(a->p, a->size);
        }
        if (!a->released && !rc) rc = cu.cuMemRelease(a->h);
        return rc;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult launch_n(const char *how, long n) {
    CUresult rc = ensure_stream();
    unsigned long long zero = 0;
    void *params[] = {&zero};
    CUgraphExec exec = NULL;
    if (!rc && !strcmp(how, "graph")) {
        CUgraph g;
        rc = cu.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (!rc) rc = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
        if (!rc) rc = cu.cuStreamEndCapture(stream, &g);
        if (!rc) rc = cu.cuGraphInstantiateWithFlags(&exec, g, 0);
    }
    CUlaunchConfig cfg = {1, 1, 1, 1, 1, 1, 0, stream, NULL, 0};
    for (long i = 0; i < n && !rc; i++) {
        if (!strcmp(how, "launch")) rc = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
        else if (!strcmp(how, "launchex")) rc = cu.cuLaunchKernelEx(&cfg, fn, params, NULL);
        else if (!strcmp(how, "coop")) rc = cu.cuLaunchCooperativeKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params);
        else rc = cu.cuGraphLaunch(exec, stream);
    }
    if (!rc) rc = cu.cuStreamSynchronize(stream);
    return rc;
}

/* ---- threads: launches from threads that exit ---- */
static CUcontext threads_ctx;
static long threads_n;

static void *launch_thread(void *arg) {
    (void)arg;
    CUresult rc = cu.cuCtxSetCurrent(threads_ctx);
    if (!rc) rc = launch_n("launch", threads_n);
    return (void *)(intptr_t)rc;
}

static CUresult threads(int t, long n) {
    pthread_t th[64];
    CUresult rc = cu.cuCtxGetCurrent(&threads_ctx);
    if (!rc) rc = ensure_stream();
    threads_n = n;
    int started = 0;
    for (; !rc && started < t && started < 64; started++)
        if (pthread_create(&th[started], NULL, launch_thread, NULL)) rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int k = 0; k < started; k++) {
        void *r;
        pthread_join(th[k], &r);
        if (!rc) rc = (CUresult)(intptr_t)r;
    }
    return rc;
}

/* ---- siglaunch: launches from a signal handler that interrupts launches ---- */
static CUstream siglaunch_stream;
static long siglaunch_n;
static volatile sig_atomic_t siglaunch_count, siglaunch_failed, siglaunch_stop;
static pthread_t siglaunch_main;

static void siglaunch_handler(int sig) {
    (void)sig;
    unsigned long long zero = 0;
    void *params[] = {&zero};
    if (cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, siglaunch_stream, params, NULL)) siglaunch_failed = 1;
    else siglaunch_count++;
}

static void *siglaunch_sender(void *arg) {
    (void)arg;
    for (long k = 0; k < siglaunch_n; k++) {
        pthread_kill(siglaunch_main, SIGUSR2);
        usleep(200);
    }
    siglaunch_stop = 1;
    return NULL;
}

static CUresult siglaunch(long n, char *extra, size_t len) {
    CUresult rc = ensure_stream();
    if (!rc) rc = cu.cuStreamCreate(&siglaunch_stream, 0);
    if (rc) return rc;
    struct sigaction sa = {.sa_handler = siglaunch_handler, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    siglaunch_n = n;
    siglaunch_main = pthread_self();
    pthread_t t;
    if (pthread_create(&t, NULL, siglaunch_sender, NULL)) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long zero = 0;
    void *params[] = {&zero};
    long launched = 0;
    while (!siglaunch_stop && !rc)
        if (!(rc = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL))) launched++;
    pthread_join(t, NULL);
    signal(SIGUSR2, SIG_IGN);
    if (!rc) rc = cu.cuStreamSynchronize(stream);
    if (!rc) rc = cu.cuStreamSynchronize(siglaunch_stream);
    if (!rc && siglaunch_failed) rc = CUDA_ERROR_UNKNOWN;
    snprintf(extra, len, " main=%ld handler=%d", launched, (int)siglaunch_count);
    return rc;
}

/* ---- storm: threads allocating and freeing random sizes ---- */
struct storm {
    int iters, mixed;
    size_t max;
    CUcontext ctx;
    long ok, oom, other;
    unsigned seed;
};

static void *storm_thread(void *arg) {
    struct storm *s = arg;
    cu.cuCtxSetCurrent(s->ctx);
    CUstream st;
    cu.cuStreamCreate(&st, 0);
    CUmemoryPool pool = NULL;
    CUmemPoolProps pp = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    if (s->mixed) cu.cuMemPoolCreate(&pool, &pp);
    struct alloc held[8];
    int nh = 0;
    for (int i = 0; i < s->iters; i++) {
        if (nh == 8 || (nh && rand_r(&s->seed) % 3 == 0)) {
            int k = (int)(rand_r(&s->seed) % (unsigned)nh);
            free_one(&held[k], st);
            held[k] = held[--nh];
            continue;
        }
        size_t size = 1 + (size_t)rand_r(&s->seed) % s->max;
        int how = s->mixed ? (int)(rand_r(&s->seed) % 5) : 0;
        struct alloc a = {.kind = LINEAR, .size = size};
        CUresult rc;
        switch (how) {
        case 0: rc = cu.cuMemAlloc_v2(&a.p, size); break;
        case 1: {
            size_t pitch;
            rc = cu.cuMemAllocPitch_v2(&a.p, &pitch, size / 7 + 1, 7, 4);
            break;
        }
        case 2: a.kind = ASYNC, rc = cu.cuMemAllocAsync(&a.p, size, st); break;
        case 3: a.kind = ASYNC, rc = cu.cuMemAllocFromPoolAsync(&a.p, size, pool, st); break;
        default:
            a.kind = VMM;
            a.size = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
            rc = vmm_make(a.size, CU_MEM_LOCATION_TYPE_DEVICE, 0, &a.h, &a.p);
            a.mapped = rc == CUDA_SUCCESS;
            if (rc && a.h && rc != CUDA_ERROR_OUT_OF_MEMORY) cu.cuMemRelease(a.h);
            break;
        }
        if (rc == CUDA_SUCCESS) s->ok++, held[nh++] = a;
        else if (rc == CUDA_ERROR_OUT_OF_MEMORY) s->oom++;
        else s->other++;
    }
    while (nh) free_one(&held[--nh], st);
    cu.cuStreamSynchronize(st);
    return NULL;
}

static void storm(int threads, int iters, size_t max, int mixed) {
    CUcontext ctx = NULL;
    /* the context itself may not fit while the other processes hold the quota */
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int tries = 0; tries < 5000 && rc == CUDA_ERROR_OUT_OF_MEMORY; tries++) {
        rc = cu.cuDevicePrimaryCtxRetain(&ctx, 0);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) usleep(1000);
    }
    if (rc) {
        printf("storm %s\n", rcname(rc));
        return;
    }
    struct storm s[64];
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) {
        s[i] = (struct storm){.iters = iters, .max = max, .mixed = mixed, .ctx = ctx, .seed = (unsigned)(getpid() * 131 + i)};
        pthread_create(&t[i], NULL, storm_thread, &s[i]);
    }
    long ok = 0, oom = 0, other = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        ok += s[i].ok, oom += s[i].oom, other += s[i].other;
    }
    printf("storm %s ok=%ld oom=%ld other=%ld\n", other ? "CUDA_ERROR_UNKNOWN" : "CUDA_SUCCESS", ok, oom, other);
}

/* ---- threads that exist before the library initialises ---- */
static pthread_mutex_t pre_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pre_cv = PTHREAD_COND_INITIALIZER;
static int pre_go, pre_n;
static size_t pre_size;
static pthread_t pre_t[16];
static CUresult pre_rc[16];

static void *pre_thread(void *arg) {
    long i = (long)arg;
    pthread_mutex_lock(&pre_mu);
    while (!pre_go) pthread_cond_wait(&pre_cv, &pre_mu);
    pthread_mutex_unlock(&pre_mu);
    CUcontext ctx;
    CUdeviceptr p;
    CUresult rc = cu.cuDevicePrimaryCtxRetain(&ctx, 0);
    if (!rc) rc = cu.cuCtxSetCurrent(ctx);
    if (!rc) rc = cu.cuMemAlloc_v2(&p, pre_size);
    pre_rc[i] = rc;
    return NULL;
}

/* ---- an allocation from a signal handler ---- */
static const char *volatile cur_step = "";
static pthread_t main_thread, sig_thread;
static size_t sig_size;
static long sig_delay_ms;
static volatile sig_atomic_t sig_done;
static CUresult sig_rc;
static const char *sig_step;

static void sig_handler(int sig) {
    (void)sig;
    CUdeviceptr p;
    sig_step = cur_step;
    sig_rc = cu.cuMemAlloc_v2(&p, sig_size);
    sig_done = 1;
}

static void *sig_sender(void *arg) {
    (void)arg;
    usleep((useconds_t)sig_delay_ms * 1000);
    pthread_kill(main_thread, SIGUSR1);
    return NULL;
}

/* ---- NVML ---- */
static void nvml_view(void) {
    nvmlReturn_t r = nvmlInit_v2();
    unsigned n = 0;
    if (!r) r = nvmlDeviceGetCount_v2(&n);
    if (r) {
        printf("nvml error=%d\n", (int)r);
        return;
    }
    for (unsigned d = 0; d < n; d++) {
        nvmlDevice_t dev;
        nvmlMemory_t m;
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        nvmlDeviceGetHandleByIndex_v2(d, &dev);
        nvmlReturn_t r1 = nvmlDeviceGetMemoryInfo(dev, &m), r2 = nvmlDeviceGetMemoryInfo_v2(dev, &m2);
        unsigned cnt = 0;
        nvmlReturn_t rs = nvmlDeviceGetComputeRunningProcesses_v3(dev, &cnt, NULL);
        nvmlProcessInfo_t infos[256];
        nvmlProcessInfo_v1_t infos1[256];
        unsigned c3 = 256, c1 = 256;
        nvmlReturn_t r3 = nvmlDeviceGetComputeRunningProcesses_v3(dev, &c3, infos);
        nvmlReturn_t r4 = nvmlDeviceGetComputeRunningProcesses(dev, &c1, infos1);
        printf("nvml dev=%u r=%d,%d,%d,%d,%d total=%llu free=%llu used=%llu total2=%llu free2=%llu used2=%llu count=%u procs=",
               d, r1, r2, rs, r3, r4, m.total, m.free, m.used, m2.total, m2.free, m2.used, cnt);
        for (unsigned i = 0; i < c3; i++) printf("%s%u:%llu", i ? "," : "", infos[i].pid, infos[i].usedGpuMemory);
        printf(" procs1=");
        for (unsigned i = 0; i < c1; i++) printf("%s%u:%llu", i ? "," : "", infos1[i].pid, infos1[i].usedGpuMemory);
        printf("\n");
    }
}

int main(int argc, char **argv) {
    int i = 1;
    const char *how = "direct";
    if (i + 1 < argc && !strcmp(argv[i], "--resolve")) how = argv[i + 1], i += 2;
    resolve(how);
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUmemoryPool host_pool = NULL, dev_pool[16] = {0};
    for (; i < argc; i++) {
        const char *s = argv[i];
        const char *a1 = i + 1 < argc ? argv[i + 1] : "0", *a2 = i + 2 < argc ? argv[i + 2] : "0";
        CUresult rc = CUDA_SUCCESS;
        char extra[256] = "";
        cur_step = s;
        if (!strcmp(s, "init")) {
            rc = cu.cuInit(0);
        } else if (!strcmp(s, "ctx")) {
            CUcontext c;
            rc = cu.cuDevicePrimaryCtxRetain(&c, atoi(a1));
            if (!rc) rc = cu.cuCtxSetCurrent(c);
            if (!rc && !fn) {
                CUmodule mod;
                rc = cu.cuModuleLoadData(&mod, "x");
                if (!rc) rc = cu.cuModuleGetFunction(&fn, mod, "k");
            }
            i++;
        } else if (!strcmp(s, "release")) {
            rc = cu.cuDevicePrimaryCtxRelease_v2(atoi(a1));
            i++;
        } else if (!strcmp(s, "ctxcreate") || !strcmp(s, "ctxcreate3") || !strcmp(s, "ctxcreate4")) {
            CUcontext c;
            char form = s[9];
            rc = form == '3'   ? cu.cuCtxCreate_v3(&c, NULL, 0, 0, atoi(a1))
                 : form == '4' ? cu.cuCtxCreate_v4(&c, NULL, 0, atoi(a1))
                               : cu.cuCtxCreate_v2(&c, 0, atoi(a1));
            if (!rc && ncreated < 16) created[ncreated++] = c;
            i++;
        } else if (!strcmp(s, "ctxdestroy")) {
            rc = ncreated ? cu.cuCtxDestroy_v2(created[--ncreated]) : CUDA_ERROR_INVALID_CONTEXT;
        } else if (!strcmp(s, "alloc") || !strcmp(s, "managed")) {
            CUdeviceptr p;
            size_t n = parse_size(a1);
            rc = s[0] == 'a' ? cu.cuMemAlloc_v2(&p, n) : cu.cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL);
            if (!rc) push(LINEAR, p, n, 0);
            i++;
        } else if (!strcmp(s, "pitch")) {
            CUdeviceptr p;
            size_t pitch = 0;
            rc = cu.cuMemAllocPitch_v2(&p, &pitch, parse_size(a1), parse_size(a2), 4);
            if (!rc) push(LINEAR, p, pitch * parse_size(a2), 0);
            snprintf(extra, sizeof extra, " pitch=%zu", pitch);
            i += 2;
        } else if (!strcmp(s, "async") || !strcmp(s, "pool-dev") || !strcmp(s, "pool-host") || !strcmp(s, "defpool")) {
            CUdeviceptr p;
            size_t n = parse_size(a1);
            rc = ensure_stream();
            CUmemoryPool pool = NULL;
            if (!rc && !strcmp(s, "pool-dev")) {
                int d = atoi(a2);
                CUmemPoolProps pp = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, d}};
                if (!dev_pool[d]) rc = cu.cuMemPoolCreate(&dev_pool[d], &pp);
                pool = dev_pool[d];
                i++;
            } else if (!rc && !strcmp(s, "pool-host")) {
                CUmemPoolProps pp = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}};
                if (!host_pool) rc = cu.cuMemPoolCreate(&host_pool, &pp);
                pool = host_pool;
            } else if (!rc && !strcmp(s, "defpool")) {
                rc = cu.cuDeviceGetDefaultMemPool(&pool, 0);
            }
            if (!rc) rc = pool ? cu.cuMemAllocFromPoolAsync(&p, n, pool, stream) : cu.cuMemAllocAsync(&p, n, stream);
            if (!rc) push(ASYNC, p, n, 0);
            i++;
        } else if (!strcmp(s, "vmm") || !strcmp(s, "vmm-host")) {
            CUmemGenericAllocationHandle h = 0;
            CUdeviceptr p = 0;
            size_t n = parse_size(a1);
            int host = !strcmp(s, "vmm-host");
            rc = vmm_make(n, host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE, host ? 0 : atoi(a2), &h, &p);
            if (!rc) push(VMM, p, n, h);
            i += host ? 1 : 2;
        } else if (!strcmp(s, "vmm-release") || !strcmp(s, "vmm-unmap")) {
            rc = CUDA_ERROR_INVALID_VALUE;
            for (int k = nalloc - 1; k >= 0; k--) {
                struct alloc *a = &allocs[k];
                if (a->kind != VMM) continue;
                if (s[4] == 'r' && !a->released) {
                    rc = cu.cuMemRelease(a->h);
                    a->released = 1;
                } else if (s[4] == 'u' && a->mapped) {
                    rc = cu.cuMemUnmap(a->p, a->size);
                    if (!rc) rc = cu.cuMemAddressFree(a->p, a->size);
                    a->mapped = 0;
                } else {
                    continue;
                }
                if (a->released && !a->mapped) allocs[k] = allocs[--nalloc];
                break;
            }
        } else if (!strcmp(s, "free")) {
            rc = nalloc ? free_one(&allocs[--nalloc], stream) : CUDA_ERROR_INVALID_VALUE;
        } else if (!strcmp(s, "freeall")) {
            while (nalloc && !rc) rc = free_one(&allocs[--nalloc], stream);
        } else if (!strcmp(s, "sync")) {
            rc = cu.cuCtxSynchronize();
        } else if (!strcmp(s, "meminfo")) {
            size_t f = 0, t = 0;
            rc = cu.cuMemGetInfo_v2(&f, &t);
            snprintf(extra, sizeof extra, " free=%zu total=%zu", f, t);
        } else if (!strcmp(s, "totalmem")) {
            size_t t = 0;
            rc = cu.cuDeviceTotalMem_v2(&t, atoi(a1));
            snprintf(extra, sizeof extra, " total=%zu", t);
            i++;
        } else if (!strcmp(s, "launch") || !strcmp(s, "launchex") || !strcmp(s, "coop") || !strcmp(s, "graph")) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            rc = launch_n(s, atol(a1));
            clock_gettime(CLOCK_MONOTONIC, &t1);
            snprintf(extra, sizeof extra, " ms=%ld", (long)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000));
            i++;
        } else if (!strcmp(s, "hold")) {
            printf("ready pid=%d\n", (int)getpid());
            char line[64];
            if (!fgets(line, sizeof line, stdin)) return 0;
        } else if (!strcmp(s, "fork")) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                printf("fork child pid=%d\n", (int)getpid());
                continue; /* the child runs the rest */
            }
            int st = 0;
            waitpid(pid, &st, 0);
            printf("fork parent child_exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            return 0;
        } else if (!strcmp(s, "storm")) {
            storm(atoi(a1), atoi(a2), parse_size(argv[i + 3]), !strcmp(argv[i + 4], "mixed"));
            i += 4;
            continue;
        } else if (!strcmp(s, "prethreads")) {
            pre_n = atoi(a1);
            pre_size = parse_size(a2);
            for (long k = 0; k < pre_n && k < 16; k++) pthread_create(&pre_t[k], NULL, pre_thread, (void *)k);
            i += 2;
        } else if (!strcmp(s, "prethreads-go")) {
            pthread_mutex_lock(&pre_mu);
            pre_go = 1;
            pthread_cond_broadcast(&pre_cv);
            pthread_mutex_unlock(&pre_mu);
            int ok = 0, oom = 0;
            for (int k = 0; k < pre_n && k < 16; k++) {
                pthread_join(pre_t[k], NULL);
                ok += pre_rc[k] == CUDA_SUCCESS;
                oom += pre_rc[k] == CUDA_ERROR_OUT_OF_MEMORY;
            }
            snprintf(extra, sizeof extra, " ok=%d oom=%d", ok, oom);
        } else if (!strcmp(s, "nvml")) {
            nvml_view();
            continue;
        } else if (!strcmp(s, "kernel")) {
            unsigned long long ns = strtoull(a1, NULL, 10);
            void *params[] = {&ns};
            rc = ensure_stream();
            if (!rc) rc = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
            i++;
        } else if (!strcmp(s, "sigalloc")) {
            struct sigaction sa = {.sa_handler = sig_handler, .sa_flags = SA_RESTART};
            sigemptyset(&sa.sa_mask);
            sigaction(SIGUSR1, &sa, NULL);
            sig_size = parse_size(a1);
            sig_delay_ms = atol(a2);
            main_thread = pthread_self();
            if (pthread_create(&sig_thread, NULL, sig_sender, NULL)) rc = CUDA_ERROR_OUT_OF_MEMORY;
            i += 2;
        } else if (!strcmp(s, "sigwait")) {
            pthread_join(sig_thread, NULL);
            for (int k = 0; k < 10000 && !sig_done; k++) usleep(1000);
            rc = sig_done ? sig_rc : CUDA_ERROR_NOT_READY;
            snprintf(extra, sizeof extra, " step=%s", sig_done ? sig_step : "none");
        } else if (!strcmp(s, "threads")) {
            rc = threads(atoi(a1), atol(a2));
            i += 2;
        } else if (!strcmp(s, "siglaunch")) {
            rc = siglaunch(atol(a1), extra, sizeof extra);
            i++;
        } else if (!strcmp(s, "calls")) {
            unsigned long long (*calls)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "simgpu_ctx_get_device_calls");
            if (!calls) rc = CUDA_ERROR_NOT_FOUND;
            snprintf(extra, sizeof extra, " getdevice=%llu", calls ? calls() : 0);
        } else if (!strcmp(s, "bypass")) {
            void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
            void *(*libc_dlsym)(void *, const char *) = libc ? (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
            if (libc && !libc_dlsym) libc_dlsym = (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.2.5");
            CUresult (*set)(CUcontext) = h && libc_dlsym ? (CUresult(*)(CUcontext))libc_dlsym(h, "cuCtxSetCurrent") : NULL;
            CUcontext c;
            rc = set ? cu.cuDevicePrimaryCtxRetain(&c, atoi(a1)) : CUDA_ERROR_NOT_FOUND;
            if (!rc) rc = set(c);
            i++;
        } else if (!strcmp(s, "sleep")) {
            usleep((useconds_t)atoi(a1) * 1000);
            i++;
        } else {
            fprintf(stderr, "gw-check: unknown step %s\n", s);
            return 2;
        }
        printf("%s %s%s\n", s, rcname(rc), extra);
    }
    return 0;
}
