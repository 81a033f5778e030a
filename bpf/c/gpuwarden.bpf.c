// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* gpuwarden.bpf.c: what every process does with libcuda, per cgroup.
 *
 * Needs: uprobes and uretprobes on libcuda.so.1 (attached by the Go loader per
 * library file), a raw tracepoint on sched_process_exit/exec (no tracefs),
 * BPF ring buffers (5.8), bpf_for_each_map_elem (5.13); the raw tracepoint
 * mmap_lock_released (6.12, CONFIG_TRACING), where the kernel has it, tells
 * the libcuda scan which processes changed their mappings; uprobe-multi links
 * with a pid filter (6.6) count the launches of processes without a ledger
 * (elsewhere they are sampled like the others'). No CO-RE: the only
 * kernel struct read is struct pt_regs, from the UAPI <asm/ptrace.h>, so the
 * object needs no BTF from the running kernel. x86-64 only (register names).
 *
 * What it keeps (see bpf/README.md for how exact each figure is):
 *  - usage:    per (cgroup, device) bytes allocated, allocs, frees, failures, contexts
 *  - allocs:   pointer or handle of a process -> size, owner cgroup, device
 *  - launches: per (cgroup, device) launches while the sampling launch probes are attached
 *  - launches_exact: per (cgroup, device) launches of the processes no ledger counts
 *  - events:   failed allocations, through a ring buffer
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "gpuwarden.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define PINNED __uint(pinning, LIBBPF_PIN_BY_NAME)

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct usage_key);
    __type(value, struct usage_val);
    PINNED;
} usage SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct usage_key);
    __type(value, struct launch_val);
    PINNED;
} launches SEC(".maps");

/* Launches of the processes Go attaches launch_exact to (one uprobe-multi
 * link per process, filtered by pid, so no other process takes a trap), and
 * those processes (by tgid): the sampling program leaves their launches to
 * it. Not pinned: a new agent attaches anew and counts from its start. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct usage_key);
    __type(value, struct launch_val);
} launches_exact SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u8);
} exact_procs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 131072);
    __type(key, struct alloc_key);
    __type(value, struct alloc_val);
    PINNED;
} allocs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct proc_key);
    __type(value, __s64); /* bytes held */
    PINNED;
} proc_bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, __u32); /* tgid */
    __type(value, struct proc_val);
    PINNED;
} procs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct ctx_key);
    __type(value, struct ctx_val);
    PINNED;
} ctxs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct prim_key);
    __type(value, __u64); /* CUcontext */
    PINNED;
} primaries SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct ctx_key); /* tgid, pool handle */
    __type(value, struct pool_val);
    PINNED;
} pools SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32); /* tid */
    __type(value, struct thread_val);
    PINNED;
} threads SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, __u64); /* pid_tgid */
    __type(value, struct pending_call);
} pending SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, GW_STAT_MAX);
    __type(key, __u32);
    __type(value, __u64);
    PINNED;
} stats SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64); /* last process generation handed out */
    PINNED;
} generation SEC(".maps");

/* Processes that changed their mappings, exec'd or exited since the libcuda
 * scan last looked (by tgid): the scan reads only their maps, and new
 * processes'. Not pinned: a new agent reads every process once. Full, it is
 * ignored (every process is checked). */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, GW_CHANGED_MAX);
    __type(key, __u32);
    __type(value, __u8);
} changed SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* Force the event struct and enums into BTF so bpf2go can generate Go types. */
const struct alloc_fail_event *unused_alloc_fail_event __attribute__((unused));
const enum gw_stat *unused_gw_stat __attribute__((unused));
const enum gw_api *unused_gw_api __attribute__((unused));
const enum gw_call *unused_gw_call __attribute__((unused));

static __always_inline void stat_add(__u32 idx, __u64 n) {
    __u64 *v = bpf_map_lookup_elem(&stats, &idx);
    if (v) *v += n; /* per-CPU: no atomics needed */
}

static __always_inline struct usage_val *usage_of(__u64 cgroup, __u32 device) {
    struct usage_key k = {.cgroup = cgroup, .device = device};
    struct usage_val *v = bpf_map_lookup_elem(&usage, &k);
    if (v) return v;
    struct usage_val zero = {};
    bpf_map_update_elem(&usage, &k, &zero, BPF_NOEXIST);
    return bpf_map_lookup_elem(&usage, &k);
}

