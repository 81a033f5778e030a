/* libFuzzer harness for the interposer's environment parser and container
 * key: the input is split at NUL bytes into the values of the variables
 * (an empty piece leaves that variable unset) and a cgroup path. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"

static const char *const vars[] = {"GPUWARDEN_MEMORY_LIMIT", "ALIYUN_COM_GPU_MEM_CONTAINER", "ALIYUN_COM_GPU_MEM_DEV",
                                   "GPUWARDEN_COMPUTE_WEIGHT", "ALIYUN_COM_GPU_SCHD_WEIGHT", "GPUWARDEN_COMPUTE_LIMIT",
                                   "GPUWARDEN_PRIORITY", "GPUWARDEN_CONTROL_DIR"};
#define NVARS (sizeof vars / sizeof *vars)

struct values {
    const char *v[NVARS];
};

static const char *get(const char *name, void *arg) {
    struct values *vals = arg;
    for (size_t i = 0; i < NVARS; i++)
        if (!strcmp(vars[i], name)) return vals->v[i];
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    struct values vals = {{0}};
    char *p = buf, *end = buf + size;
    size_t i = 0;
    for (; i < NVARS && p <= end; i++) {
        size_t n = strlen(p);
        vals.v[i] = n ? p : NULL;
        p += n + 1;
    }
    struct gw_env e;
    char err[768];
    if (gw_env_parse(get, &vals, &e, err, sizeof err) == 0) {
        /* what a success promises */
        if (e.weight < 1 || e.weight > 1000 || e.compute_limit > 100 || e.control_dir[0] != '/') abort();
        /* cGPU's list alone: whole GiB per device, within range */
        for (int d = 0; !vals.v[0] && vals.v[1] && d < GW_MAX_DEVICES; d++)
            if (e.mem_limit[d] % (1ull << 30) || e.mem_limit[d] > (uint64_t)GW_MAX_GIB << 30) abort();
    } else if (!strchr(err, '=') || strchr(err, '\n')) {
        abort(); /* an error names its variable on one line */
    }
    char key[256];
    int k = gw_container_key(p <= end ? p : "", key, sizeof key);
    if (k < 1 || k > 200 || (int)strlen(key) != k || key[0] == '.') abort();
    for (int j = 0; j < k; j++)
        if (key[j] == '/' || (unsigned char)key[j] < 0x21) abort();
    free(buf);
    return 0;
}
