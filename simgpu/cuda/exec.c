/* Streams, events, launches, modules and graphs. Each stream has a worker
 * thread that runs its work in order; kernels take turns on the device's
 * execution engine (state.c), across all processes. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

/* run_op runs an op in device time (state.c): it is ready when it was
 * queued or when the stream's previous op ended, whichever is later, and
 * an event completes at that instant, not when the worker got to it. */
static void run_op(struct CUstream_st *st, struct sg_op *op) {
    uint64_t ready = op->queued_ns > st->done_ns ? op->queued_ns : st->done_ns;
    st->done_ns = ready;
    switch (op->kind) {
    case SG_OP_KERNEL: st->done_ns = sg_exec_kernel(sg_ready(), st->ctx->index, op->arg, ready); break;
    case SG_OP_EVENT:
        atomic_store(&op->event->at_ns, ready);
        atomic_fetch_add(&op->event->completed, 1);
        break;
    case SG_OP_FREE: sg_free(op->arg, 1); break;
    case SG_OP_RECORD: {
        void *dst = sg_host_range(op->arg, op->nbytes);
        if (dst) memcpy(dst, op->bytes, op->nbytes); /* out of range: the write goes nowhere */
        free(op->bytes);
        break;
    }
    }
}

/* A stream's queue: pushers take mu among themselves, the worker runs ops
 * without it. A thread that must wait (the worker for an op, a pusher for
 * room, a synchronize for the queue or an event) sleeps on cv under mu,
 * counted in sleepers first; whoever changes what it waits for wakes it
 * only while someone sleeps. So a launch into a stream whose worker is busy,
 * or still looking for work, makes no system call: a GPU's queue is not a
 * thread, and launching into it wakes nobody. */

/* sleep_until sleeps on st->cv, under st->mu (held), until done(st, arg). */
static void sleep_until(struct CUstream_st *st, int (*done)(struct CUstream_st *, const void *), const void *arg) {
    atomic_fetch_add(&st->sleepers, 1);
    while (!done(st, arg)) pthread_cond_wait(&st->cv, &st->mu);
    atomic_fetch_sub(&st->sleepers, 1);
}

/* wake wakes the threads asleep on st->cv, if any; for the worker, which
 * does not hold st->mu. */
static void wake(struct CUstream_st *st) {
    if (!atomic_load(&st->sleepers)) return;
    pthread_mutex_lock(&st->mu);
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static int queued_after(struct CUstream_st *st, const void *head) {
    return atomic_load(&st->tail) != *(const uint64_t *)head || st->stopping;
}
static int has_room(struct CUstream_st *st, const void *unused) {
    (void)unused;
    return atomic_load(&st->tail) - atomic_load(&st->head) < SG_QUEUE_LEN;
}
static int drained(struct CUstream_st *st, const void *unused) {
    (void)unused;
    return atomic_load(&st->head) == atomic_load(&st->tail);
}

/* How long an idle worker looks for its next op before it sleeps: longer
 * than the gap between a launch loop's launches. */
#define SG_WORKER_SPIN_NS 5000

/* next_op waits for an op after head: 0 once the stream stops with none. */
static int next_op(struct CUstream_st *st, uint64_t head) {
    for (uint64_t start = sg_now_ns(); sg_now_ns() - start < SG_WORKER_SPIN_NS; sched_yield())
        if (atomic_load(&st->tail) != head) return 1;
    pthread_mutex_lock(&st->mu);
    sleep_until(st, queued_after, &head);
    int more = atomic_load(&st->tail) != head;
    pthread_mutex_unlock(&st->mu);
    return more;
}

static void *worker(void *arg) {
    struct CUstream_st *st = arg;
    uint64_t head = atomic_load(&st->head), tail = head;
    for (;;) {
        if (head == tail && (tail = atomic_load(&st->tail)) == head) {
            if (!next_op(st, head)) break;
            tail = atomic_load(&st->tail);
        }
        struct sg_op op = st->ops[head % SG_QUEUE_LEN];
        run_op(st, &op);
        atomic_store(&st->head, ++head);
        wake(st);
    }
    return NULL;
}

struct CUstream_st *sg_stream_new(struct CUctx_st *ctx) {
    struct CUstream_st *st = aligned_alloc(_Alignof(struct CUstream_st), sizeof *st); /* its cache lines */
    if (!st) return NULL;
    memset(st, 0, sizeof *st);
    st->magic = SG_MAGIC_STREAM;
    st->ctx = ctx;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    return st;
}

void sg_stream_free(struct CUstream_st *st) {
    pthread_mutex_lock(&st->mu);
    st->stopping = 1;
    pthread_cond_broadcast(&st->cv);
    int started = st->worker_started;
    pthread_mutex_unlock(&st->mu);
    if (started) pthread_join(st->worker, NULL); /* it drains the queue first */
    st->magic = 0;
    free(st->captured);
    free(st);
}

CUresult sg_stream_resolve(CUstream h, struct CUstream_st **out) {
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct CUctx_st *c;
        CUresult rc = sg_current(&c);
        if (rc) return rc;
        *out = c->null_stream;
        return CUDA_SUCCESS;
    }
    if (h->magic != SG_MAGIC_STREAM || !sg_ctx_valid(h->ctx)) return CUDA_ERROR_INVALID_HANDLE;
    *out = h;
    return CUDA_SUCCESS;
}