/* proc_touch makes sure the process has a procs entry and returns its generation. */
static __always_inline __u64 proc_touch(__u32 tgid) {
    struct proc_val *p = bpf_map_lookup_elem(&procs, &tgid);
    if (p) return p->seq;
    __u32 zero = 0;
    __u64 *g = bpf_map_lookup_elem(&generation, &zero);
    if (!g) return 0;
    struct proc_val nv = {.seq = __sync_fetch_and_add(g, 1) + 1, .last_device = GW_DEVICE_UNKNOWN};
    bpf_map_update_elem(&procs, &tgid, &nv, BPF_NOEXIST);
    p = bpf_map_lookup_elem(&procs, &tgid);
    return p ? p->seq : 0;
}

static __always_inline __u32 ctx_device(__u32 tgid, __u64 ctx) {
    struct ctx_key k = {.tgid = tgid, .ctx = ctx};
    struct ctx_val *c = bpf_map_lookup_elem(&ctxs, &k);
    return c ? c->device : GW_DEVICE_UNKNOWN;
}

/* current_device: the device of the calling thread's current context (and
 * that context in *ctx); else of the context the process last made current
 * (*ctx 0); else unknown. */
static __always_inline __u32 current_device(__u32 tgid, __u32 tid, __u64 *ctx) {
    *ctx = 0;
    struct thread_val *t = bpf_map_lookup_elem(&threads, &tid);
    if (t && t->depth > 0 && t->depth <= GW_MAX_CTX_STACK) {
        __u64 c = t->stack[(t->depth - 1) & (GW_MAX_CTX_STACK - 1)];
        __u32 dev = ctx_device(tgid, c);
        if (dev != GW_DEVICE_UNKNOWN) {
            *ctx = c;
            return dev;
        }
    }
    struct proc_val *p = bpf_map_lookup_elem(&procs, &tgid);
    return p ? p->last_device : GW_DEVICE_UNKNOWN;
}

static __always_inline void note_last_device(__u32 tgid, __u32 device) {
    if (device == GW_DEVICE_UNKNOWN) return;
    proc_touch(tgid);
    struct proc_val *p = bpf_map_lookup_elem(&procs, &tgid);
    if (p) p->last_device = device;
}

static __always_inline void proc_bytes_add(__u32 tgid, __u32 device, __u64 cgroup, __s64 n) {
    struct proc_key k = {.tgid = tgid, .device = device, .cgroup = cgroup};
    __s64 *v = bpf_map_lookup_elem(&proc_bytes, &k);
    if (!v) {
        __s64 zero = 0;
        bpf_map_update_elem(&proc_bytes, &k, &zero, BPF_NOEXIST);
        v = bpf_map_lookup_elem(&proc_bytes, &k);
        if (!v) return;
    }
    __sync_fetch_and_add(v, n);
}

/* charge adds (or with a negative n, gives back) bytes of an allocation. */
static __always_inline void charge(__u32 tgid, __u32 device, __u64 cgroup, __s64 n) {
    struct usage_val *u = usage_of(cgroup, device);
    if (u) __sync_fetch_and_add(&u->bytes, n);
    proc_bytes_add(tgid, device, cgroup, n);
}

static __always_inline void pend(struct pending_call *c) {
    __u64 id = bpf_get_current_pid_tgid();
    bpf_map_update_elem(&pending, &id, c, BPF_ANY);
}

/* take returns the pending call of this thread, removed from the map, in *out. */
static __always_inline int take(struct pending_call *out) {
    __u64 id = bpf_get_current_pid_tgid();
    struct pending_call *c = bpf_map_lookup_elem(&pending, &id);
    if (!c) return 0;
    __builtin_memcpy(out, c, sizeof *out);
    bpf_map_delete_elem(&pending, &id);
    return 1;
}

/* ---- allocations ---- */

static __always_inline int alloc_enter(__u32 api, void *out, __u64 bytes, __u64 aux) {
    __u64 id = bpf_get_current_pid_tgid();
    stat_add(GW_STAT_EVENTS, 1);
    struct pending_call c = {.out = (__u64)out, .bytes = bytes, .aux = aux, .api = api, .charged = 1};
    c.device = current_device(id >> 32, (__u32)id, &c.ctx);
    pend(&c);
    return 0;
}

