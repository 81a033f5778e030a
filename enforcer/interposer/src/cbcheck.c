/* Validating control-block headers: pure functions over bytes, fuzzed. */
#include "cbcheck.h"

#include <string.h>

const char *gw_usage_check(const void *p, size_t n) {
    struct gw_usage u;
    if (n < sizeof u) return "file shorter than this ABI's ledger";
    memcpy(&u, p, offsetof(struct gw_usage, reserved_bytes)); /* the header words only */
    if (u.magic != GW_USAGE_MAGIC) return "not a gpuwarden ledger (bad magic)";
    if (u.abi_major != GW_ABI_MAJOR) return "ABI major version differs";
    if (u.size != sizeof u || u.max_devices != GW_MAX_DEVICES || u.max_slots != GW_MAX_SLOTS ||
        u.slot_size != sizeof(struct gw_slot))
        return "layout differs (size, devices, slots)";
    return NULL;
}

const char *gw_limits_check_header(const void *p, size_t n) {
    struct gw_limits l;
    if (n < sizeof l) return "file shorter than this ABI's limits";
    memcpy(&l, p, offsetof(struct gw_limits, seq));
    if (l.magic != GW_LIMITS_MAGIC) return "not gpuwarden limits (bad magic)";
    if (l.abi_major != GW_ABI_MAJOR) return "ABI major version differs";
    if (l.size < sizeof l) return "size field smaller than this ABI's limits";
    return NULL;
}

const char *gw_limits_check_view(const struct gw_limits_view *v, uint64_t last_generation) {
    if (v->magic != GW_LIMITS_MAGIC) return "not gpuwarden limits (bad magic)";
    if (v->abi_major != GW_ABI_MAJOR) return "ABI major version differs";
    if (v->size < sizeof(struct gw_limits)) return "size field smaller than this ABI's limits";
    if (v->size > GW_LIMITS_SIZE_MAX) return "size field larger than any limits";
    if (v->ndev > GW_MAX_DEVICES) return "more devices than this ABI has";
    if (GW_MAX_DEVICES < 32 && v->gate_mask >> GW_MAX_DEVICES) return "gate mask names devices this ABI does not have";
    if (v->generation < last_generation) return "generation went back";
    return NULL;
}