CUresult sg_stream_push(struct CUstream_st *st, struct sg_op op) {
    pthread_mutex_lock(&st->mu);
    if (!st->worker_started) {
        if (pthread_create(&st->worker, NULL, worker, st) != 0) {
            pthread_mutex_unlock(&st->mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        st->worker_started = 1;
    }
    if (atomic_load_explicit(&st->tail, memory_order_relaxed) - st->head_seen >= SG_QUEUE_LEN) {
        sleep_until(st, has_room, NULL); /* other pushers may push meanwhile */
        st->head_seen = atomic_load(&st->head);
    }
    uint64_t tail = atomic_load_explicit(&st->tail, memory_order_relaxed); /* only pushers write it, under mu */
    op.queued_ns = sg_now_ns();
    st->ops[tail % SG_QUEUE_LEN] = op;
    atomic_store(&st->tail, tail + 1);
    if (atomic_load(&st->sleepers)) pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return CUDA_SUCCESS;
}

/* How a synchronize waits under the h200 model: as NVIDIA's driver does by
 * default (CU_CTX_SCHED_AUTO with fewer contexts than cores: spin), it
 * polls, so it returns as the work ends rather than a wake-up later (tens
 * of microseconds on a virtual machine: a tenth of a step of eight 20 us
 * kernels). CU_CTX_SCHED_YIELD gives the core away between polls from the
 * start; CU_CTX_SCHED_BLOCKING_SYNC sleeps, as on the GPU. simgpu's engine
 * runs on the host's cores, so the machine's pollers leave it one
 * (sg_sync_poll_begin), and a poll still waiting after SG_SYNC_POLL_NS
 * sleeps: one core given to a long wait starves the agent on a small
 * machine. Without a model, a synchronize sleeps. */
#define SG_SYNC_SPIN_NS 30000
#define SG_SYNC_POLL_NS 20000000

/* poll_until polls for done(st, arg) as above: 1 once it holds, 0 when the
 * caller must sleep for it. */
static int poll_until(struct CUstream_st *st, int (*done)(struct CUstream_st *, const void *), const void *arg) {
    unsigned sched = atomic_load(&st->ctx->flags) & CU_CTX_SCHED_MASK;
    if (!sg_model.h200 || sched == CU_CTX_SCHED_BLOCKING_SYNC) return 0;
    if (done(st, arg)) return 1;
    struct sg_state *s = sg_state_get();
    if (!s || !sg_sync_poll_begin(s)) return 0;
    int ok = 0;
    for (uint64_t start = sg_now_ns();;) {
        if ((ok = done(st, arg))) break;
        uint64_t waited = sg_now_ns() - start;
        if (waited > SG_SYNC_POLL_NS) break;
        if (sched == CU_CTX_SCHED_YIELD || waited > SG_SYNC_SPIN_NS)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
    sg_sync_poll_end(s);
    return ok;
}

CUresult sg_stream_sync(struct CUstream_st *st) {
    pthread_mutex_lock(&st->mu);
    int capturing = st->capturing;
    pthread_mutex_unlock(&st->mu);
    if (capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (poll_until(st, drained, NULL)) return CUDA_SUCCESS;
    pthread_mutex_lock(&st->mu);
    sleep_until(st, drained, NULL);
    pthread_mutex_unlock(&st->mu);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!phStream || Flags > 1) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = sg_stream_new(c);
    if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&c->mu);
    st->next = c->streams;
    c->streams = st;
    pthread_mutex_unlock(&c->mu);
    *phStream = st;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        hStream->magic != SG_MAGIC_STREAM || !sg_ctx_valid(hStream->ctx))
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUctx_st *c = hStream->ctx;
    pthread_mutex_lock(&c->mu);
    struct CUstream_st **pp = &c->streams;
    while (*pp && *pp != hStream) pp = &(*pp)->next;
    if (*pp) *pp = hStream->next;
    pthread_mutex_unlock(&c->mu);
    sg_stream_free(hStream);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    return rc ? rc : sg_stream_sync(st);
}

SG_EXPORT CUresult cuStreamQuery(CUstream hStream) {
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    return drained(st, NULL) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SG_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!phEvent || Flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SG_MAGIC_EVENT;
    e->flags = Flags;
    *phEvent = e;
    return CUDA_SUCCESS;
}

static int event_valid(CUevent e) { return e && e->magic == SG_MAGIC_EVENT; }

SG_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!event_valid(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    if (st->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    hEvent->stream = st;
    atomic_fetch_add(&hEvent->recorded, 1);
    return sg_stream_push(st, (struct sg_op){.kind = SG_OP_EVENT, .event = hEvent});
}

SG_EXPORT CUresult cuEventQuery(CUevent hEvent) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!event_valid(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    return atomic_load(&hEvent->completed) == atomic_load(&hEvent->recorded) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* An event's records up to target have run. */
struct event_wait {
    CUevent e;
    uint64_t target;
};
static int event_reached(struct CUstream_st *st, const void *arg) {
    (void)st;
    const struct event_wait *w = arg;
    return atomic_load(&w->e->completed) >= w->target;
}

SG_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!event_valid(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st = hEvent->stream;
    if (!st) return CUDA_SUCCESS; /* never recorded: nothing to wait for */
    struct event_wait w = {hEvent, atomic_load(&hEvent->recorded)};
    if (poll_until(st, event_reached, &w)) return CUDA_SUCCESS;
    pthread_mutex_lock(&st->mu);
    sleep_until(st, event_reached, &w);
    pthread_mutex_unlock(&st->mu);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pMilliseconds) return CUDA_ERROR_INVALID_VALUE;
    if (!event_valid(hStart) || !event_valid(hEnd)) return CUDA_ERROR_INVALID_HANDLE;
    if ((hStart->flags | hEnd->flags) & SG_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!atomic_load(&hStart->recorded) || !atomic_load(&hEnd->recorded)) return CUDA_ERROR_INVALID_HANDLE;
    if (cuEventQuery(hStart) || cuEventQuery(hEnd)) return CUDA_ERROR_NOT_READY;
    int64_t ns = (int64_t)(atomic_load(&hEnd->at_ns) - atomic_load(&hStart->at_ns));
    *pMilliseconds = (float)((double)ns / 1e6);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!event_valid(hEvent)) return CUDA_ERROR_INVALID_HANDLE;
    cuEventSynchronize(hEvent); /* a queued record must not touch freed memory */
    hEvent->magic = 0;
    free(hEvent);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    struct CUctx_st *c;
    CUresult rc = sg_current(&c);
    if (rc) return rc;
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    struct sg_kernel *ks;
    int nk;
    if (sg_module_parse(image, &ks, &nk) < 0) return CUDA_ERROR_INVALID_IMAGE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m) {
        free(ks);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->magic = SG_MAGIC_MODULE;
    m->kernels = ks;
    m->nkernels = nk;
    pthread_mutex_init(&m->mu, NULL);
    *module = m;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->magic != SG_MAGIC_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    const struct sg_kernel *k = NULL;
    for (int i = 0; i < hmod->nkernels && !k; i++)
        if (!strcmp(hmod->kernels[i].name, name)) k = &hmod->kernels[i];
    if (hmod->kernels && !k) return CUDA_ERROR_NOT_FOUND; /* a described image names all its kernels */
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    f->magic = SG_MAGIC_FUNC;
    strncpy(f->name, name, sizeof f->name - 1);
    if (k) f->k = *k;
    else sg_kernel_default(&f->k, name);
    pthread_mutex_lock(&hmod->mu);
    f->next = hmod->funcs;
    hmod->funcs = f;
    pthread_mutex_unlock(&hmod->mu);
    *hfunc = f;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!hmod || hmod->magic != SG_MAGIC_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    hmod->magic = 0;
    for (struct CUfunc_st *f = hmod->funcs, *next; f; f = next) {
        next = f->next;
        f->magic = 0;
        free(f);
    }
    free(hmod->kernels);
    free(hmod);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!func || func->magic != SG_MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (!paramOffset || !paramSize || paramIndex >= (size_t)func->k.nparams) return CUDA_ERROR_INVALID_VALUE;
    *paramOffset = func->k.offset[paramIndex];
    *paramSize = func->k.size[paramIndex];
    return CUDA_SUCCESS;
}

static void extra_buffer(void **extra, const void **buf, size_t *size) {
    *buf = NULL;
    *size = 0;
    for (int i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END && i < 16; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) *buf = extra[i + 1];
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) *size = *(const size_t *)extra[i + 1];
    }
}

