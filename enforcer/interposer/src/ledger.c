/* The container's ledger (usage) and the agent's limits: mapping and
 * validating the files, the quota reservation (a CAS on the container-wide
 * counter), process slots and reaping the slots of dead processes. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cbcheck.h"
#include "internal.h"

struct gw_usage *gw_usage;
int gw_usage_per_dev, gw_usage_minor;
_Atomic int gw_ndev_visible;
struct gw_limits *_Atomic gw_limits;
_Atomic uint64_t gw_limits_seq;
_Atomic uint32_t gw_snap_gate_mask;
_Atomic uint64_t gw_snap_grace;
_Atomic uint64_t gw_limits_bad_since;
static _Atomic uint64_t snap_mem[GW_MAX_DEVICES];
static _Atomic uint64_t snap_ctx_reserve, snap_generation;
static char limits_path[GW_CONTROL_DIR_MAX + 300];
static _Atomic int limits_bad_logged;
static _Atomic uint64_t limits_dev, limits_ino; /* the file gw_limits maps */
static int usage_fd = -1;
pthread_mutex_t gw_lim_mu = PTHREAD_MUTEX_INITIALIZER;

static int mkdir_p(char *path, mode_t mode) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir(path, mode);
        *p = '/';
        if (rc && errno != EEXIST) return -1;
    }
    return mkdir(path, mode) && errno != EEXIST ? -1 : 0;
}

static uint64_t cgroup_id_of(const char *cgpath) {
    /* A cgroup outside this cgroup namespace's root ("/../x") is not below
     * the mount as this process sees it: joined to it, the path would name
     * another directory (on a hybrid host, a v1 hierarchy beside it). */
    if (!strncmp(cgpath, "/..", 3) && (cgpath[3] == '/' || !cgpath[3])) return 0;
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f) return 0;
    char line[4096], mnt[4096] = "";
    while (fgets(line, sizeof line, f)) {
        char *sep = strstr(line, " - cgroup2 ");
        if (!sep) continue;
        /* "36 35 0:31 / /sys/fs/cgroup rw,... - cgroup2 ..." */
        char *p = line;
        for (int field = 0; field < 4 && p; field++) p = strchr(p + 1, ' ');
        if (!p) continue;
        char *end = strchr(p + 1, ' ');
        if (!end) continue;
        snprintf(mnt, sizeof mnt, "%.*s", (int)(end - p - 1), p + 1);
        break;
    }
    fclose(f);
    if (!mnt[0]) return 0;
    char path[8192];
    snprintf(path, sizeof path, "%s%s", mnt, cgpath);
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* open_usage opens the container's ledger: a regular file, never through a
 * symlink, never blocking (a FIFO or device is refused, not waited on).
 * Standalone mode (no limits yet) makes the directory and the file; under
 * an agent the directory is the agent's and is never made here, and the
 * file is made only where the agent left none and the directory lets this
 * process write (an agent or device plugin makes it, in a directory the
 * container cannot write). */
