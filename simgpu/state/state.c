/* The shared machine: mapping, process slots, memory and the execution engine. */
#define _GNU_SOURCE
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SG_DEFAULT_STATE "/dev/shm/simgpu-state"

static struct sg_state *g_state;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

uint64_t sg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t sg_wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t sg_parse_bytes(const char *s) {
    char *end;
    if (!s || !*s) return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return 0;
    uint64_t mult;
    if (!*end) mult = 1ull << 30; /* a bare number is GiB, as in GPUWARDEN_MEMORY_LIMIT */
    else if (!strcmp(end, "Ki")) mult = 1ull << 10;
    else if (!strcmp(end, "Mi")) mult = 1ull << 20;
    else if (!strcmp(end, "Gi")) mult = 1ull << 30;
    else if (!strcmp(end, "Ti")) mult = 1ull << 40;
    else if (!strcmp(end, "K")) mult = 1000ull;
    else if (!strcmp(end, "M")) mult = 1000000ull;
    else if (!strcmp(end, "G")) mult = 1000000000ull;
    else if (!strcmp(end, "B")) mult = 1;
    else return 0;
    if (v > UINT64_MAX / mult) return 0;
    return v * mult;
}

uint64_t sg_start_time(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p) return 0;
    /* after ") " come fields 3.. ; starttime is field 22 */
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

static void init_device(struct sg_device *d, int i, uint64_t mem) {
    d->total_mem = mem;
    snprintf(d->name, sizeof d->name, "simgpu H200 (simulated)");
    for (int b = 0; b < 16; b++) d->uuid_bytes[b] = (uint8_t)(0x5a ^ (b * 17) ^ (i * 31));
    d->uuid_bytes[15] = (uint8_t)i;
    const uint8_t *u = d->uuid_bytes;
    snprintf(d->uuid, sizeof d->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    d->pci_bus = 0x18 + (uint32_t)i;
    snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", d->pci_bus);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&d->exec_lock, &a);
    pthread_mutexattr_destroy(&a);
}

static int env_int(const char *name, int def, int lo, int hi) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > hi) {
        fprintf(stderr, "simgpu: %s=%s: want an integer from %d to %d\n", name, v, lo, hi);
        return -1;
    }
    return (int)n;
}

/* The h200 model's built-in values, as simgpu/models/h200.profile lists
 * them with their sources: the NVML sample period (200 ms), the time slice
 * between contexts (2.09 ms) and a launch's host time (604 ns into a
 * capturing stream, 3275 ns executed), measured on an H200 with driver
 * 580.159.04 by the GPU check (2026-12-04). What a launch leaves pending (a
 * graph node or pushbuffer entries, a doorbell) is two cold lines and 128
 * bytes of non-temporal stores: a locked add right after a launch waits for
 * them, a penalty the profile says the H200 no longer shows. */
#define SG_H200_NVML_PERIOD_US 200248ull
#define SG_H200_TIMESLICE_NS 2091008ull
#define SG_H200_LAUNCH_CAPTURE_NS 604ull
#define SG_H200_LAUNCH_EXEC_NS 3275ull
#define SG_H200_LAUNCH_COLD_LINES 2ull
#define SG_H200_LAUNCH_NT_BYTES 128ull

/* The slice is set in the exact model too: run_for computes with it. */
struct sg_model sg_model = {.time_slice_ns = SG_H200_TIMESLICE_NS};

/* The keys a profile may set, each with its bounds. */
static const struct {
    const char *key;
    size_t off;
    uint64_t lo, hi;
} profile_keys[] = {
    {"nvml_sample_period_us", offsetof(struct sg_model, nvml_period_us), 1000, 60000000},
    {"time_slice_ns", offsetof(struct sg_model, time_slice_ns), 10000, 1000000000},
    {"launch_capture_ns", offsetof(struct sg_model, launch_capture_ns), 0, 1000000},
    {"launch_exec_ns", offsetof(struct sg_model, launch_exec_ns), 0, 1000000},
    {"launch_cold_lines", offsetof(struct sg_model, launch_cold_lines), 0, 64},
    {"launch_nt_bytes", offsetof(struct sg_model, launch_nt_bytes), 0, 4096},
};
#define SG_PROFILE_KEYS (sizeof profile_keys / sizeof profile_keys[0])

