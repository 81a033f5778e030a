/* Parsing the environment and deriving the container key: pure functions,
 * no allocation, fuzzed (fuzz/) and mirrored in Go (enforcer/controlblock). */
#include "env.h"

#include <stdio.h>
#include <string.h>

/* parse_u64 parses decimal digits [s, end) without overflow. */
static int parse_u64(const char *s, const char *end, uint64_t *out) {
    if (s == end) return -1;
    uint64_t v = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9') return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* parse_size parses one "<digits>[Ki|Mi|Gi|Ti]" in [s, end); bare is GiB. */
static int parse_size(const char *s, const char *end, uint64_t *out) {
    static const struct {
        char suffix[3];
        unsigned shift;
    } units[] = {GW_SIZE_UNITS};
    const char *num_end = s;
    while (num_end < end && *num_end >= '0' && *num_end <= '9') num_end++;
    uint64_t v;
    unsigned shift = GW_SIZE_BARE_SHIFT;
    if (parse_u64(s, num_end, &v)) return -1;
    size_t unit = (size_t)(end - num_end);
    if (unit) {
        size_t i = 0;
        while (i < sizeof units / sizeof units[0] && (unit != 2 || memcmp(num_end, units[i].suffix, 2))) i++;
        if (i == sizeof units / sizeof units[0]) return -1;
        shift = units[i].shift;
    }
    if (v > (UINT64_MAX >> shift)) return -1;
    *out = v << shift;
    return 0;
}

/* parse_gib parses one cGPU value in [s, end): an integer number of GiB. */
static int parse_gib(const char *s, const char *end, uint64_t *out) {
    uint64_t v;
    if (parse_u64(s, end, &v) || v > GW_MAX_GIB) return -1;
    *out = v << 30;
    return 0;
}

/* parse_list parses a per-device list: values for ordinals 0, 1, ... in
 * order, at most GW_MAX_DEVICES, the last repeating for the rest. */
static int parse_list(const char *s, int (*one)(const char *, const char *, uint64_t *),
                      uint64_t out[GW_MAX_DEVICES]) {
    if (!s || !*s) return -1;
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        if (n == GW_MAX_DEVICES) return -1;
        if (one(p, end, &out[n])) return -1;
        n++;
        if (!comma) break;
        p = comma + 1;
    }
    for (int i = n; i < GW_MAX_DEVICES; i++) out[i] = out[n - 1];
    return 0;
}

int gw_parse_mem_list(const char *s, uint64_t out[GW_MAX_DEVICES]) { return parse_list(s, parse_size, out); }

int gw_parse_gib_list(const char *s, uint64_t out[GW_MAX_DEVICES]) { return parse_list(s, parse_gib, out); }

/* parse_int parses a decimal integer in [s, end) within [lo, hi]. */
static int parse_int(const char *s, const char *end, uint64_t lo, uint64_t hi, uint32_t *out) {
    uint64_t v;
    if (parse_u64(s, end, &v) || v < lo || v > hi) return -1;
    *out = (uint32_t)v;
    return 0;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        return -1;                                                                                 \
    } while (0)

/* show keeps a hostile value from making the message long or multi-line. */
static const char *show(const char *v, char *buf, size_t n) {
    size_t i = 0;
    for (; v[i] && i + 1 < n; i++) buf[i] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
    buf[i] = 0;
    if (v[i] && n > 4) memcpy(buf + n - 4, "...", 4);
    return buf;
}