static int open_usage(const char *dir, const char *key, char *path, size_t pathlen, char *err, size_t errlen) {
    struct stat st;
    int agent = lstat(limits_path, &st) == 0 || errno != ENOENT;
    snprintf(path, pathlen, "%s/%s", dir, key);
    if (!agent && mkdir_p(path, 0755)) {
        snprintf(err, errlen, "make control directory %s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, pathlen, "%s/%s/usage", dir, key);
    const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int fd = open(path, flags);
    if (fd < 0 && errno == ENOENT) fd = open(path, flags | O_CREAT | (agent ? O_EXCL : 0), 0666);
    if (fd < 0 && agent && errno == EEXIST) fd = open(path, flags); /* another process of the container made it */
    if (fd < 0) {
        snprintf(err, errlen, "open ledger %s: %s", path, errno == ELOOP ? "is a symlink" : strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "ledger %s: not a regular file", path);
        close(fd);
        return -1;
    }
    return fd;
}

/* name_cgroup writes the cgroup's path into the ledger where it fits, and
 * leaves it empty where it does not: a cut path names another cgroup, and a
 * cut inside a UTF-8 character is a ledger the agent cannot read. The
 * cgroup's id names it either way. */
static void name_cgroup(struct gw_usage *u, const char *cgpath) {
    size_t n = strlen(cgpath);
    if (n >= sizeof u->cgroup_path) n = 0;
    memcpy(u->cgroup_path, cgpath, n);
    u->cgroup_path[n] = 0;
}

/* rebind makes a ledger laid out earlier speak for this process's cgroup:
 * a container restarted in a new cgroup (of the same path, or in the same
 * allocation on Kubernetes) finds the ledger it left, which names the
 * cgroup it was laid out in. One directory serves one cgroup at a time, so
 * the newest process's is the one. */
static void rebind(struct gw_usage *u, const char *cgpath) {
    uint64_t id = cgroup_id_of(cgpath);
    if (!id || atomic_load(&u->cgroup_id) == id) return;
    name_cgroup(u, cgpath);
    atomic_store(&u->cgroup_id, id);
}

int gw_ledger_open(const char *dir, const char *key, const char *cgpath, char *err, size_t errlen) {
    char path[GW_CONTROL_DIR_MAX + 300];
    snprintf(limits_path, sizeof limits_path, "%s/%s/limits", dir, key);
    int fd = open_usage(dir, key, path, sizeof path, err, errlen);
    if (fd < 0) return -1;
    flock(fd, LOCK_EX); /* the first process lays the ledger out */
    struct stat st;
    const char *bad = NULL;
    if (fstat(fd, &st)) bad = strerror(errno);
    else if (st.st_size == 0 && ftruncate(fd, sizeof(struct gw_usage))) bad = strerror(errno);
    else if (st.st_size != 0 && (size_t)st.st_size != sizeof(struct gw_usage)) bad = "size differs from this ABI's ledger";
    struct gw_usage *u = MAP_FAILED;
    if (!bad) {
        u = mmap(NULL, sizeof *u, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (u == MAP_FAILED) bad = strerror(errno);
    }
    if (!bad && st.st_size == 0) {
        fchmod(fd, 0666); /* every user of the container may write its slot */
        u->abi_major = GW_ABI_MAJOR;
        u->abi_minor = GW_ABI_MINOR;
        u->size = sizeof *u;
        u->max_devices = GW_MAX_DEVICES;
        u->max_slots = GW_MAX_SLOTS;
        u->slot_size = sizeof(struct gw_slot);
        name_cgroup(u, cgpath);
        atomic_store(&u->cgroup_id, cgroup_id_of(cgpath));
        __atomic_store_n(&u->magic, GW_USAGE_MAGIC, __ATOMIC_RELEASE);
    }
    if (!bad) bad = gw_usage_check(u, sizeof *u);
    if (!bad) rebind(u, cgpath);
    flock(fd, LOCK_UN);
    if (bad) {
        if (u != MAP_FAILED) munmap(u, sizeof *u);
        close(fd);
        snprintf(err, errlen, "ledger %s: %s", path, bad);
        return -1;
    }
    usage_fd = fd;
    gw_usage_minor = __atomic_load_n(&u->abi_minor, __ATOMIC_RELAXED); /* its creator's minor, fixed */
    gw_usage_per_dev = gw_usage_minor >= 1;
    gw_usage = u;
    return 0;
}

/* ---- limits ---- */

/* read_limits takes one consistent copy of the header and config under the
 * seqlock: 0, or -1 when the agent kept it odd for too long. */
static int read_limits(struct gw_limits *l, struct gw_limits_view *v, uint64_t *seq) {
    for (int tries = 0; tries < 10000; tries++) {
        uint64_t s1 = atomic_load_explicit(&l->seq, memory_order_acquire);
        if (s1 & 1) {
            sched_yield();
            continue;
        }
        /* the header words are plain fields: read each once, as the writer left them */
        v->magic = __atomic_load_n(&l->magic, __ATOMIC_RELAXED);
        v->abi_major = __atomic_load_n(&l->abi_major, __ATOMIC_RELAXED);
        v->abi_minor = __atomic_load_n(&l->abi_minor, __ATOMIC_RELAXED);
        v->size = __atomic_load_n(&l->size, __ATOMIC_RELAXED);
        for (int d = 0; d < GW_MAX_DEVICES; d++) v->mem_limit[d] = atomic_load_explicit(&l->mem_limit[d], memory_order_relaxed);
        v->generation = atomic_load_explicit(&l->generation, memory_order_relaxed);
        v->context_reserve = atomic_load_explicit(&l->context_reserve, memory_order_relaxed);
        v->grace_ns = atomic_load_explicit(&l->grace_ns, memory_order_relaxed);
        v->gate_mask = atomic_load_explicit(&l->gate_mask, memory_order_relaxed);
        v->ndev = atomic_load_explicit(&l->ndev, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&l->seq, memory_order_relaxed) != s1) continue;
        *seq = s1;
        return 0;
    }
    return -1;
}

static void adopt(const struct gw_limits_view *v, uint64_t seq) {
    for (int d = 0; d < GW_MAX_DEVICES; d++) atomic_store_explicit(&snap_mem[d], v->mem_limit[d], memory_order_relaxed);
    atomic_store_explicit(&snap_generation, v->generation, memory_order_relaxed);
    atomic_store_explicit(&snap_ctx_reserve, v->context_reserve, memory_order_relaxed);
    atomic_store_explicit(&gw_snap_grace, v->grace_ns ? v->grace_ns : GW_DEFAULT_GRACE_NS, memory_order_relaxed);
    atomic_store_explicit(&gw_snap_gate_mask, v->gate_mask, memory_order_relaxed);
    atomic_store_explicit(&gw_limits_bad_since, 0, memory_order_relaxed);
    atomic_store_explicit(&gw_limits_seq, seq, memory_order_release);
}

/* map_limits maps and validates the limits file: 1 mapped, 0 absent, -1 bad.
 * Only a regular file is taken, never through a symlink, never blocking. */
static int map_limits(char *err, size_t errlen) {
    int fd = open(limits_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "open limits %s: %s", limits_path, errno == ELOOP ? "is a symlink" : strerror(errno));
        return -1;
    }
    struct stat st;
    const char *bad = NULL;
    struct gw_limits *l = MAP_FAILED;
    struct gw_limits_view v;
    uint64_t seq = 0;
    if (fstat(fd, &st)) bad = strerror(errno);
    else if (!S_ISREG(st.st_mode)) bad = "not a regular file";
    else if ((size_t)st.st_size < sizeof *l) bad = "file shorter than this ABI's limits";
    if (!bad && (l = mmap(NULL, sizeof *l, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) bad = strerror(errno);
    if (!bad) bad = gw_limits_check_header(l, sizeof *l);
    if (!bad && read_limits(l, &v, &seq)) bad = "the agent never finished writing it";
    if (!bad) bad = gw_limits_check_view(&v, 0);
    close(fd);
    if (bad) {
        if (l != MAP_FAILED) munmap(l, sizeof *l);
        snprintf(err, errlen, "limits %s: %s", limits_path, bad);
        return -1;
    }
    pthread_mutex_lock(&gw_lim_mu);
    adopt(&v, seq);
    atomic_store(&limits_dev, (uint64_t)st.st_dev);
    atomic_store(&limits_ino, (uint64_t)st.st_ino);
    atomic_store_explicit(&gw_limits, l, memory_order_release);
    pthread_mutex_unlock(&gw_lim_mu);
    return 1;
}

int gw_limits_open(char *err, size_t errlen) {
    /* until the agent's limits are read, the environment's hold */
    for (int d = 0; d < GW_MAX_DEVICES; d++) atomic_store(&snap_mem[d], gw_env.mem_limit[d]);
    atomic_store(&gw_snap_grace, GW_DEFAULT_GRACE_NS);
    return map_limits(err, errlen) < 0 ? -1 : 0;
}

/* gw_limits_poll_file maps limits once the agent writes it, and follows it
 * when the agent replaces it: a limits file the agent did not write (one
 * made before it adopted the directory) is replaced by rename, and every
 * process must then read the new one. A replacement that fails its check
 * keeps the last good limits. The old mapping is never unmapped: another
 * thread may still be reading it (one page per replacement). */
void gw_limits_poll_file(void) {
    if (!limits_path[0]) return;
    int mapped = atomic_load(&gw_limits) != NULL;
    if (mapped) {
        struct stat st;
        if (lstat(limits_path, &st) || !S_ISREG(st.st_mode) ||
            ((uint64_t)st.st_dev == atomic_load(&limits_dev) && (uint64_t)st.st_ino == atomic_load(&limits_ino)))
            return;
    }
    char err[512];
    if (map_limits(err, sizeof err) < 0 && !atomic_exchange(&limits_bad_logged, 1))
        gw_fatal("%s; keeping the %s limits", err, mapped ? "last good" : "environment's");
}

/* gw_limits_refresh takes a consistent copy of the agent's config (seqlock)
 * and re-checks the header with it. A bad read fails closed: the last good
 * limits stay in force (nothing is lifted), the gate treats the agent as
 * silent from then on, and the read is not retried until seq moves again. */
void gw_limits_refresh(void) {
    struct gw_limits *l = atomic_load_explicit(&gw_limits, memory_order_acquire);
    if (!l || pthread_mutex_trylock(&gw_lim_mu)) return;
    struct gw_limits_view v;
    uint64_t seq;
    if (!read_limits(l, &v, &seq)) {
        const char *bad = gw_limits_check_view(&v, atomic_load_explicit(&snap_generation, memory_order_relaxed));
        if (!bad) {
            adopt(&v, seq);
        } else {
            if (!atomic_load_explicit(&gw_limits_bad_since, memory_order_relaxed))
                atomic_store_explicit(&gw_limits_bad_since, gw_now_ns(), memory_order_relaxed);
            atomic_store_explicit(&gw_limits_seq, seq, memory_order_release);
            if (!atomic_exchange(&limits_bad_logged, 1))
                gw_fatal("limits %s: %s; keeping the last good limits", limits_path, bad);
        }
    }
    pthread_mutex_unlock(&gw_lim_mu);
}

uint64_t gw_limit(int dev) {
    if (dev < 0 || dev >= GW_MAX_DEVICES) return 0;
    gw_limits_check();
    return atomic_load_explicit(&snap_mem[dev], memory_order_relaxed);
}

uint64_t gw_context_reserve(void) {
    uint64_t r = atomic_load_explicit(&snap_ctx_reserve, memory_order_relaxed);
    return r ? r : GW_DEFAULT_CONTEXT_RESERVE;
}

uint64_t gw_generation(void) { return atomic_load(&snap_generation); }

/* ---- reservations ---- */

int gw_reserve(int dev, uint64_t bytes) {
    struct gw_slot *me = atomic_load(&gw_slot);
    if (dev < 0 || dev >= GW_MAX_DEVICES || !me) return 0;
    _Atomic uint64_t *ctr = &gw_usage->reserved_bytes[dev];
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t limit = gw_limit(dev);
        uint64_t cur = atomic_load(ctr);
        while (cur <= UINT64_MAX - bytes && (!limit || (cur <= limit && bytes <= limit - cur))) {
            if (atomic_compare_exchange_weak(ctr, &cur, cur + bytes)) {
                atomic_fetch_add(&me->bytes[dev], bytes);
                return 1;
            }
        }
        if (attempt == 0) gw_reap_dead();       /* a dead process may hold what we need */
        else if (attempt == 1) gw_pending_poll(1); /* our own stream-ordered frees may be due */
    }
    atomic_fetch_add(&gw_usage->alloc_failures[dev], 1);
    atomic_fetch_add(&me->alloc_failures, 1);
    return 0;
}

void gw_release(int dev, uint64_t bytes) {
    struct gw_slot *me = atomic_load(&gw_slot);
    if (dev < 0 || dev >= GW_MAX_DEVICES || !bytes) return;
    /* the slot first: a reaper subtracting the slot must never see more than the counter holds */
    if (me) atomic_fetch_sub(&me->bytes[dev], bytes);
    atomic_fetch_sub(&gw_usage->reserved_bytes[dev], bytes);
}

/* ---- slots ---- */

uint64_t gw_proc_start_time(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!p) return 0;
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

static int slot_alive(int pid, uint64_t start) {
    if (pid <= 0) return 0; /* garbage: the ledger is untrusted */
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t now = gw_proc_start_time(pid);
    return now == 0 || now == start; /* unreadable /proc: assume alive */
}

/* release_slot gives a slot's bytes back; the caller won the slot by CAS. */
static void release_slot(struct gw_slot *s) {
    for (int d = 0; d < GW_MAX_DEVICES; d++) {
        uint64_t b = atomic_exchange(&s->bytes[d], 0);
        if (b) atomic_fetch_sub(&gw_usage->reserved_bytes[d], b);
    }
    atomic_store(&s->state, GW_SLOT_FREE);
}

void gw_reap_dead(void) {
    if (!gw_usage) return;
    struct gw_slot *me = atomic_load(&gw_slot);
    for (int i = 0; i < GW_MAX_SLOTS; i++) {
        struct gw_slot *s = &gw_usage->slots[i];
        if (s == me || atomic_load(&s->state) != GW_SLOT_LIVE) continue;
        if (slot_alive(atomic_load(&s->pid), atomic_load(&s->start_time))) continue;
        uint32_t live = GW_SLOT_LIVE;
        if (atomic_compare_exchange_strong(&s->state, &live, GW_SLOT_REAPING)) release_slot(s);
    }
}

struct gw_slot *gw_slot_claim(void) {
    int pid = getpid();
    uint64_t start = gw_proc_start_time(pid);
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < GW_MAX_SLOTS; i++) {
            struct gw_slot *s = &gw_usage->slots[i];
            uint32_t free_state = GW_SLOT_FREE;
            if (!atomic_compare_exchange_strong(&s->state, &free_state, GW_SLOT_CLAIMING)) continue;
            atomic_store(&s->pid, pid);
            atomic_store(&s->start_time, start);
            for (int d = 0; d < GW_MAX_DEVICES; d++) atomic_store(&s->bytes[d], 0);
            atomic_store(&s->launches, 0);
            atomic_store(&s->throttled_ns, 0);
            atomic_store(&s->alloc_failures, 0);
            if (gw_usage_per_dev) {
                atomic_store(&s->launches_placed, 0);
                atomic_store(&s->throttled_placed_ns, 0);
            }
            atomic_store_explicit(&s->state, GW_SLOT_LIVE, memory_order_release);
            return s;
        }
        gw_reap_dead();
    }
    return NULL;
}