/* profile_line parses one line into *m: blank, "# comment", or
 * "key = value" with an optional trailing comment; value is a decimal
 * integer. Returns NULL, or what is wrong. seen marks keys already set. */
static const char *profile_line(char *line, struct sg_model *m, int *seen) {
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *p = line;
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (!*p) return NULL;
    char *key = p;
    while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_') p++;
    size_t keylen = (size_t)(p - key);
    while (*p == ' ' || *p == '\t') p++;
    if (!keylen || *p != '=') return "want \"key = value\"";
    p++;
    while (*p == ' ' || *p == '\t') p++;
    if (*p < '0' || *p > '9') return "the value is not a decimal integer";
    uint64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10) return "the value is too large";
        v = v * 10 + (uint64_t)(*p - '0');
    }
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p) return "the value is not a decimal integer";
    for (size_t i = 0; i < SG_PROFILE_KEYS; i++) {
        if (strlen(profile_keys[i].key) != keylen || strncmp(profile_keys[i].key, key, keylen)) continue;
        if (seen[i]) return "the key is set twice";
        if (v < profile_keys[i].lo || v > profile_keys[i].hi) return "the value is out of range";
        seen[i] = 1;
        *(uint64_t *)((char *)m + profile_keys[i].off) = v;
        return NULL;
    }
    return "unknown key";
}

/* load_profile applies the file at path to *m; -1, with a message naming
 * the line, on anything it does not understand. */
static int load_profile(const char *path, struct sg_model *m) {
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "simgpu: SIMGPU_PROFILE=%s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0, seen[SG_PROFILE_KEYS] = {0}, rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        n++;
        const char *bad = NULL;
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if (len > 510) bad = "the line is longer than 510 bytes";
        else if (strlen(line) != (size_t)len) bad = "the line holds a NUL byte";
        else bad = profile_line(line, m, seen);
        if (bad) {
            fprintf(stderr, "simgpu: SIMGPU_PROFILE=%s line %d: %s\n", path, n, bad);
            rc = -1;
        }
    }
    free(line);
    if (!rc && ferror(f)) {
        fprintf(stderr, "simgpu: SIMGPU_PROFILE=%s: read error\n", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}

int sg_model_load(void) {
    struct sg_model m = {.time_slice_ns = SG_H200_TIMESLICE_NS};
    const char *v = getenv("SIMGPU_MODEL"), *profile = getenv("SIMGPU_PROFILE");
    if (v && !strcmp(v, "h200")) {
        m.h200 = 1;
        m.nvml_period_us = SG_H200_NVML_PERIOD_US;
        m.launch_capture_ns = SG_H200_LAUNCH_CAPTURE_NS, m.launch_exec_ns = SG_H200_LAUNCH_EXEC_NS;
        m.launch_cold_lines = SG_H200_LAUNCH_COLD_LINES, m.launch_nt_bytes = SG_H200_LAUNCH_NT_BYTES;
        if (profile && *profile && load_profile(profile, &m) < 0) return -1;
        int ms = env_int("SIMGPU_NVML_SAMPLE_MS", 0, 1, 60000);
        if (ms < 0) return -1;
        if (ms) m.nvml_period_us = (uint64_t)ms * 1000;
    } else if (v && *v) {
        fprintf(stderr, "simgpu: SIMGPU_MODEL=%s: want h200, or unset for the exact model\n", v);
        return -1;
    } else if (profile && *profile) {
        fprintf(stderr, "simgpu: SIMGPU_PROFILE=%s: a profile is for SIMGPU_MODEL=h200\n", profile);
        return -1;
    }
    sg_model = m;
    return 0;
}

static void map_state(void) {
    const char *path = getenv("SIMGPU_STATE");
    if (!path || !*path) path = SG_DEFAULT_STATE;
    int ndev = env_int("SIMGPU_DEVICES", 1, 1, SG_MAX_DEVICES);
    if (ndev < 0) return;
    uint64_t mem = 16ull << 30;
    const char *m = getenv("SIMGPU_MEMORY");
    if (m && *m && !(mem = sg_parse_bytes(m))) {
        fprintf(stderr, "simgpu: SIMGPU_MEMORY=%s: want a size such as 16Gi or 512Mi\n", m);
        return;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "simgpu: open state %s: %s\n", path, strerror(errno));
        return;
    }
    /* The first process to take the lock lays the machine out. */
    flock(fd, LOCK_EX);
    struct stat st;
    fstat(fd, &st);
    int fresh = st.st_size == 0;
    if (fresh && ftruncate(fd, sizeof(struct sg_state)) != 0) {
        fprintf(stderr, "simgpu: size state %s: %s\n", path, strerror(errno));
        flock(fd, LOCK_UN);
        close(fd);
        return;
    }
    if (!fresh && (size_t)st.st_size != sizeof(struct sg_state)) {
        fprintf(stderr, "simgpu: state %s has size %lld, want %zu: remove it\n", path,
                (long long)st.st_size, sizeof(struct sg_state));
        flock(fd, LOCK_UN);
        close(fd);
        return;
    }
    struct sg_state *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED) {
        fprintf(stderr, "simgpu: map state %s: %s\n", path, strerror(errno));
        flock(fd, LOCK_UN);
        close(fd);
        return;
    }
    if (fresh) {
        s->version = SG_VERSION;
        s->ndev = (uint32_t)ndev;
        s->size = sizeof *s;
        for (int i = 0; i < ndev; i++) init_device(&s->dev[i], i, mem);
        __atomic_store_n(&s->magic, SG_MAGIC, __ATOMIC_RELEASE);
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (s->magic != SG_MAGIC || s->version != SG_VERSION || s->size != sizeof *s) {
        fprintf(stderr, "simgpu: state %s is not a simgpu %d state: remove it\n", path, SG_VERSION);
        munmap(s, sizeof *s);
        return;
    }
    g_state = s;
}

