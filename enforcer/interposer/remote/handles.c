/* The client's handles for streams, events, modules, graphs and pools: small
 * objects holding the name the worker knows the real one by. Creating one
 * needs no round trip; a stale or foreign handle finds a cleared magic and is
 * refused at once, as the driver refuses it. Freed objects are reused, never
 * returned to malloc, so a stale handle never points at freed memory. */
#include <pthread.h>
#include <stdlib.h>

#include "client.h"

#define GWR_OBJ_MAGIC 0x474f424au

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gwr_obj *g_free;

void *gwr_obj_new(uint32_t kind) {
    pthread_mutex_lock(&g_mu);
    struct gwr_obj *o = g_free;
    if (o) g_free = o->next;
    pthread_mutex_unlock(&g_mu);
    if (!o && !(o = calloc(1, sizeof *o))) return NULL;
    o->id = gwr_new_id();
    o->kind = kind;
    __atomic_store_n(&o->magic, GWR_OBJ_MAGIC, __ATOMIC_RELEASE);
    return o;
}

uint64_t gwr_obj_id(const void *h, uint32_t kind) {
    const struct gwr_obj *o = h;
    if (!o || __atomic_load_n(&o->magic, __ATOMIC_ACQUIRE) != GWR_OBJ_MAGIC || o->kind != kind) return 0;
    return o->id;
}

void gwr_obj_free(void *h) {
    struct gwr_obj *o = h;
    __atomic_store_n(&o->magic, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_mu);
    o->next = g_free;
    g_free = o;
    pthread_mutex_unlock(&g_mu);
}
