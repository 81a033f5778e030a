/* Initialisation: the environment (read once), the control block, this
 * process's ledger slot, fork and exit handling, and the reaper thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "internal.h"

_Atomic int gw_state;
struct gw_env gw_env;
struct gw_slot *_Atomic gw_slot;
__thread int gw_in_hook __attribute__((tls_model("initial-exec")));
__thread int gw_reentered __attribute__((tls_model("initial-exec")));

static pthread_once_t core_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t act_mu = PTHREAD_MUTEX_INITIALIZER;
static int reaper_running, atexit_done;

#define GW_REAP_PERIOD_NS 250000000L
/* Launch counts reach the ledger at most this late (counts.c); every
 * other flush the reaper also reaps. */
#define GW_FLUSH_PERIOD_NS 125000000L

uint64_t gw_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* gw_fatal writes one line to stderr with one write, so lines never mix. */
void gw_fatal(const char *fmt, ...) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "gpuwarden: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

static const char *get_env(const char *name, void *arg) {
    (void)arg;
    return getenv(name);
}

static void atfork_prepare(void) {
    pthread_mutex_lock(&act_mu);
    gw_context_atfork(0);
    pthread_mutex_lock(&gw_lim_mu);
    gw_memory_atfork(0);
    gw_counts_atfork(0);
}

static void atfork_parent(void) {
    gw_counts_atfork(1);
    gw_memory_atfork(1);
    pthread_mutex_unlock(&gw_lim_mu);
    gw_context_atfork(1);
    pthread_mutex_unlock(&act_mu);
}

/* The child is a new process: its own slot (claimed on its next call), none
 * of the parent's allocations, contexts or reaper thread. */
static void atfork_child(void) {
    gw_counts_atfork(2);
    gw_memory_atfork(2);
    pthread_mutex_init(&gw_lim_mu, NULL);
    gw_context_atfork(2);
    gw_tickets_atfork_child();
    pthread_mutex_init(&act_mu, NULL);
    reaper_running = 0;
    atomic_store(&gw_slot, NULL);
    int ready = GW_READY;
    atomic_compare_exchange_strong(&gw_state, &ready, GW_CORE);
}

static void core_init(void) {
    char err[768], cg[GW_CGROUP_V2_PATH_MAX], key[256];
    if (gw_env_parse(get_env, NULL, &gw_env, err, sizeof err)) {
        gw_fatal("%s", err);
        atomic_store(&gw_state, GW_FAILED);
        return;
    }
    /* The whole path, as the agent reads it, keys the control directory
     * (the ledger keeps its first GW_CGROUP_PATH_MAX - 1 bytes); without
     * one every hook fails, as with any control block it cannot trust. */
    if (gw_cgroup_read("/proc/self/cgroup", cg, sizeof cg, err, sizeof err) ||
        gw_container_key(cg, key, sizeof key) < 0 ||
        gw_ledger_open(gw_env.control_dir, key, cg, err, sizeof err) || gw_limits_open(err, sizeof err)) {
        gw_fatal("%s", err);
        atomic_store(&gw_state, GW_FAILED);
        return;
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atomic_store(&gw_state, GW_CORE);
}

int gw_core(void) {
    pthread_once(&core_once, core_init);
    return atomic_load(&gw_state);
}

/* The reaper: sums the threads' launch counts into the ledger, gives back
 * what dead processes held, releases stream-ordered frees that completed,
 * and picks up a limits file the agent wrote later. It wakes on a fixed
 * schedule, so the reaping's own time does not delay the counts. */
static void *reaper(void *arg) {
    (void)arg;
    gw_in_hook = 1; /* driver calls from here never count as the program's */
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (unsigned long tick = 1;; tick++) {
        next.tv_nsec += GW_FLUSH_PERIOD_NS;
        if (next.tv_nsec >= 1000000000L) next.tv_sec++, next.tv_nsec -= 1000000000L;
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR) {}
        gw_counts_flush();
        if (tick % (GW_REAP_PERIOD_NS / GW_FLUSH_PERIOD_NS)) continue;
        gw_reap_dead();
        gw_pending_poll(0);
        gw_limits_poll_file();
    }
    return NULL;
}

static void start_reaper(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay with the program's threads */
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 64 << 10);
    pthread_t t;
    reaper_running = pthread_create(&t, &a, reaper, NULL) == 0;
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int gw_activate(void) {
    int s = gw_core();
    if (s == GW_FAILED) return GW_FAILED_CUDA;
    if (s == GW_READY) return 0;
    if (gw_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&act_mu);
    if (atomic_load(&gw_state) == GW_CORE) {
        struct gw_slot *slot = gw_slot_claim();
        if (!slot) {
            gw_fatal("no free process slot in the container's ledger (%d processes use the GPU)", GW_MAX_SLOTS);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            atomic_store(&gw_slot, slot);
            gw_record_claims();
            if (!atexit_done) atexit_done = atexit(gw_slot_release_self) == 0;
            if (!reaper_running) start_reaper();
            atomic_store_explicit(&gw_state, GW_READY, memory_order_release);
        }
    }
    pthread_mutex_unlock(&act_mu);
    return rc;
}

GW_EXPORT CUresult cuInit(unsigned int Flags) {
    if (gw_core() == GW_FAILED) return GW_FAILED_CUDA;
    if (gw_cuda_load()) return CUDA_ERROR_NO_DEVICE;
    const int outer = gw_in_hook;
    if (GW_DRIVER_REENTRY(outer)) return gw_be.cuInit(Flags);
    gw_in_hook = 1;
    CUresult rc = gw_be.cuInit(Flags);
    if (rc == CUDA_SUCCESS) rc = gw_activate();
    if (rc == CUDA_SUCCESS) gw_record_devices();
    gw_in_hook = outer;
    return rc;
}
