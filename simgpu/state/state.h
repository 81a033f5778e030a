/* simgpu's shared machine: one file, mapped by every process that loads
 * libcuda.so.1 or libnvidia-ml.so.1 with the same SIMGPU_STATE, so that they
 * all see one set of devices, one memory budget and one execution engine.
 *
 * Every field another process may touch concurrently is _Atomic. A process
 * that dies (SIGKILL included) is noticed by its pid and start time, and
 * whoever notices gives its memory back (sg_reap_dead).
 */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define SG_MAGIC 0x5347505553544154ull /* "SGPUSTAT" */
#define SG_VERSION 6
#define SG_MAX_DEVICES 8
#define SG_MAX_PROCS 256
#define SG_SAMPLES 384                 /* utilization history per process and device: */
#define SG_SAMPLE_PERIOD_NS 40000000ull /* one sample per 40 ms of activity, about 15 s */
#define SG_CONTEXT_BYTES (64ull << 20)  /* device memory a context itself takes */
#define SG_NVML_SAMPLES 128             /* NVML's sample buffer under SIMGPU_MODEL=h200 */

enum sg_proc_state { SG_PROC_FREE = 0, SG_PROC_CLAIMING, SG_PROC_LIVE, SG_PROC_REAPING };

/* A point on a cumulative busy-time curve; utilization over a window is the
 * difference of two points divided by the window. */
struct sg_sample {
    _Atomic uint64_t ts_us;   /* wall clock, microseconds since the epoch (NVML's unit) */
    _Atomic uint64_t busy_ns; /* cumulative device time at ts_us */
};

struct sg_busy {
    _Atomic uint64_t busy_ns;       /* cumulative device time, nanoseconds */
    _Atomic uint64_t running_since; /* CLOCK_REALTIME ns a kernel started; 0 when none runs */
    _Atomic uint32_t head;          /* next sample slot */
    uint32_t pad;
    struct sg_sample samples[SG_SAMPLES];
};

/* One sample of the per-process utilization stream NVIDIA's driver keeps
 * (SIMGPU_MODEL=h200): the engine's busy percent over the period ending at
 * ts_us, credited to the one process on the engine at that instant. */
struct sg_nvml_sample {
    _Atomic uint64_t ts_us; /* 0 while being written */
    _Atomic int32_t pid;
    _Atomic uint32_t pct;   /* whole percents */
};

struct sg_proc {
    _Atomic uint32_t state;  /* enum sg_proc_state */
    int32_t pid;             /* in the process's own pid namespace */
    uint64_t start_time;     /* /proc/<pid>/stat field 22, tells a reused pid apart */
    uint64_t pidns;          /* inode of its pid namespace: pids mean something only there */
    _Atomic uint64_t mem[SG_MAX_DEVICES];      /* device bytes held, contexts included */
    _Atomic uint32_t contexts[SG_MAX_DEVICES]; /* live contexts per device */
    _Atomic uint32_t exec_waiting[SG_MAX_DEVICES]; /* its threads in sg_device.exec_waiters */
    _Atomic uint32_t sync_polling;                 /* its threads in sg_state.sync_pollers */
    struct sg_busy busy[SG_MAX_DEVICES];
};

struct sg_device {
    uint64_t total_mem;          /* bytes */
    _Atomic uint64_t used_mem;   /* bytes, all processes */
    char name[96];
    char uuid[48];               /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    uint8_t uuid_bytes[16];
    char pci_bus_id[32];         /* "00000000:1B:00.0" */
    uint32_t pci_bus;
    uint32_t pad;
    /* The execution engine: one kernel at a time, across all processes. */
    pthread_mutex_t exec_lock;   /* robust and process-shared */
    _Atomic uint32_t exec_waiters;
    _Atomic uint32_t exec_turn;  /* bumps on every acquisition; futex word for hand-off */
    struct sg_busy busy;         /* the whole device */
    /* The sampled stream, written under exec_lock by the kernels that span
     * its instants (SIMGPU_MODEL=h200). */
    uint64_t nvml_mark_us;       /* the latest sample instant accounted for */
    uint64_t nvml_mark_busy;     /* busy.busy_ns at that instant */
    _Atomic uint32_t nvml_head;  /* next slot of nvml */
    uint32_t pad2;
    struct sg_nvml_sample nvml[SG_NVML_SAMPLES];
    /* Device time: CLOCK_MONOTONIC ns at which the engine's latest kernel
     * (or the part of it before a preemption) ended, written under
     * exec_lock. The next kernel starts there if it was ready by then. */
    _Atomic uint64_t engine_free_ns;
};