struct sg_state *sg_state_get(void) {
    pthread_once(&g_once, map_state);
    return g_state;
}

static uint64_t pidns_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

int sg_proc_alive(const struct sg_proc *p) {
    if (kill(p->pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t st = sg_start_time(p->pid);
    return st == 0 || st == p->start_time; /* unreadable /proc: assume alive */
}

static void release_slot(struct sg_state *s, struct sg_proc *p) {
    for (uint32_t d = 0; d < s->ndev; d++) {
        uint64_t m = atomic_exchange(&p->mem[d], 0);
        if (m) atomic_fetch_sub(&s->dev[d].used_mem, m);
        atomic_store(&p->contexts[d], 0);
        atomic_store(&p->busy[d].running_since, 0);
        /* A process killed while it waited for the engine: others must not
         * keep handing the engine over to it. */
        uint32_t w = atomic_exchange(&p->exec_waiting[d], 0);
        if (w) atomic_fetch_sub(&s->dev[d].exec_waiters, w);
    }
    uint32_t polling = atomic_exchange(&p->sync_polling, 0); /* killed while it polled */
    if (polling) atomic_fetch_sub(&s->sync_pollers, polling);
    atomic_store(&p->state, SG_PROC_FREE);
}

void sg_reap_dead(struct sg_state *s) {
    uint64_t self_ns = pidns_of("/proc/self/ns/pid");
    for (int i = 0; i < SG_MAX_PROCS; i++) {
        struct sg_proc *p = &s->procs[i];
        uint32_t live = SG_PROC_LIVE;
        if (atomic_load(&p->state) != SG_PROC_LIVE || p->pid == getpid()) continue;
        if (p->pidns != self_ns) continue;
        if (sg_proc_alive(p)) continue;
        if (atomic_compare_exchange_strong(&p->state, &live, SG_PROC_REAPING)) release_slot(s, p);
    }
}

/* The cores this process may run on: the engine's kernels are threads too,
 * and need one of them. */
static uint32_t poll_cores(void) {
    static _Atomic uint32_t cores;
    uint32_t n = atomic_load(&cores);
    if (!n) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? (uint32_t)CPU_COUNT(&set) : 1;
        atomic_store(&cores, n ? n : 1);
    }
    return n;
}

/* Counted on the machine, then in the process's slot (and uncounted in the
 * reverse order), as exec_waiters is. */
int sg_sync_poll_begin(struct sg_state *s) {
    struct sg_proc *me = sg_proc_self(s);
    uint32_t most = poll_cores() - 1, n = atomic_load(&s->sync_pollers);
    do {
        if (!me || n >= most) return 0;
    } while (!atomic_compare_exchange_weak(&s->sync_pollers, &n, n + 1));
    atomic_fetch_add(&me->sync_polling, 1);
    return 1;
}

void sg_sync_poll_end(struct sg_state *s) {
    struct sg_proc *me = sg_proc_self(s);
    if (me) atomic_fetch_sub(&me->sync_polling, 1);
    atomic_fetch_sub(&s->sync_pollers, 1);
}

/* This process's slot. A forked child starts with none (the atfork handler
 * clears it), so the hot path needs no getpid() system call. */
static struct sg_proc *_Atomic g_self;
static pid_t g_self_pid;
static pthread_mutex_t g_self_mu = PTHREAD_MUTEX_INITIALIZER;

static void forget_self_in_child(void) {
    atomic_store(&g_self, NULL);
    g_self_pid = 0;
    pthread_mutex_init(&g_self_mu, NULL);
}

static struct sg_proc *claim_slot(struct sg_state *s) {
    pid_t pid = getpid();
    for (int i = 0; i < SG_MAX_PROCS; i++) {
        struct sg_proc *p = &s->procs[i];
        uint32_t free_state = SG_PROC_FREE;
        if (!atomic_compare_exchange_strong(&p->state, &free_state, SG_PROC_CLAIMING)) continue;
        p->pid = pid;
        p->start_time = sg_start_time(pid);
        p->pidns = pidns_of("/proc/self/ns/pid");
        for (int d = 0; d < SG_MAX_DEVICES; d++) {
            atomic_store(&p->mem[d], 0);
            atomic_store(&p->contexts[d], 0);
            atomic_store(&p->exec_waiting[d], 0);
            memset(&p->busy[d], 0, sizeof p->busy[d]);
        }
        atomic_store(&p->sync_polling, 0);
        atomic_store(&p->state, SG_PROC_LIVE);
        return p;
    }
    return NULL;
}

/* A normally exiting process gives its slot back at once; a killed one is reaped. */
static void release_self(void) {
    struct sg_proc *me = atomic_load(&g_self);
    if (me && g_self_pid == getpid() && g_state) {
        uint32_t live = SG_PROC_LIVE;
        if (atomic_compare_exchange_strong(&me->state, &live, SG_PROC_REAPING)) release_slot(g_state, me);
    }
}

struct sg_proc *sg_proc_self(struct sg_state *s) {
    struct sg_proc *me = atomic_load_explicit(&g_self, memory_order_acquire);
    if (me) return me;
    pthread_mutex_lock(&g_self_mu);
    if (!(me = atomic_load(&g_self))) {
        static int registered;
        me = claim_slot(s);
        if (!me) {
            sg_reap_dead(s);
            me = claim_slot(s);
        }
        if (me) {
            g_self_pid = getpid();
            atomic_store_explicit(&g_self, me, memory_order_release);
            if (!registered++) {
                atexit(release_self);
                pthread_atfork(NULL, NULL, forget_self_in_child);
            }
        }
    }
    pthread_mutex_unlock(&g_self_mu);
    return me;
}

int sg_mem_charge(struct sg_state *s, int dev, uint64_t bytes) {
    struct sg_device *d = &s->dev[dev];
    struct sg_proc *me = sg_proc_self(s);
    if (!me) return 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t used = atomic_load(&d->used_mem);
        while (used <= d->total_mem && bytes <= d->total_mem - used) {
            if (atomic_compare_exchange_weak(&d->used_mem, &used, used + bytes)) {
                atomic_fetch_add(&me->mem[dev], bytes);
                return 1;
            }
        }
        sg_reap_dead(s); /* a dead process may still hold what we need */
    }
    return 0;
}

