/* Launch counts per thread (internal.h, struct gw_cell): each thread that
 * launches gets a cell on its first launch, from a fixed pool (then the
 * heap), and gives it back when it exits, once its counts are summed. Only
 * the summing takes cells_mu: registering, a thread's exit, the reaper and
 * exit; never a launch. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define GW_CELL_POOL 256 /* launching threads served without the heap */

__thread struct gw_cell *gw_my_cell __attribute__((tls_model("initial-exec")));

static pthread_mutex_t cells_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gw_cell pool[GW_CELL_POOL];
static int pool_used;
static struct gw_cell *cells, *spare; /* cells of live threads; cells to reuse */
static int closed;                    /* exit summed the counts; the slot is no longer ours */
static pthread_key_t cell_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* sum adds what a cell counted since the last sum to the slot and the
 * per-device counters. The placed counts are read first and added last, so
 * that a reader never sees more launches placed than launches. */
static void sum(struct gw_cell *c, struct gw_slot *s) {
    uint64_t placed[GW_MAX_DEVICES], nplaced = 0;
    for (int d = 0; d < GW_MAX_DEVICES; d++) placed[d] = atomic_load_explicit(&c->placed[d], memory_order_acquire);
    uint64_t n = atomic_load_explicit(&c->launches, memory_order_relaxed);
    if (n != c->summed) atomic_fetch_add(&s->launches, n - c->summed);
    c->summed = n;
    for (int d = 0; d < GW_MAX_DEVICES; d++) {
        uint64_t delta = placed[d] - c->summed_placed[d];
        if (!delta) continue;
        c->summed_placed[d] = placed[d];
        nplaced += delta;
        if (gw_usage_per_dev) atomic_fetch_add(&gw_usage->launches_dev[d], delta);
    }
    if (nplaced && gw_usage_per_dev) atomic_fetch_add(&s->launches_placed, nplaced);
}

/* our_slot is the slot counts go to: none before this process has one and
 * after exit gave it back (another process may have claimed it since). */
static struct gw_slot *our_slot(void) {
    struct gw_slot *s = atomic_load(&gw_slot);
    return s && !closed && atomic_load(&s->pid) == getpid() ? s : NULL;
}

/* thread_exit destroys an exiting thread's mark events, sums its cell
 * and keeps it for another thread. A launch after this (from a later key destructor) gets a cell
 * anew. */
static void thread_exit(void *p) {
    struct gw_cell *c = p;
    for (int d = 0; d < GW_MAX_DEVICES; d++)
        if (c->mark_ev[d]) gw_be.cuEventDestroy_v2(c->mark_ev[d]);
    pthread_mutex_lock(&cells_mu);
    struct gw_slot *s = our_slot();
    if (s) sum(c, s);
    for (struct gw_cell **pp = &cells; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    c->next = spare;
    spare = c;
    pthread_mutex_unlock(&cells_mu);
    gw_my_cell = NULL;
}

static void make_key(void) {
    if (pthread_key_create(&cell_key, thread_exit)) cell_key = (pthread_key_t)-1;
}

struct gw_cell *gw_cell_new(void) {
    pthread_once(&key_once, make_key);
    if (cell_key == (pthread_key_t)-1) return NULL; /* its counts could not be summed at its exit */
    pthread_mutex_lock(&cells_mu);
    struct gw_cell *c = spare;
    if (c) spare = c->next;
    else if (pool_used < GW_CELL_POOL) c = &pool[pool_used++];
    else c = malloc(sizeof *c);
    if (c) {
        memset(c, 0, sizeof *c);
        c->next = cells;
        cells = c;
    }
    pthread_mutex_unlock(&cells_mu);
    if (c && pthread_setspecific(cell_key, c)) {
        thread_exit(c);
        return NULL;
    }
    gw_my_cell = c;
    return c;
}

void gw_counts_flush(void) {
    pthread_mutex_lock(&cells_mu);
    struct gw_slot *s = our_slot();
    if (s)
        for (struct gw_cell *c = cells; c; c = c->next) sum(c, s);
    pthread_mutex_unlock(&cells_mu);
}

void gw_counts_close(void) {
    pthread_mutex_lock(&cells_mu);
    struct gw_slot *s = our_slot();
    if (s)
        for (struct gw_cell *c = cells; c; c = c->next) sum(c, s);
    closed = 1;
    pthread_mutex_unlock(&cells_mu);
}

/* A fork child is a new process with one thread and a slot of its own:
 * only the forking thread's cell stays in use, from zero; the others'
 * threads are not in the child and their cells are reused. */
void gw_counts_atfork(int phase) {
    if (phase == 0) {
        pthread_mutex_lock(&cells_mu);
        return;
    }
    if (phase == 1) {
        pthread_mutex_unlock(&cells_mu);
        return;
    }
    pthread_mutex_init(&cells_mu, NULL);
    closed = 0;
    struct gw_cell *mine = gw_my_cell;
    for (struct gw_cell *c = cells, *next; c; c = next) {
        next = c->next;
        if (c == mine) continue;
        c->next = spare;
        spare = c;
    }
    cells = mine;
    if (mine) {
        memset(mine, 0, sizeof *mine);
        mine->next = NULL;
    }
}