struct sg_state {
    uint64_t magic;
    uint32_t version;
    uint32_t ndev;
    uint64_t size;               /* sizeof(struct sg_state) when created */
    struct sg_device dev[SG_MAX_DEVICES];
    struct sg_proc procs[SG_MAX_PROCS];
    _Atomic uint32_t sync_pollers; /* threads polling in a synchronize, all processes (h200 model) */
};

/* What simgpu models, from the environment of the process that loads it:
 * SIMGPU_MODEL unset (or empty) is exact; "h200" is an H200 on NVIDIA's
 * driver, whose NVML per-process utilization is a sample stream with period
 * SIMGPU_NVML_SAMPLE_MS (default the profile's, 200 ms) and whose engine time-slices
 * between contexts, preempting kernels. SIMGPU_PROFILE names a file of
 * "key = value" lines that override the h200 model's values (the built-in
 * ones are simgpu/models/h200.profile); SIMGPU_NVML_SAMPLE_MS overrides
 * both. Every process of a machine must have the same values. */
struct sg_model {
    int h200;
    uint64_t nvml_period_us;
    uint64_t time_slice_ns; /* the h200 engine's slice between contexts */
    uint64_t launch_capture_ns, launch_exec_ns; /* a launch's host time, into a capturing stream and executed */
    uint64_t launch_cold_lines, launch_nt_bytes; /* the stores a launch leaves pending as it returns */
};
extern struct sg_model sg_model;

/* sg_model_load reads the model from the environment; -1, with a message on
 * stderr, when a value is malformed. */
int sg_model_load(void);

/* sg_state_get maps the machine (creating it on first use) and returns it, or
 * NULL with a message on stderr. Thread-safe; maps once per process. */
struct sg_state *sg_state_get(void);

/* sg_proc_self returns this process's slot, claiming one on first use (and
 * again after fork); NULL when the table is full. */
struct sg_proc *sg_proc_self(struct sg_state *s);

/* sg_reap_dead gives back the memory and contexts of processes that died.
 * Only processes of the caller's pid namespace are judged: a pid from another
 * namespace says nothing here. */
void sg_reap_dead(struct sg_state *s);

/* sg_proc_alive says whether the slot's process still runs (same pid, same start). */
int sg_proc_alive(const struct sg_proc *p);

/* sg_sync_poll_begin says whether a synchronize may poll (h200 model): it
 * counts the thread in while fewer than all the cores but one poll, and
 * returns 0 otherwise. sg_sync_poll_end counts it out. */
int sg_sync_poll_begin(struct sg_state *s);
void sg_sync_poll_end(struct sg_state *s);

/* Memory: charge reserves bytes on dev for this process or fails (returns 0)
 * when the device is full; uncharge gives them back. */
int sg_mem_charge(struct sg_state *s, int dev, uint64_t bytes);
void sg_mem_uncharge(struct sg_state *s, int dev, uint64_t bytes);

/* Execution: run one kernel of duration_ns on dev, ready to start at
 * ready_ns (CLOCK_MONOTONIC: when it was launched, or its stream's previous
 * work ended), waiting for the engine. Returns when it ended, in device
 * time (see state.c). */
uint64_t sg_exec_kernel(struct sg_state *s, int dev, uint64_t duration_ns, uint64_t ready_ns);

/* Utilization: busy fraction (0-100) of a busy curve since since_us, and the
 * timestamp it was measured at. since_us of 0, or not in the past, means the
 * last second. History reaches back SG_SAMPLES * SG_SAMPLE_PERIOD_NS; an older
 * since_us gets the whole history. */
unsigned sg_busy_percent(const struct sg_busy *b, uint64_t since_us, uint64_t *now_us);

uint64_t sg_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t sg_wall_ns(void);     /* CLOCK_REALTIME */
uint64_t sg_start_time(pid_t pid);

/* sg_parse_bytes parses "16Gi", "512Mi", "1024" (bytes), "8G"; 0 on error. */
uint64_t sg_parse_bytes(const char *s);

#endif