void sg_mem_uncharge(struct sg_state *s, int dev, uint64_t bytes) {
    struct sg_proc *me = sg_proc_self(s);
    atomic_fetch_sub(&s->dev[dev].used_mem, bytes);
    if (me) atomic_fetch_sub(&me->mem[dev], bytes);
}

/* Returns 0 when woken (or the word had changed), -1 on timeout. */
static int futex_wait(_Atomic uint32_t *word, uint32_t val, long timeout_ns) {
    struct timespec ts = {0, timeout_ns};
    if (syscall(SYS_futex, word, FUTEX_WAIT, val, &ts, NULL, 0) == 0) return 0;
    return errno == ETIMEDOUT ? -1 : 0;
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* Records the busy curve's value at a kernel's start or end. The newest
 * sample follows the latest start or end until it is a period past the one
 * before it; then the next sample starts. Samples at starts keep an idle gap
 * flat: interpolating across it would spread the next kernel over the gap
 * and lose time between consecutive readers' windows. */
static void busy_sample(struct sg_busy *b, uint64_t total, uint64_t wall_ns) {
    uint32_t head = atomic_load(&b->head);
    struct sg_sample *prev = &b->samples[(head + SG_SAMPLES - 2) % SG_SAMPLES];
    uint64_t now_us = wall_ns / 1000;
    struct sg_sample *next = &b->samples[head % SG_SAMPLES];
    if (head >= 2 && now_us - atomic_load(&prev->ts_us) < SG_SAMPLE_PERIOD_NS / 1000)
        next = &b->samples[(head + SG_SAMPLES - 1) % SG_SAMPLES];
    else
        atomic_store(&b->head, head + 1);
    atomic_store(&next->ts_us, 0); /* readers skip a sample being rewritten */
    atomic_store(&next->busy_ns, total);
    atomic_store(&next->ts_us, now_us);
}

static void busy_add(struct sg_busy *b, uint64_t dur_ns, uint64_t end_wall_ns) {
    uint64_t total = atomic_fetch_add(&b->busy_ns, dur_ns) + dur_ns;
    atomic_store(&b->running_since, 0);
    busy_sample(b, total, end_wall_ns);
}

static void busy_start(struct sg_busy *b, uint64_t wall_ns) {
    busy_sample(b, atomic_load(&b->busy_ns), wall_ns);
    atomic_store(&b->running_since, wall_ns);
}

/* The sampled NVML stream: every period, NVIDIA's driver records the
 * engine's busy percent over the period (whole percents, truncated) and the
 * one process on the engine at that instant. Called under exec_lock at the
 * end of a kernel that ran from start_us to end_us: instants in the idle gap
 * before it credit nobody and busy was flat across the gap; instants it
 * spans credit pid. A sample is thus written up to a kernel's length late. */
static void nvml_sample(struct sg_device *d, int32_t pid, uint64_t start_us, uint64_t end_us,
                        uint64_t busy_at_start) {
    uint64_t period = sg_model.nvml_period_us;
    uint64_t before = start_us / period * period; /* the last instant at or before the start */
    if (before > d->nvml_mark_us) {
        d->nvml_mark_us = before;
        d->nvml_mark_busy = busy_at_start;
    }
    for (uint64_t t = d->nvml_mark_us + period; t <= end_us; t += period) {
        uint64_t busy = busy_at_start + (t - start_us) * 1000;
        uint64_t pct = busy > d->nvml_mark_busy ? (busy - d->nvml_mark_busy) / (period * 10) : 0;
        uint32_t head = atomic_load(&d->nvml_head);
        struct sg_nvml_sample *x = &d->nvml[head % SG_NVML_SAMPLES];
        atomic_store(&x->ts_us, 0); /* readers skip a sample being rewritten */
        atomic_store(&x->pid, pid);
        atomic_store(&x->pct, pct > 100 ? 100 : (uint32_t)pct);
        atomic_store(&x->ts_us, t);
        atomic_store(&d->nvml_head, head + 1);
        d->nvml_mark_us = t;
        d->nvml_mark_busy = busy;
    }
}

/* Wait until the simulated kernel's end: sleep while far away, spin the last
 * stretch so that short kernels last what they say. */
static void wait_until(uint64_t end_ns) {
    for (;;) {
        uint64_t now = sg_now_ns();
        if (now >= end_ns) return;
        if (end_ns - now > 80000) {
            uint64_t t = end_ns - 60000;
            struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
    }
}

/* The time slice between contexts (h200 model; the profile may set it). */
#define SG_TIMESLICE_NS (sg_model.time_slice_ns)

/* Device time. A GPU runs a stream's kernels back to back whatever its
 * host does; a simulated kernel is a thread that sleeps until the kernel's
 * end, and a thread wakes late whenever the host is busy (by tens of
 * microseconds on a virtual machine, every kernel). So a kernel starts in
 * device time, not at the instant its thread got the engine: when the
 * engine's previous kernel ended (engine_free_ns) or when it was ready
 * (launched, its stream's previous work done), whichever is later, and it
 * ends its duration after that. A thread that woke late catches up at
 * once; the host's lateness shows in when its synchronize returns, as on a
 * GPU, and never in the device's throughput. */

/* run_for holds the engine while a kernel with left ns to go runs from
 * start (device time) and returns when it stopped: at its end or, in the
 * h200 model where the GPU time-slices between contexts, at the end of a
 * slice (slices follow each other from slice_start while the context keeps
 * the engine) when another process waits for the engine: the kernel is
 * preempted, to resume at its next turn. */
static uint64_t run_for(struct sg_device *d, struct sg_proc *me, int dev, uint64_t start, uint64_t left,
                        uint64_t slice_start) {
    uint64_t end = start + left;
    uint64_t slice = start - (start - slice_start) % SG_TIMESLICE_NS + SG_TIMESLICE_NS;
    for (; sg_model.h200 && slice < end; slice += SG_TIMESLICE_NS) {
        wait_until(slice);
        if (atomic_load(&d->exec_waiters) > (me ? atomic_load(&me->exec_waiting[dev]) : 0)) return slice;
    }
    wait_until(end);
    return end;
}

/* take_turn waits for the engine, runs the kernel's left ns on it (or, when
 * preempted, part of them) from *at or later, and hands the engine over; it
 * returns the ns still to run and sets *at to when it stopped. */
static uint64_t take_turn(struct sg_state *s, int dev, uint64_t left, uint64_t *at) {
    /* This thread's latest turn, and when its time slice began: a turn
     * right after its own continues the slice. */
    static __thread uint32_t last_turn[SG_MAX_DEVICES];
    static __thread uint64_t slice_start[SG_MAX_DEVICES];
    struct sg_device *d = &s->dev[dev];
    struct sg_proc *me = sg_proc_self(s);
    /* Counted on the device, then in the process's slot (and uncounted in
     * the reverse order), so that reaping a process killed in between never
     * takes off more than it added. */
    atomic_fetch_add(&d->exec_waiters, 1);
    if (me) atomic_fetch_add(&me->exec_waiting[dev], 1);
    int rc = pthread_mutex_lock(&d->exec_lock);
    if (me) atomic_fetch_sub(&me->exec_waiting[dev], 1);
    atomic_fetch_sub(&d->exec_waiters, 1);
    if (rc == EOWNERDEAD) {
        /* The previous holder died mid-kernel; its time ends here. */
        atomic_store(&d->busy.running_since, 0);
        atomic_store(&d->engine_free_ns, sg_now_ns());
        pthread_mutex_consistent(&d->exec_lock);
    }
    uint32_t turn = atomic_fetch_add(&d->exec_turn, 1) + 1;
    uint64_t now = sg_now_ns(), wall_now = sg_wall_ns(), busy_before = atomic_load(&d->busy.busy_ns);
    uint64_t free = atomic_load(&d->engine_free_ns), start = *at > free ? *at : free;
    if (start > now) start = now; /* neither is ever later than now; a clock step back cannot stall the engine */
    uint64_t wall = wall_now - (now - start);
    busy_start(&d->busy, wall);
    if (me) busy_start(&me->busy[dev], wall);
    if (!slice_start[dev] || turn != last_turn[dev] + 1) slice_start[dev] = start;
    last_turn[dev] = turn;
    uint64_t stop = run_for(d, me, dev, start, left, slice_start[dev]), ran = stop - start;
    left -= ran;
    *at = stop;
    atomic_store(&d->engine_free_ns, stop);
    busy_add(&d->busy, ran, wall + ran);
    if (me) busy_add(&me->busy[dev], ran, wall + ran);
    if (sg_model.h200 && me) nvml_sample(d, me->pid, wall / 1000, (wall + ran) / 1000, busy_before);
    pthread_mutex_unlock(&d->exec_lock);
    futex_wake_all(&d->exec_turn);
    /* Hand the engine over: a GPU time-slices between contexts, so a process
     * with more work queued must not take the engine straight back. The
     * h200 model hands it over at a slice's end (a preempted kernel); a
     * context whose kernel ended mid-slice keeps it for its next kernel, or
     * yields at once by having none. */
    if ((!sg_model.h200 || left) && atomic_load(&d->exec_waiters) > 0 && atomic_load(&d->exec_turn) == turn &&
        futex_wait(&d->exec_turn, turn, 2000000) < 0 && atomic_load(&d->exec_turn) == turn)
        sg_reap_dead(s); /* nobody took it: the waiter may have been killed */
    return left;
}

uint64_t sg_exec_kernel(struct sg_state *s, int dev, uint64_t duration_ns, uint64_t ready_ns) {
    static __thread int slack_set;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1ul, 0, 0, 0);
        slack_set = 1;
    }
    uint64_t at = ready_ns;
    while (duration_ns) duration_ns = take_turn(s, dev, duration_ns, &at);
    return at;
}

