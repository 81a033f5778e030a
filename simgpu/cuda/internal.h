/* simgpu's libcuda.so.1: what its files share. */
#ifndef SIMGPU_CUDA_INTERNAL_H
#define SIMGPU_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cuda.h"
#include "state.h"

#define SG_EXPORT __attribute__((visibility("default")))

/* Handles carry a magic so that a stale or foreign pointer is an error, not a crash. */
enum {
    SG_MAGIC_CTX = 0x43545831,
    SG_MAGIC_STREAM = 0x5354524d,
    SG_MAGIC_EVENT = 0x45564e54,
    SG_MAGIC_MODULE = 0x4d4f444c,
    SG_MAGIC_FUNC = 0x46554e43,
    SG_MAGIC_GRAPH = 0x47524150,
    SG_MAGIC_EXEC = 0x47455843,
    SG_MAGIC_POOL = 0x504f4f4c,
};

/* Work a stream runs in order. */
enum sg_op_kind { SG_OP_KERNEL, SG_OP_EVENT, SG_OP_FREE, SG_OP_RECORD };

#define SG_EVENT_DISABLE_TIMING 0x2

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    struct CUstream_st *stream; /* where it was last recorded */
    _Atomic uint64_t recorded;  /* records issued */
    _Atomic uint64_t completed; /* records that ran */
    _Atomic uint64_t at_ns;     /* CLOCK_MONOTONIC when the last record ran */
};

struct sg_op {
    enum sg_op_kind kind;
    uint64_t arg;          /* kernel duration ns, or the device pointer to free or write to */
    struct CUevent_st *event;
    void *bytes;           /* SG_OP_RECORD: the parameter buffer to write (owned) */
    size_t nbytes;
    uint64_t queued_ns;    /* CLOCK_MONOTONIC when it was queued */
};

#define SG_QUEUE_LEN 1024 /* a launch blocks when this many ops are queued, as on a GPU */

struct CUstream_st {
    uint32_t magic;
    struct CUctx_st *ctx;
    pthread_mutex_t mu;     /* among pushers; and for sleeping on cv */
    pthread_cond_t cv;      /* ops queued, ops done, or stopping */
    struct sg_op ops[SG_QUEUE_LEN];
    /* ops[head % LEN] .. ops[tail % LEN] are queued: tail is published by
     * pushers (under mu), head by the worker once an op has run (without
     * it). Each on a cache line of its own, beside what only its writer
     * reads, so that a launch and the op before it do not fight over one. */
    _Alignas(64) _Atomic uint64_t tail;
    uint64_t head_seen;     /* head as pushers last read it (under mu) */
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic int sleepers; /* threads asleep on cv, or about to be */
    _Alignas(64) uint64_t done_ns;     /* when its latest op ended, in device time (worker only) */
    int stopping;
    pthread_t worker;
    int worker_started;
    /* stream capture */
    int capturing;
    uint64_t *captured;     /* kernel durations */
    size_t ncaptured, capcap;
    struct CUstream_st *next; /* the context's streams */
};

struct CUctx_st {
    uint32_t magic;
    int dev;                /* the CUDA ordinal */
    int index;              /* the machine's device it is on (sg_dev_index) */
    int primary;
    _Atomic int refs;       /* primary contexts: retains */
    _Atomic unsigned flags; /* CU_CTX_*: a simulated device only keeps them */
    struct CUstream_st *null_stream;
    pthread_mutex_t mu;     /* guards streams */
    struct CUstream_st *streams;
};

/* A kernel as a module image describes it (see sg_module_parse). Images
 * without a description have kernels of one 8-byte parameter: their duration. */
#define SG_MAX_PARAMS 64
enum sg_kernel_kind { SG_KERNEL_SLEEP, SG_KERNEL_RECORD };
struct sg_kernel {
    char name[64];
    enum sg_kernel_kind kind;
    int nparams;
    uint16_t offset[SG_MAX_PARAMS], size[SG_MAX_PARAMS];
    size_t bytes; /* the packed parameter buffer's size */
};

struct CUfunc_st {
    uint32_t magic;
    char name[64];
    struct sg_kernel k;
    struct CUfunc_st *next;
};

struct CUmod_st {
    uint32_t magic;
    pthread_mutex_t mu;
    struct CUfunc_st *funcs; /* freed with the module */
    struct sg_kernel *kernels; /* described kernels, or NULL */
    int nkernels;
};

/* module.c: a described image's kernels; 0 if the image has no description,
 * -1 if it has a malformed one. */
int sg_module_parse(const char *image, struct sg_kernel **out, int *n);
void sg_kernel_default(struct sg_kernel *k, const char *name);

struct CUgraph_st {
    uint32_t magic;
    uint64_t *kernels; /* durations */
    size_t n;
};

struct CUgraphExec_st {
    uint32_t magic;
    uint64_t *kernels;
    size_t n;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    CUmemLocation location;
};

/* init.c */
struct sg_state *sg_ready(void); /* the machine if cuInit ran, else NULL */
extern int sg_initialized;

/* visible.c: CUDA ordinals are the devices CUDA_VISIBLE_DEVICES names, in
 * its order; sg_dev_index maps one to the machine's device index (what the
 * shared state and NVML use), or -1 for an ordinal no device has. */
int sg_visible_count(void);
int sg_dev_index(CUdevice ordinal);

/* context.c */
CUresult sg_current(struct CUctx_st **ctx); /* the calling thread's context */
int sg_ctx_valid(struct CUctx_st *c);

/* memory.c: every allocation this process holds, for frees and copies */
enum sg_alloc_kind { SG_ALLOC_LINEAR, SG_ALLOC_MANAGED, SG_ALLOC_ASYNC, SG_ALLOC_MAPPED };
struct sg_alloc_rec {
    CUdeviceptr base;
    void *raw;         /* the host block behind base */
    size_t bytes;
    struct CUctx_st *ctx;
    int index;         /* the machine's device */
    int charged;       /* bytes count against index */
    int free_pending;  /* a cuMemFreeAsync is queued */
    enum sg_alloc_kind kind;
    struct sg_alloc_rec *next;
};
/* The table of live allocations and mappings (memory.c). */
void sg_table_add(struct sg_alloc_rec *r);
struct sg_alloc_rec *sg_table_take(CUdeviceptr base); /* removes and returns it */
/* sg_alloc maps bytes of host memory standing in for device memory, charged
 * to the machine's device index unless charge is 0 (host-located pool memory). */
CUresult sg_alloc(struct CUctx_st *ctx, int index, size_t bytes, enum sg_alloc_kind kind, int charge,
                  CUdeviceptr *out);
CUresult sg_free(CUdeviceptr p, int queued); /* queued: the stream reached a cuMemFreeAsync */
void sg_free_ctx(struct CUctx_st *ctx); /* a destroyed context's memory goes with it */
void *sg_host_range(CUdeviceptr p, size_t n); /* host backing of [p, p+n), or NULL */

/* exec.c */
void sg_launch_model_init(void); /* the memory a modelled launch's pending stores go to */
CUresult sg_stream_resolve(CUstream h, struct CUstream_st **out);
CUresult sg_stream_push(struct CUstream_st *st, struct sg_op op);
CUresult sg_stream_sync(struct CUstream_st *st);
struct CUstream_st *sg_stream_new(struct CUctx_st *ctx);
void sg_stream_free(struct CUstream_st *st);

#endif
