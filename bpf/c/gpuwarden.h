/* gpuwarden.h: the structs and constants the eBPF programs and the Go loader
 * share (bpf2go -type turns each struct into a Go type). Keep every struct
 * free of implicit padding: the Go side reads and writes the same bytes.
 */
#ifndef GPUWARDEN_BPF_H
#define GPUWARDEN_BPF_H

#define GW_DEVICE_UNKNOWN 0xffffffffu /* no context of the thread or process is known */
#define GW_MAX_CTX_STACK 8            /* per-thread context stack depth tracked */
#define GW_CHANGED_MAX 65536          /* processes the scan is told about between two scans */

/* Which driver entry point an event or a pending call belongs to. */
enum gw_api {
    GW_API_MEM_ALLOC = 1,     /* cuMemAlloc_v2 */
    GW_API_MEM_ALLOC_PITCH,   /* cuMemAllocPitch_v2 */
    GW_API_MEM_ALLOC_MANAGED, /* cuMemAllocManaged */
    GW_API_MEM_ALLOC_ASYNC,   /* cuMemAllocAsync(_ptsz) */
    GW_API_MEM_ALLOC_POOL,    /* cuMemAllocFromPoolAsync(_ptsz) */
    GW_API_MEM_CREATE,        /* cuMemCreate */
};

/* Counters in the stats map (a per-CPU array), indexed by these. */
enum gw_stat {
    GW_STAT_EVENTS = 0,         /* probe hits of every kind */
    GW_STAT_LOST_EVENTS,        /* failed-allocation events dropped: ring buffer full */
    GW_STAT_UNTRACKED_FREES,    /* successful frees of pointers the table did not know */
    GW_STAT_TABLE_FULL,         /* allocations not recorded: a table was full */
    GW_STAT_UNKNOWN_DEVICE,     /* allocations charged to GW_DEVICE_UNKNOWN */
    GW_STAT_EXITS,              /* exits of processes that had allocation state */
    GW_STAT_MAX,
};

/* usage map: per (cgroup, device). */
struct usage_key {
    __u64 cgroup; /* cgroup v2 id of the allocating task */
    __u32 device; /* CUDA device ordinal, or GW_DEVICE_UNKNOWN */
    __u32 pad;
};

struct usage_val {
    __s64 bytes;            /* bytes currently allocated (signed: frees may race allocs) */
    __u64 allocs;           /* successful allocations */
    __u64 frees;            /* successful frees of tracked allocations (exits excluded) */
    __u64 alloc_failures;   /* allocations the driver refused */
    __u64 ctx_created;      /* contexts created (primary: first retain) */
    __u64 ctx_destroyed;    /* contexts destroyed, released for the last time, or gone with their process */
    __u64 exit_freed_bytes; /* bytes dropped because the owning process exited */
};

/* allocs map: a pointer or handle of one process -> what it holds. */
struct alloc_key {
    __u32 tgid;
    __u32 handle; /* 1: a cuMemCreate handle, 0: a device pointer */
    __u64 ptr;    /* device pointer or generic allocation handle */
};

struct alloc_val {
    __u64 bytes;  /* size charged */
    __u64 cgroup; /* owner cgroup id */
    __u64 seq;    /* the owner process's generation (procs map) */
    __u64 ctx;    /* the caller's current context (0: unknown); its destruction frees it */
    __u32 device;
    __u32 api;    /* enum gw_api */
};

/* proc_bytes map: per (process, device, owner cgroup), so an exit can give them back. */
struct proc_key {
    __u32 tgid;
    __u32 device;
    __u64 cgroup;
};

/* procs map: a process with allocation or context state. */
struct proc_val {
    __u64 seq;         /* generation: distinguishes a reused pid */
    __u32 last_device; /* device of the context it last made current, or GW_DEVICE_UNKNOWN */
    __u32 pad;
};

/* ctxs map: a context of one process. */
struct ctx_key {
    __u32 tgid;
    __u32 pad;
    __u64 ctx; /* CUcontext */
};

struct ctx_val {
    __u64 cgroup; /* cgroup that created it */
    __u32 device;
    __u32 refs;    /* primary contexts: retains not yet released */
    __u32 primary;
    __u32 pad;
};

/* primaries map: (process, device) -> its primary context. */
struct prim_key {
    __u32 tgid;
    __u32 device;
};

/* threads map: a thread's context stack. */
struct thread_val {
    __u64 stack[GW_MAX_CTX_STACK];
    __u32 depth; /* may exceed GW_MAX_CTX_STACK; entries past it are not known */
    __u32 pad;
};

/* pools map: a memory pool of one process and where it allocates. */
struct pool_val {
    __u32 device;  /* location id when charged */
    __u32 charged; /* 1: device memory, 0: host memory (not charged) */
};

/* pending map: arguments of a call in flight, from its entry to its return. */
struct pending_call {
    __u64 out;     /* user address of the out-parameter (pointer, handle, context, pool) */
    __u64 bytes;   /* requested size; for pitch: the height */
    __u64 aux;     /* pitch: user address of *pPitch; frees: the pointer or handle */
    __u64 ctx;     /* the caller's current context at entry (0: unknown) */
    __u32 api;     /* enum gw_api, or enum gw_call */
    __u32 device;  /* device resolved at entry */
    __u32 charged; /* 1: counts as device memory */
    __u32 held;    /* frees: 1 when the table entry was taken out at entry */
    struct alloc_key key;  /* frees: the entry taken out */
    struct alloc_val val;
};

/* Calls other than allocations that keep state from entry to return. */
enum gw_call {
    GW_CALL_FREE = 100,       /* cuMemFree_v2, cuMemFreeAsync(_ptsz), cuMemRelease */
    GW_CALL_CTX_RETAIN,       /* cuDevicePrimaryCtxRetain */
    GW_CALL_CTX_RELEASE,      /* cuDevicePrimaryCtxRelease_v2 */
    GW_CALL_CTX_CREATE,       /* cuCtxCreate_v2 */
    GW_CALL_CTX_DESTROY,      /* cuCtxDestroy_v2 */
    GW_CALL_POOL,             /* cuDeviceGetDefaultMemPool, cuMemPoolCreate */
};

/* launches map: kernel launches seen while the launch probes were attached. */
struct launch_val {
    __u64 count;
};

/* The failed-allocation event, sent through the events ring buffer. */
struct alloc_fail_event {
    __u64 ts_ns;  /* bpf_ktime_get_ns at the failure */
    __u64 cgroup; /* cgroup v2 id */
    __u64 bytes;  /* requested size */
    __u32 tgid;
    __u32 tid;
    __u32 device; /* device asked for, or GW_DEVICE_UNKNOWN */
    __u32 result; /* CUresult: 2 is CUDA_ERROR_OUT_OF_MEMORY */
    __u32 api;    /* enum gw_api */
    __u32 pad;
    char comm[16];
};

#endif
