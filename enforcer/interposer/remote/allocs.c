/* The client's table of the session's device memory: every allocation and
 * mapping the worker made for this process. Frees, host-to-device copies and
 * memsets are asynchronous, yet a pointer the session does not own is
 * refused at the call, as the driver refuses it, not at a later
 * synchronization. Sorted by base; looked up by binary search. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

struct range {
    uint64_t base, end;
    uint64_t ctx; /* the context it goes with; 0: a mapping, which outlives contexts */
    int mapped;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct range *g_r;
static size_t g_n, g_cap;

/* first_above: the index of the first range with base > p. */
static size_t first_above(uint64_t p) {
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_r[mid].base <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

void gwr_alloc_add(uint64_t base, uint64_t bytes, uint64_t ctx, int mapped) {
    if (!bytes || base + bytes < base) return;
    pthread_mutex_lock(&g_mu);
    if (g_n == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 64;
        struct range *r = realloc(g_r, cap * sizeof *r);
        if (!r) { /* not tracked: its frees and copies are refused, never wrongly allowed */
            pthread_mutex_unlock(&g_mu);
            return;
        }
        g_r = r;
        g_cap = cap;
    }
    size_t i = first_above(base);
    memmove(g_r + i + 1, g_r + i, (g_n - i) * sizeof *g_r);
    g_r[i] = (struct range){base, base + bytes, ctx, mapped};
    g_n++;
    pthread_mutex_unlock(&g_mu);
}

static void del_at(size_t i) {
    memmove(g_r + i, g_r + i + 1, (g_n - i - 1) * sizeof *g_r);
    g_n--;
}

/* gwr_alloc_take forgets the allocation at base (not a mapping); -1 if there is none. */
int gwr_alloc_take(uint64_t base) {
    pthread_mutex_lock(&g_mu);
    size_t i = first_above(base);
    int rc = -1;
    if (i && g_r[i - 1].base == base && !g_r[i - 1].mapped) {
        del_at(i - 1);
        rc = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* gwr_alloc_unmap forgets the mappings inside [base, base+bytes). */
void gwr_alloc_unmap(uint64_t base, uint64_t bytes) {
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_n;) {
        if (g_r[i].mapped && g_r[i].base >= base && g_r[i].end <= base + bytes) del_at(i);
        else i++;
    }
    pthread_mutex_unlock(&g_mu);
}

/* gwr_alloc_has: whether [p, p+n) lies in one allocation or mapping. */
int gwr_alloc_has(uint64_t p, uint64_t n) {
    pthread_mutex_lock(&g_mu);
    size_t i = first_above(p);
    int ok = i && p + n >= p && p + n <= g_r[i - 1].end;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* gwr_alloc_drop_ctx forgets a destroyed context's memory, which went with it. */
void gwr_alloc_drop_ctx(uint64_t ctx) {
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_n;) {
        if (!g_r[i].mapped && g_r[i].ctx == ctx) del_at(i);
        else i++;
    }
    pthread_mutex_unlock(&g_mu);
}

/* gwr_alloc_forget_all: a forked child's session owns nothing yet. */
void gwr_alloc_forget_all(void) {
    pthread_mutex_init(&g_mu, NULL);
    g_n = 0;
}
