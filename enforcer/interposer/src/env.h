/* The environment a container gives the interposer (the table in enforcer/interposer/README.md),
 * parsed by pure functions so that a fuzzer and a Go twin can check them. */
#ifndef GW_ENV_H
#define GW_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "gpuwarden_abi.h"
#include "vocab_gen.h" /* the limits, from Go's enforcer/vocab */

#define GW_DEFAULT_CONTROL_DIR "/run/gpuwarden"
#define GW_CONTROL_DIR_MAX 256

struct gw_env {
    uint64_t mem_limit[GW_MAX_DEVICES]; /* bytes per device ordinal; 0 = no limit */
    int mem_set;                        /* a memory variable was given */
    uint32_t weight;                    /* >= 1 */
    uint32_t compute_limit;             /* percent, 0 = none */
    uint32_t priority;                  /* enum gw_priority */
    char control_dir[GW_CONTROL_DIR_MAX];
};

/* gw_env_parse reads every variable through get (NULL when unset) into out.
 * On a malformed value it returns -1 and writes a one-line message naming
 * the variable into err. */
typedef const char *(*gw_getenv_fn)(const char *name, void *arg);
int gw_env_parse(gw_getenv_fn get, void *arg, struct gw_env *out, char *err, size_t errlen);

/* gw_parse_mem_list parses "6Gi", "512Mi", "3Gi,4Gi,5Gi", a bare number
 * being GiB, the last value repeating for the remaining devices. */
int gw_parse_mem_list(const char *s, uint64_t out[GW_MAX_DEVICES]);

/* gw_parse_gib_list parses cGPU's ALIYUN_COM_GPU_MEM_CONTAINER: integers of
 * GiB per device, "3" (every device), "3,1" (3 on the first, 1 on the
 * others), "3,4,5,6"; the last value repeats for the remaining devices. */
int gw_parse_gib_list(const char *s, uint64_t out[GW_MAX_DEVICES]);

/* gw_container_key escapes a cgroup path into one directory name (see
 * README.md); returns the length, or -1 when out (>= 256 bytes) is too small. */
int gw_container_key(const char *cgroup_path, char *out, size_t outlen);

#endif
