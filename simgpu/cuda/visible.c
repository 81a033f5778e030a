/* CUDA_VISIBLE_DEVICES: which of the machine's devices this process sees and
 * in what order, read as NVIDIA's driver reads it. Unset: every device. A
 * comma list of indices or "GPU-<uuid>" (a unique prefix is enough) numbers
 * the devices it names from 0 in its order; the first entry that names no
 * device, or one already named, ends the list; an empty value hides every
 * device. NVML is not filtered, as with NVIDIA. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_index[SG_MAX_DEVICES]; /* ordinal -> the machine's device index */
static int g_count;

/* by_uuid finds the one device whose UUID starts with [e, e+n), or -1. */
static int by_uuid(const struct sg_state *s, const char *e, size_t n) {
    int found = -1;
    for (uint32_t i = 0; i < s->ndev; i++) {
        if (strlen(s->dev[i].uuid) < n || strncmp(s->dev[i].uuid, e, n)) continue;
        if (found >= 0) return -1; /* ambiguous */
        found = (int)i;
    }
    return found;
}

/* by_index reads decimal digits [e, e+n) as a device index, or -1. */
static int by_index(const struct sg_state *s, const char *e, size_t n) {
    if (n == 0 || n > 3) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (e[i] < '0' || e[i] > '9') return -1;
        v = v * 10 + (e[i] - '0');
    }
    return (uint32_t)v < s->ndev ? v : -1;
}

static int named(const struct sg_state *s, const char *e, size_t n) {
    return n >= 4 && !strncmp(e, "GPU-", 4) ? by_uuid(s, e, n) : by_index(s, e, n);
}

static void read_visible(void) {
    const struct sg_state *s = sg_state_get();
    if (!s) return;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (uint32_t i = 0; i < s->ndev; i++) g_index[g_count++] = (int)i;
        return;
    }
    while (*v) {
        size_t n = strcspn(v, ",");
        int idx = named(s, v, n);
        for (int i = 0; i < g_count && idx >= 0; i++)
            if (g_index[i] == idx) idx = -1;
        if (idx < 0) return;
        g_index[g_count++] = idx;
        if (!v[n]) return;
        v += n + 1;
    }
}

int sg_visible_count(void) {
    pthread_once(&g_once, read_visible);
    return g_count;
}

int sg_dev_index(CUdevice ordinal) {
    return ordinal >= 0 && ordinal < sg_visible_count() ? g_index[ordinal] : -1;
}