unsigned sg_busy_percent(const struct sg_busy *b, uint64_t since_us, uint64_t *now_us_out) {
    uint64_t now_ns = sg_wall_ns(), now_us = now_ns / 1000;
    if (now_us_out) *now_us_out = now_us;
    uint64_t start_us = since_us && since_us < now_us ? since_us : now_us - 1000000;
    /* The busy curve at the window's start, interpolated between the samples
     * around it; without a sample before it, the window starts at the oldest. */
    uint64_t before_ts = 0, before_busy = 0, after_ts = UINT64_MAX, after_busy = 0;
    for (int i = 0; i < SG_SAMPLES; i++) {
        uint64_t ts = atomic_load(&b->samples[i].ts_us);
        uint64_t busy = atomic_load(&b->samples[i].busy_ns);
        if (!ts || ts > now_us) continue;
        if (ts <= start_us && ts > before_ts) before_ts = ts, before_busy = busy;
        if (ts > start_us && ts < after_ts) after_ts = ts, after_busy = busy;
    }
    uint64_t busy_start;
    if (before_ts && after_ts != UINT64_MAX && after_busy >= before_busy) {
        busy_start = before_busy + (uint64_t)((double)(after_busy - before_busy) * (double)(start_us - before_ts) /
                                              (double)(after_ts - before_ts));
    } else if (before_ts) {
        busy_start = before_busy; /* no kernel ended since: the curve is flat from there */
    } else if (after_ts != UINT64_MAX) {
        start_us = after_ts, busy_start = after_busy; /* history starts later */
    } else {
        /* never sampled: only a kernel running right now counts */
        busy_start = atomic_load(&b->busy_ns);
    }
    uint64_t busy_now = atomic_load(&b->busy_ns);
    uint64_t rs = atomic_load(&b->running_since);
    if (rs && rs < now_ns) busy_now += now_ns - (rs > start_us * 1000 ? rs : start_us * 1000);
    uint64_t window_ns = (now_us - start_us) * 1000;
    if (!window_ns || busy_now <= busy_start) return 0;
    uint64_t pct = ((busy_now - busy_start) * 100 + window_ns / 2) / window_ns; /* rounded, not truncated */
    return pct > 100 ? 100 : (unsigned)pct;
}