static __always_inline void report_failure(struct pending_call *c, __u64 cgroup, __u32 rc) {
    __u64 id = bpf_get_current_pid_tgid();
    struct alloc_fail_event *e = bpf_ringbuf_reserve(&events, sizeof *e, 0);
    if (!e) {
        stat_add(GW_STAT_LOST_EVENTS, 1);
        return;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->cgroup = cgroup;
    e->bytes = c->bytes;
    e->tgid = id >> 32;
    e->tid = (__u32)id;
    e->device = c->device;
    e->result = rc;
    e->api = c->api;
    e->pad = 0;
    bpf_get_current_comm(e->comm, sizeof e->comm);
    bpf_ringbuf_submit(e, 0);
}

static __always_inline int alloc_return(struct pt_regs *ctx) {
    struct pending_call c;
    if (!take(&c) || c.api >= GW_CALL_FREE) return 0;
    __u32 rc = (__u32)PT_REGS_RC(ctx);
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    __u64 cgroup = bpf_get_current_cgroup_id();
    if (c.api == GW_API_MEM_ALLOC_PITCH && rc == 0) {
        __u64 pitch = 0;
        bpf_probe_read_user(&pitch, sizeof pitch, (void *)c.aux);
        c.bytes = pitch * c.bytes; /* pitch x height */
    }
    if (!c.charged) return 0; /* host memory: not the GPU's */
    struct usage_val *u = usage_of(cgroup, c.device);
    if (rc != 0) {
        if (u) __sync_fetch_and_add(&u->alloc_failures, 1);
        report_failure(&c, cgroup, rc);
        return 0;
    }
    struct alloc_key k = {.tgid = tgid, .handle = c.api == GW_API_MEM_CREATE};
    if (bpf_probe_read_user(&k.ptr, sizeof k.ptr, (void *)c.out) != 0) return 0;
    __u64 seq = proc_touch(tgid);
    /* An entry already there means its free was missed (e.g. while the agent
     * restarted): give its bytes back before reusing the key. */
    struct alloc_val *old = bpf_map_lookup_elem(&allocs, &k);
    if (old && old->seq == seq) charge(tgid, old->device, old->cgroup, -(__s64)old->bytes);
    struct alloc_val v = {.bytes = c.bytes, .cgroup = cgroup, .seq = seq, .device = c.device, .api = c.api,
                          .ctx = c.api == GW_API_MEM_CREATE ? 0 : c.ctx /* handles outlive contexts */};
    if (bpf_map_update_elem(&allocs, &k, &v, BPF_ANY) != 0) {
        stat_add(GW_STAT_TABLE_FULL, 1);
        return 0;
    }
    if (c.device == GW_DEVICE_UNKNOWN) stat_add(GW_STAT_UNKNOWN_DEVICE, 1);
    if (u) __sync_fetch_and_add(&u->allocs, 1);
    charge(tgid, c.device, cgroup, (__s64)c.bytes);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(mem_alloc, void *dptr, __u64 bytes) { return alloc_enter(GW_API_MEM_ALLOC, dptr, bytes, 0); }

SEC("uprobe")
int BPF_KPROBE(mem_alloc_pitch, void *dptr, void *ppitch, __u64 width, __u64 height) {
    return alloc_enter(GW_API_MEM_ALLOC_PITCH, dptr, height, (__u64)ppitch);
}

SEC("uprobe")
int BPF_KPROBE(mem_alloc_managed, void *dptr, __u64 bytes) {
    return alloc_enter(GW_API_MEM_ALLOC_MANAGED, dptr, bytes, 0);
}

SEC("uprobe")
int BPF_KPROBE(mem_alloc_async, void *dptr, __u64 bytes) {
    return alloc_enter(GW_API_MEM_ALLOC_ASYNC, dptr, bytes, 0);
}

/* cuMemAllocFromPoolAsync: the pool says where the memory lives. */
SEC("uprobe")
int BPF_KPROBE(mem_alloc_pool, void *dptr, __u64 bytes, __u64 pool) {
    alloc_enter(GW_API_MEM_ALLOC_POOL, dptr, bytes, pool);
    struct ctx_key k = {.tgid = bpf_get_current_pid_tgid() >> 32, .ctx = pool};
    struct pool_val *p = bpf_map_lookup_elem(&pools, &k);
    if (!p) return 0;
    __u64 id = bpf_get_current_pid_tgid();
    struct pending_call *c = bpf_map_lookup_elem(&pending, &id);
    if (c) {
        c->charged = p->charged;
        c->device = p->device;
    }
    return 0;
}

/* cuMemCreate: the allocation property says where the memory lives. */
SEC("uprobe")
int BPF_KPROBE(mem_create, void *handle, __u64 bytes, void *prop) {
    stat_add(GW_STAT_EVENTS, 1);
    __u32 loc[2] = {}; /* CUmemAllocationProp.location: type, id (offset 8) */
    bpf_probe_read_user(loc, sizeof loc, prop + 8);
    struct pending_call c = {
        .out = (__u64)handle, .bytes = bytes, .api = GW_API_MEM_CREATE,
        .charged = loc[0] == 1 /* CU_MEM_LOCATION_TYPE_DEVICE */,
        .device = loc[0] == 1 ? loc[1] : GW_DEVICE_UNKNOWN,
    };
    pend(&c);
    return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(mem_alloc_ret) { return alloc_return(ctx); }

/* ---- frees: the entry is taken out of the table when the call starts, so a
 * racing allocation that gets the same pointer back is not confused with it;
 * it goes back if the driver refuses the free. ---- */

static __always_inline int free_enter(__u64 ptr, __u32 handle) {
    __u64 id = bpf_get_current_pid_tgid();
    stat_add(GW_STAT_EVENTS, 1);
    struct pending_call c = {.api = GW_CALL_FREE, .aux = ptr};
    c.key.tgid = id >> 32;
    c.key.handle = handle;
    c.key.ptr = ptr;
    struct alloc_val *v = bpf_map_lookup_elem(&allocs, &c.key);
    if (v) {
        c.val = *v;
        c.held = 1;
        bpf_map_delete_elem(&allocs, &c.key);
    }
    pend(&c);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(mem_free, __u64 ptr) { return free_enter(ptr, 0); }

SEC("uprobe")
int BPF_KPROBE(mem_release, __u64 handle) { return free_enter(handle, 1); }

SEC("uretprobe")
int BPF_KRETPROBE(mem_free_ret) {
    struct pending_call c;
    if (!take(&c) || c.api != GW_CALL_FREE) return 0;
    __u32 rc = (__u32)PT_REGS_RC(ctx);
    if (!c.held) {
        if (rc == 0 && c.aux != 0) stat_add(GW_STAT_UNTRACKED_FREES, 1);
        return 0;
    }
    if (rc != 0) { /* refused: the allocation is still there */
        bpf_map_update_elem(&allocs, &c.key, &c.val, BPF_NOEXIST);
        return 0;
    }
    struct proc_val *p = bpf_map_lookup_elem(&procs, &c.key.tgid);
    if (!p || p->seq != c.val.seq) return 0; /* a dead process's entry: already given back */
    struct usage_val *u = usage_of(c.val.cgroup, c.val.device);
    if (u) __sync_fetch_and_add(&u->frees, 1);
    charge(c.key.tgid, c.val.device, c.val.cgroup, -(__s64)c.val.bytes);
    return 0;
}

/* ---- memory pools: where cuMemAllocFromPoolAsync allocates ---- */

SEC("uprobe")
int BPF_KPROBE(pool_default, void *ppool, __s32 dev) {
    struct pending_call c = {.api = GW_CALL_POOL, .out = (__u64)ppool, .device = dev, .charged = 1};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(pool_create, void *ppool, void *props) {
    __u32 loc[2] = {}; /* CUmemPoolProps.location: type, id (offset 8) */
    bpf_probe_read_user(loc, sizeof loc, props + 8);
    struct pending_call c = {
        .api = GW_CALL_POOL, .out = (__u64)ppool,
        .charged = loc[0] == 1, .device = loc[0] == 1 ? loc[1] : GW_DEVICE_UNKNOWN,
    };
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(pool_ret) {
    struct pending_call c;
    if (!take(&c) || c.api != GW_CALL_POOL || PT_REGS_RC(ctx) != 0) return 0;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct ctx_key k = {.tgid = tgid};
    if (bpf_probe_read_user(&k.ctx, sizeof k.ctx, (void *)c.out) != 0) return 0;
    struct pool_val v = {.device = c.device, .charged = c.charged};
    proc_touch(tgid);
    bpf_map_update_elem(&pools, &k, &v, BPF_ANY);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(pool_destroy, __u64 pool) {
    struct ctx_key k = {.tgid = bpf_get_current_pid_tgid() >> 32, .ctx = pool};
    stat_add(GW_STAT_EVENTS, 1);
    bpf_map_delete_elem(&pools, &k);
    return 0;
}

/* ---- contexts: their devices, each thread's current one, and counts ---- */

static __always_inline struct thread_val *thread_of(__u32 tid) {
    struct thread_val *t = bpf_map_lookup_elem(&threads, &tid);
    if (t) return t;
    struct thread_val zero = {};
    bpf_map_update_elem(&threads, &tid, &zero, BPF_NOEXIST);
    return bpf_map_lookup_elem(&threads, &tid);
}

static __always_inline void thread_push(__u32 tid, __u64 ctx) {
    struct thread_val *t = thread_of(tid);
    if (!t) return;
    if (t->depth < GW_MAX_CTX_STACK) t->stack[t->depth & (GW_MAX_CTX_STACK - 1)] = ctx;
    t->depth++;
}

SEC("uprobe")
int BPF_KPROBE(ctx_set_current, __u64 cuctx) {
    __u64 id = bpf_get_current_pid_tgid();
    stat_add(GW_STAT_EVENTS, 1);
    struct thread_val *t = thread_of((__u32)id);
    if (!t) return 0;
    if (!cuctx) { /* unbinds: the stack loses its top */
        if (t->depth) t->depth--;
        return 0;
    }
    if (t->depth == 0) t->depth = 1;
    if (t->depth <= GW_MAX_CTX_STACK) t->stack[(t->depth - 1) & (GW_MAX_CTX_STACK - 1)] = cuctx;
    note_last_device(id >> 32, ctx_device(id >> 32, cuctx));
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_push, __u64 cuctx) {
    __u64 id = bpf_get_current_pid_tgid();
    stat_add(GW_STAT_EVENTS, 1);
    thread_push((__u32)id, cuctx);
    note_last_device(id >> 32, ctx_device(id >> 32, cuctx));
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_pop) {
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    stat_add(GW_STAT_EVENTS, 1);
    struct thread_val *t = bpf_map_lookup_elem(&threads, &tid);
    if (t && t->depth) t->depth--;
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_retain, void *pctx, __s32 dev) {
    struct pending_call c = {.api = GW_CALL_CTX_RETAIN, .out = (__u64)pctx, .device = dev};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_create, void *pctx, __u32 flags, __s32 dev) {
    struct pending_call c = {.api = GW_CALL_CTX_CREATE, .out = (__u64)pctx, .device = dev};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_create_v3, void *pctx, void *params, __s32 nparams, __u32 flags, __s32 dev) {
    struct pending_call c = {.api = GW_CALL_CTX_CREATE, .out = (__u64)pctx, .device = dev};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_create_v4, void *pctx, void *params, __u32 flags, __s32 dev) {
    struct pending_call c = {.api = GW_CALL_CTX_CREATE, .out = (__u64)pctx, .device = dev};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

/* Return of cuDevicePrimaryCtxRetain and cuCtxCreate_v2/_v3/_v4. */
SEC("uretprobe")
int BPF_KRETPROBE(ctx_new_ret) {
    struct pending_call c;
    if (!take(&c) || (c.api != GW_CALL_CTX_RETAIN && c.api != GW_CALL_CTX_CREATE) || PT_REGS_RC(ctx) != 0)
        return 0;
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    struct ctx_key k = {.tgid = tgid};
    if (bpf_probe_read_user(&k.ctx, sizeof k.ctx, (void *)c.out) != 0) return 0;
    __u64 cgroup = bpf_get_current_cgroup_id();
    proc_touch(tgid);
    struct ctx_val *have = bpf_map_lookup_elem(&ctxs, &k);
    if (have) {
        __sync_fetch_and_add(&have->refs, 1); /* another retain of a primary context */
    } else {
        struct ctx_val v = {.cgroup = cgroup, .device = c.device, .refs = 1,
                            .primary = c.api == GW_CALL_CTX_RETAIN};
        bpf_map_update_elem(&ctxs, &k, &v, BPF_ANY);
        struct usage_val *u = usage_of(cgroup, c.device);
        if (u) __sync_fetch_and_add(&u->ctx_created, 1);
    }
    if (c.api == GW_CALL_CTX_RETAIN) {
        struct prim_key pk = {.tgid = tgid, .device = c.device};
        bpf_map_update_elem(&primaries, &pk, &k.ctx, BPF_ANY);
    } else {
        thread_push((__u32)id, k.ctx); /* a new context becomes current */
        note_last_device(tgid, c.device);
    }
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_release, __s32 dev) {
    struct pending_call c = {.api = GW_CALL_CTX_RELEASE, .device = dev};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

SEC("uprobe")
int BPF_KPROBE(ctx_destroy, __u64 cuctx) {
    struct pending_call c = {.api = GW_CALL_CTX_DESTROY, .aux = cuctx};
    stat_add(GW_STAT_EVENTS, 1);
    pend(&c);
    return 0;
}

/* A destroyed context takes its allocations with it (not VMM handles). */
static long drop_ctx_allocs(void *map, struct alloc_key *k, struct alloc_val *v, struct ctx_key *gone) {
    if (k->tgid != gone->tgid || v->ctx != gone->ctx || k->handle) return 0;
    struct proc_val *p = bpf_map_lookup_elem(&procs, &k->tgid);
    if (p && p->seq == v->seq) {
        struct usage_val *u = usage_of(v->cgroup, v->device);
        if (u) __sync_fetch_and_add(&u->frees, 1);
        charge(k->tgid, v->device, v->cgroup, -(__s64)v->bytes);
    }
    bpf_map_delete_elem(map, k);
    return 0;
}

static __always_inline void ctx_gone(struct ctx_key *k, struct ctx_val *v) {
    struct usage_val *u = usage_of(v->cgroup, v->device);
    if (u) __sync_fetch_and_add(&u->ctx_destroyed, 1);
    struct ctx_key gone = *k;
    bpf_map_delete_elem(&ctxs, k);
    bpf_for_each_map_elem(&allocs, drop_ctx_allocs, &gone, 0);
}

/* Return of cuDevicePrimaryCtxRelease_v2 and cuCtxDestroy_v2. */
SEC("uretprobe")
int BPF_KRETPROBE(ctx_gone_ret) {
    struct pending_call c;
    if (!take(&c) || PT_REGS_RC(ctx) != 0) return 0;
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    struct ctx_key k = {.tgid = tgid};
    if (c.api == GW_CALL_CTX_RELEASE) {
        struct prim_key pk = {.tgid = tgid, .device = c.device};
        __u64 *pc = bpf_map_lookup_elem(&primaries, &pk);
        if (!pc) return 0;
        k.ctx = *pc;
        struct ctx_val *v = bpf_map_lookup_elem(&ctxs, &k);
        if (!v) return 0;
        if (v->refs > 1) {
            __sync_fetch_and_add(&v->refs, -1);
            return 0;
        }
        ctx_gone(&k, v);
        bpf_map_delete_elem(&primaries, &pk);
    } else if (c.api == GW_CALL_CTX_DESTROY) {
        k.ctx = c.aux;
        struct ctx_val *v = bpf_map_lookup_elem(&ctxs, &k);
        if (v) ctx_gone(&k, v);
        __u32 tid = (__u32)id;
        struct thread_val *t = bpf_map_lookup_elem(&threads, &tid);
        if (t && t->depth > 0 && t->depth <= GW_MAX_CTX_STACK &&
            t->stack[(t->depth - 1) & (GW_MAX_CTX_STACK - 1)] == c.aux)
            t->depth--;
    }
    return 0;
}

/* ---- kernel launches: counted exactly for processes no ledger counts,
 * sampled in short windows for the others (Go decides which and when) ---- */

static __always_inline void count_launch(void *map) {
    __u64 id = bpf_get_current_pid_tgid();
    stat_add(GW_STAT_EVENTS, 1);
    __u64 cuctx;
    struct usage_key k = {.cgroup = bpf_get_current_cgroup_id(), .device = current_device(id >> 32, (__u32)id, &cuctx)};
    struct launch_val *v = bpf_map_lookup_elem(map, &k);
    if (!v) {
        struct launch_val zero = {};
        bpf_map_update_elem(map, &k, &zero, BPF_NOEXIST);
        v = bpf_map_lookup_elem(map, &k);
        if (!v) return;
    }
    __sync_fetch_and_add(&v->count, 1);
}

SEC("uprobe")
int BPF_KPROBE(launch) {
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (bpf_map_lookup_elem(&exact_procs, &tgid)) return 0; /* counted by launch_exact */
    count_launch(&launches);
    return 0;
}

SEC("uprobe.multi")
int BPF_KPROBE(launch_exact) {
    count_launch(&launches_exact);
    return 0;
}

/* ---- process exit: what a process held leaves the live view ---- */

struct exit_ctx {
    __u32 tgid;
};

static long drop_proc_bytes(void *map, struct proc_key *k, __s64 *bytes, struct exit_ctx *x) {
    if (k->tgid != x->tgid) return 0;
    struct usage_val *u = usage_of(k->cgroup, k->device);
    if (u) {
        __sync_fetch_and_add(&u->bytes, -*bytes);
        __sync_fetch_and_add(&u->exit_freed_bytes, *bytes);
    }
    bpf_map_delete_elem(map, k);
    return 0;
}

static long drop_ctxs(void *map, struct ctx_key *k, struct ctx_val *v, struct exit_ctx *x) {
    if (k->tgid != x->tgid) return 0;
    struct usage_val *u = usage_of(v->cgroup, v->device);
    if (u) __sync_fetch_and_add(&u->ctx_destroyed, 1);
    bpf_map_delete_elem(map, k);
    return 0;
}

static __always_inline int process_gone(__u32 tgid) {
    if (!bpf_map_lookup_elem(&procs, &tgid)) return 0;
    struct exit_ctx x = {.tgid = tgid};
    bpf_for_each_map_elem(&proc_bytes, drop_proc_bytes, &x, 0);
    bpf_for_each_map_elem(&ctxs, drop_ctxs, &x, 0);
    /* allocs, pools and primaries of the process are left to the Go side's
     * garbage collection: their generation no longer matches. */
    bpf_map_delete_elem(&procs, &tgid);
    stat_add(GW_STAT_EXITS, 1);
    return 0;
}

static __always_inline void mark_changed(__u32 tgid) {
    __u8 one = 1;
    bpf_map_update_elem(&changed, &tgid, &one, BPF_ANY);
}

SEC("raw_tracepoint/sched_process_exit")
int on_exit(void *ctx) {
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id, tgid = id >> 32;
    bpf_map_delete_elem(&threads, &tid);
    bpf_map_delete_elem(&pending, &id);
    if (tid != tgid) return 0; /* a thread, not the process */
    mark_changed(tgid); /* its pid may come back as another process */
    return process_gone(tgid);
}

/* Every change to a process's mappings (mmap, mprotect, munmap, mremap,
 * brk) holds its mmap lock for writing: at the release the change is in
 * place, so a scan that reads the maps after taking the mark sees it. The
 * arguments are (mm, write) since Linux 6.12. */
SEC("raw_tracepoint/mmap_lock_released")
int on_mmap_unlock(struct bpf_raw_tracepoint_args *ctx) {
    if (ctx->args[1]) mark_changed(bpf_get_current_pid_tgid() >> 32);
    return 0;
}

/* Only tells the layout: a kernel that attaches a program reading a third
 * argument has the older (mm, memcg_path, write), whose tracepoint formats
 * a memory cgroup's path at every lock and release, too dear to enable. */
SEC("raw_tracepoint/mmap_lock_released")
int mmap_unlock_layout(struct bpf_raw_tracepoint_args *ctx) {
    return ctx->args[2] != 0;
}

/* exec replaces the image: the driver state of the old one is gone too. */
SEC("raw_tracepoint/sched_process_exec")
int on_exec(void *ctx) {
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    bpf_map_delete_elem(&threads, &tid);
    mark_changed(id >> 32); /* a new image: other files mapped */
    return process_gone(id >> 32);
}

/* reap gives back what a process held when it died while no program watched
 * (the agent was down): the Go side runs it with BPF_PROG_TEST_RUN, args[0]
 * being the tgid, so that it updates the maps with the same atomics. */
SEC("raw_tracepoint/gpuwarden_reap")
int reap(struct bpf_raw_tracepoint_args *ctx) {
    return process_gone((__u32)ctx->args[0]);
}