/* A simulated kernel runs for its first parameter's nanoseconds. */
static uint64_t kernel_duration(void **kernelParams, void **extra) {
    if (kernelParams) return kernelParams[0] ? *(const uint64_t *)kernelParams[0] : 0;
    const void *buf;
    size_t size;
    extra_buffer(extra, &buf, &size);
    uint64_t ns = 0;
    if (buf && size >= sizeof ns) memcpy(&ns, buf, sizeof ns);
    return ns;
}

/* record_op packs a record kernel's parameters, as the device would see them. */
static CUresult record_op(const struct sg_kernel *k, void **kernelParams, void **extra, struct sg_op *op) {
    const void *buf = NULL;
    size_t size = 0;
    if (!kernelParams) {
        extra_buffer(extra, &buf, &size);
        if (!buf || size < k->bytes) return CUDA_ERROR_INVALID_VALUE;
    }
    unsigned char *p = calloc(1, k->bytes);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    if (buf) memcpy(p, buf, k->bytes);
    for (int i = 0; kernelParams && i < k->nparams; i++) {
        if (!kernelParams[i]) {
            free(p);
            return CUDA_ERROR_INVALID_VALUE;
        }
        memcpy(p + k->offset[i], kernelParams[i], k->size[i]);
    }
    *op = (struct sg_op){.kind = SG_OP_RECORD, .bytes = p, .nbytes = k->bytes};
    memcpy(&op->arg, p, sizeof op->arg);
    return CUDA_SUCCESS;
}

