/* A small hash table of records keyed by a 64-bit value (a device pointer,
 * a handle, a pool), with its own mutex. Used off the launch path only. */
#ifndef GW_TABLE_H
#define GW_TABLE_H

#include <pthread.h>
#include <stdint.h>

#include "cuda.h"

#define GW_TAB_BUCKETS 1024

struct gw_rec {
    uint64_t key;
    uint64_t bytes;   /* bytes reserved for it */
    CUcontext ctx;    /* allocations: the context they die with */
    int dev;          /* device charged; pools: location type */
    int kind;
    uint32_t maps;    /* VMM handles: live mappings */
    int released;     /* VMM handles: cuMemRelease called */
    uint64_t handle;  /* mappings: the handle mapped */
    struct gw_rec *next;
};

struct gw_tab {
    pthread_mutex_t mu;
    struct gw_rec *b[GW_TAB_BUCKETS];
};

static inline struct gw_rec **gw_tab_slot(struct gw_tab *t, uint64_t key) {
    struct gw_rec **pp = &t->b[(key * 0x9E3779B97F4A7C15ull) >> 54];
    while (*pp && (*pp)->key != key) pp = &(*pp)->next;
    return pp;
}

/* the caller holds t->mu for these two */
static inline struct gw_rec *gw_tab_find(struct gw_tab *t, uint64_t key) { return *gw_tab_slot(t, key); }
static inline struct gw_rec *gw_tab_take_locked(struct gw_tab *t, uint64_t key) {
    struct gw_rec **pp = gw_tab_slot(t, key), *r = *pp;
    if (r) *pp = r->next;
    return r;
}

static inline void gw_tab_put(struct gw_tab *t, struct gw_rec *r) {
    pthread_mutex_lock(&t->mu);
    struct gw_rec **head = &t->b[(r->key * 0x9E3779B97F4A7C15ull) >> 54];
    r->next = *head;
    *head = r;
    pthread_mutex_unlock(&t->mu);
}

static inline struct gw_rec *gw_tab_take(struct gw_tab *t, uint64_t key) {
    pthread_mutex_lock(&t->mu);
    struct gw_rec *r = gw_tab_take_locked(t, key);
    pthread_mutex_unlock(&t->mu);
    return r;
}

/* after fork: the records are the parent's; drop them (leaked, not freed:
 * another thread of the parent may have been inside malloc) */
static inline void gw_tab_reset(struct gw_tab *t) {
    pthread_mutex_init(&t->mu, NULL);
    for (int i = 0; i < GW_TAB_BUCKETS; i++) t->b[i] = NULL;
}

#endif