void gw_slot_release_self(void) {
    struct gw_slot *s = atomic_load(&gw_slot);
    if (!s || atomic_load(&s->pid) != getpid()) return;
    gw_counts_close();
    uint32_t live = GW_SLOT_LIVE;
    if (atomic_compare_exchange_strong(&s->state, &live, GW_SLOT_REAPING)) release_slot(s);
}

/* gw_record_claims writes what the environment asks for, for the agent. */
void gw_record_claims(void) {
    struct gw_usage *u = gw_usage;
    for (int d = 0; d < GW_MAX_DEVICES; d++) atomic_store(&u->claim_mem_limit[d], gw_env.mem_limit[d]);
    atomic_store(&u->claim_weight, gw_env.weight);
    atomic_store(&u->claim_compute_limit, gw_env.compute_limit);
    atomic_store(&u->claim_priority, gw_env.priority);
    atomic_store(&u->claim_flags, gw_env.mem_set ? GW_CLAIM_MEMORY_SET : 0);
}

/* gw_record_devices notes each ordinal's UUID, so that the agent and NVML
 * views can tell which physical device an ordinal is. */
void gw_record_devices(void) {
    int n = 0;
    if (!gw_be.cuDeviceGetCount || gw_be.cuDeviceGetCount(&n) || n <= 0) return;
    if (n > GW_MAX_DEVICES) n = GW_MAX_DEVICES;
    atomic_store_explicit(&gw_ndev_visible, n, memory_order_relaxed);
    atomic_store(&gw_usage->ndev, (uint32_t)n);
    flock(usage_fd, LOCK_EX);
    for (int d = 0; d < n; d++) {
        CUuuid id;
        if (gw_be.cuDeviceGetUuid && !gw_be.cuDeviceGetUuid(&id, d) && memcmp(gw_usage->dev_uuid[d], id.bytes, 16))
            memcpy(gw_usage->dev_uuid[d], id.bytes, 16);
    }
    flock(usage_fd, LOCK_UN);
}