static CUresult capture_add(struct CUstream_st *st, uint64_t ns) {
    if (st->ncaptured == st->capcap) {
        size_t cap = st->capcap ? st->capcap * 2 : 16;
        uint64_t *p = realloc(st->captured, cap * sizeof *p);
        if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
        st->captured = p;
        st->capcap = cap;
    }
    st->captured[st->ncaptured++] = ns;
    return CUDA_SUCCESS;
}

/* The h200 model's launch costs host time as NVIDIA's does, and returns
 * with stores still pending (a graph node or pushbuffer entries on cold
 * lines, a doorbell write): sg_model.launch_cold_lines cold cache lines
 * written and launch_nt_bytes of non-temporal stores. A locked instruction
 * right after the launch then waits for them to drain, which is what makes
 * such an instruction on the launch path cost 100-150 ns on an H200 and
 * next to nothing on the exact model. */
#define SG_COLD_BYTES (64u << 20) /* more than a last-level cache */
#define SG_COLD_STRIDE 4160u      /* a new line, page and cache set each time */
static uint8_t *cold;
static pthread_once_t cold_once = PTHREAD_ONCE_INIT;

/* Mapped at cuInit, not at the first launch: 64 MiB written there would
 * make that launch take tens of ms, which no driver's does. */
static void cold_map(void) {
    void *p = mmap(NULL, SG_COLD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    memset(p, 1, SG_COLD_BYTES); /* the pages exist: the stores miss in the caches, not in the page tables */
    cold = p;
}

void sg_launch_model_init(void) {
    if (sg_model.launch_cold_lines || sg_model.launch_nt_bytes) pthread_once(&cold_once, cold_map);
}

static void host_time(uint64_t ns) {
    if (!ns) return;
    uint64_t end = sg_now_ns() + ns;
    while (sg_now_ns() < end) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}

static void leave_stores_pending(void) {
    uint64_t lines = sg_model.launch_cold_lines, nt = sg_model.launch_nt_bytes / 8;
    if ((!lines && !nt) || !cold) return;
    static __thread uint32_t at;
    uint8_t *b = cold + (at + SG_COLD_BYTES / 2) % SG_COLD_BYTES;
    for (uint64_t i = 0; i < lines; i++) {
        __atomic_store_n((uint64_t *)(cold + at), at, __ATOMIC_RELAXED);
        at = (at + SG_COLD_STRIDE) % (SG_COLD_BYTES / 2);
    }
    for (uint64_t i = 0; i < nt; i++) {
#if defined(__x86_64__)
        __asm__ volatile("movnti %1, %0" : "=m"(((uint64_t *)b)[i]) : "r"((uint64_t)at));
#else
        __atomic_store_n(&((uint64_t *)b)[i], at, __ATOMIC_RELAXED);
#endif
    }
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, CUstream hStream, void **kernelParams, void **extra) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!f || f->magic != SG_MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams && extra) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    if (f->k.kind == SG_KERNEL_RECORD) {
        if (st->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* graphs hold durations only */
        struct sg_op op = {0};
        rc = record_op(&f->k, kernelParams, extra, &op);
        if (!rc) rc = sg_stream_push(st, op);
        if (rc && op.bytes) free(op.bytes);
        return rc;
    }
    uint64_t ns = kernel_duration(kernelParams, extra);
    host_time(st->capturing ? sg_model.launch_capture_ns : sg_model.launch_exec_ns);
    rc = st->capturing ? capture_add(st, ns) : sg_stream_push(st, (struct sg_op){.kind = SG_OP_KERNEL, .arg = ns});
    leave_stores_pending();
    return rc;
}