int gw_env_parse(gw_getenv_fn get, void *arg, struct gw_env *out, char *err, size_t errlen) {
    char b[48];
    memset(out, 0, sizeof *out);
    out->weight = 1;
    out->priority = GW_PRIORITY_NORMAL;

    const char *v = get("GPUWARDEN_MEMORY_LIMIT", arg);
    const char *cont = get("ALIYUN_COM_GPU_MEM_CONTAINER", arg);
    const char *dev = get("ALIYUN_COM_GPU_MEM_DEV", arg);
    uint64_t cont_mem[GW_MAX_DEVICES];
    uint32_t dev_gib = 0;
    if (dev && parse_int(dev, dev + strlen(dev), 1, GW_MAX_GIB, &dev_gib))
        FAIL("ALIYUN_COM_GPU_MEM_DEV=%s: want the device's memory in GiB, an integer from 1 to %u", show(dev, b, sizeof b),
             GW_MAX_GIB);
    if (cont && gw_parse_gib_list(cont, cont_mem))
        FAIL("ALIYUN_COM_GPU_MEM_CONTAINER=%s: want the container's memory in GiB per device, integers such as 3 "
             "or 3,1 (the last repeats, at most %d values, 0: no limit)",
             show(cont, b, sizeof b), GW_MAX_DEVICES);
    for (int i = 0; cont && dev && i < GW_MAX_DEVICES; i++)
        if (cont_mem[i] > (uint64_t)dev_gib << 30)
            FAIL("ALIYUN_COM_GPU_MEM_CONTAINER=%s: more than ALIYUN_COM_GPU_MEM_DEV=%s GiB", show(cont, b, sizeof b),
                 dev);
    if (v) {
        if (gw_parse_mem_list(v, out->mem_limit))
            FAIL("GPUWARDEN_MEMORY_LIMIT=%s: want sizes per device such as 6Gi, 512Mi or 3Gi,4Gi "
                 "(a bare number is GiB, at most %d values, 0: no limit)",
                 show(v, b, sizeof b), GW_MAX_DEVICES);
        out->mem_set = 1;
    } else if (cont) {
        memcpy(out->mem_limit, cont_mem, sizeof cont_mem);
        out->mem_set = 1;
    }

    v = get("GPUWARDEN_COMPUTE_WEIGHT", arg);
    const char *w2 = get("ALIYUN_COM_GPU_SCHD_WEIGHT", arg);
    if (v && parse_int(v, v + strlen(v), 1, GW_MAX_WEIGHT, &out->weight))
        FAIL("GPUWARDEN_COMPUTE_WEIGHT=%s: want an integer from 1 to %u", show(v, b, sizeof b), GW_MAX_WEIGHT);
    if (w2) {
        uint32_t w;
        if (parse_int(w2, w2 + strlen(w2), 1, GW_MAX_WEIGHT, &w))
            FAIL("ALIYUN_COM_GPU_SCHD_WEIGHT=%s: want an integer from 1 to %u", show(w2, b, sizeof b), GW_MAX_WEIGHT);
        if (!v) out->weight = w;
    }

    v = get("GPUWARDEN_COMPUTE_LIMIT", arg);
    if (v) {
        size_t n = strlen(v);
        if (n && v[n - 1] == '%') n--;
        if (parse_int(v, v + n, 1, GW_MAX_CAP_PERCENT, &out->compute_limit))
            FAIL("GPUWARDEN_COMPUTE_LIMIT=%s: want a percent from 1 to %u", show(v, b, sizeof b), GW_MAX_CAP_PERCENT);
    }

    v = get("GPUWARDEN_PRIORITY", arg);
    if (v) {
        if (!strcmp(v, GW_PRIORITY_HIGH_NAME)) out->priority = GW_PRIORITY_HIGH;
        else if (!strcmp(v, GW_PRIORITY_NORMAL_NAME)) out->priority = GW_PRIORITY_NORMAL;
        else FAIL("GPUWARDEN_PRIORITY=%s: want " GW_PRIORITY_HIGH_NAME " or " GW_PRIORITY_NORMAL_NAME, show(v, b, sizeof b));
    }

    v = get("GPUWARDEN_CONTROL_DIR", arg);
    if (!v) v = GW_DEFAULT_CONTROL_DIR;
    if (v[0] != '/' || strlen(v) >= GW_CONTROL_DIR_MAX - 1)
        FAIL("GPUWARDEN_CONTROL_DIR=%s: want an absolute path shorter than %d bytes", show(v, b, sizeof b),
             GW_CONTROL_DIR_MAX - 1);
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            FAIL("GPUWARDEN_CONTROL_DIR=%s: control characters in the path", show(v, b, sizeof b));
    strcpy(out->control_dir, v);
    return 0;
}

/* The key: the path without its leading '/', each '/' turned into '+', and
 * every byte outside [A-Za-z0-9._-] written as %XX (upper-case hex); "/" is
 * "root". A key longer than 200 bytes keeps its first 183 bytes and appends
 * '~' and the 16 hex digits of the FNV-1a 64 hash of the whole path. A key
 * that would start with '.' starts with "%2E" instead, so "." and ".." and
 * hidden names never occur. */
int gw_container_key(const char *path, char *out, size_t outlen) {
    static const char hex[] = "0123456789ABCDEF";
    if (outlen < 256) return -1;
    while (*path == '/') path++;
    if (!*path) {
        strcpy(out, "root");
        return 4;
    }
    size_t n = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    int truncated = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        unsigned char c = *p;
        char buf[3];
        size_t k;
        if (c == '/') buf[0] = '+', k = 1;
        else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                 c == '-' || (c == '.' && n > 0))
            buf[0] = (char)c, k = 1;
        else buf[0] = '%', buf[1] = hex[c >> 4], buf[2] = hex[c & 15], k = 3;
        if (n + k > 200) truncated = 1;
        if (!truncated) {
            memcpy(out + n, buf, k);
            n += k;
        }
    }
    if (truncated) {
        /* FNV-1a 64 over the path from its first byte after the leading '/' */
        for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
            h ^= *p;
            h *= 0x100000001b3ull;
        }
        n = n > 183 ? 183 : n;
        out[n++] = '~';
        for (int i = 15; i >= 0; i--) out[n++] = hex[(h >> (i * 4)) & 15];
    }
    out[n] = 0;
    return (int)n;
}
