/* Header checks of the control-block files; NULL means valid, else why not. */
#ifndef GW_CBCHECK_H
#define GW_CBCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "gpuwarden_abi.h"

const char *gw_usage_check(const void *p, size_t n);
const char *gw_limits_check_header(const void *p, size_t n);

/* One consistent read of limits (under its seqlock): the header again, since
 * the bytes may have been overwritten after the file was mapped, and the
 * config. */
struct gw_limits_view {
    uint64_t magic;
    uint16_t abi_major, abi_minor;
    uint32_t size;
    uint64_t generation, context_reserve, grace_ns;
    uint32_t gate_mask, ndev;
    uint64_t mem_limit[GW_MAX_DEVICES];
};

#define GW_LIMITS_SIZE_MAX 65536u /* a size field above this is not a writer's struct */

/* gw_limits_check_view judges a read; last_generation is the generation of
 * the last read adopted (0 before the first): the agent only raises it. */
const char *gw_limits_check_view(const struct gw_limits_view *v, uint64_t last_generation);

#endif