SG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
                                  void **kernelParams, void **extra) {
    (void)sharedMemBytes;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, kernelParams, extra);
}

SG_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int sharedMemBytes,
                                       CUstream hStream, void **kernelParams, void **extra) {
    (void)sharedMemBytes;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, kernelParams, extra);
}

SG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                  config->blockDimZ, config->hStream, kernelParams, extra);
}

SG_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                         void **extra) {
    return cuLaunchKernelEx(config, f, kernelParams, extra);
}

SG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz,
                                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams) {
    (void)sharedMemBytes;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, kernelParams, NULL);
}

SG_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void **kernelParams) {
    (void)sharedMemBytes;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, kernelParams, NULL);
}

SG_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    if (st == st->ctx->null_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream */
    if (st->capturing) return CUDA_ERROR_INVALID_VALUE; /* already capturing */
    st->capturing = 1;
    st->ncaptured = 0;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    *captureStatus = st->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

static CUresult copy_kernels(const uint64_t *src, size_t n, uint64_t **dst) {
    *dst = malloc((n ? n : 1) * sizeof **dst);
    if (!*dst) return CUDA_ERROR_OUT_OF_MEMORY;
    if (n) memcpy(*dst, src, n * sizeof **dst);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    if (!st->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    st->capturing = 0;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g || copy_kernels(st->captured, st->ncaptured, &g->kernels)) {
        free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->magic = SG_MAGIC_GRAPH;
    g->n = st->ncaptured;
    *phGraph = g;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphExec || flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    if (!hGraph || hGraph->magic != SG_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    if (!x || copy_kernels(hGraph->kernels, hGraph->n, &x->kernels)) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    x->magic = SG_MAGIC_EXEC;
    x->n = hGraph->n;
    *phGraphExec = x;
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                         char *logBuffer, size_t bufferSize) {
    (void)phErrorNode;
    if (logBuffer && bufferSize) logBuffer[0] = 0;
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

static CUresult graph_launch(CUgraphExec x, CUstream hStream) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!x || x->magic != SG_MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    CUresult rc = sg_stream_resolve(hStream, &st);
    if (rc) return rc;
    for (size_t i = 0; i < x->n && !rc; i++)
        rc = st->capturing ? capture_add(st, x->kernels[i])
                           : sg_stream_push(st, (struct sg_op){.kind = SG_OP_KERNEL, .arg = x->kernels[i]});
    return rc;
}

SG_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { return graph_launch(hGraphExec, hStream); }
SG_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return graph_launch(hGraphExec, hStream);
}

SG_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!hGraph || hGraph->magic != SG_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    hGraph->magic = 0;
    free(hGraph->kernels);
    free(hGraph);
    return CUDA_SUCCESS;
}

SG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    if (!sg_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!hGraphExec || hGraphExec->magic != SG_MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    hGraphExec->magic = 0;
    free(hGraphExec->kernels);
    free(hGraphExec);
    return CUDA_SUCCESS;
}
