/* libFuzzer harness for the interposer's control-block checks: any bytes,
 * of any length, get a verdict and never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cbcheck.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* short inputs are widened into a whole file of zeros, so that the
     * header fields the fuzzer writes are what gets judged */
    size_t n = size < sizeof(struct gw_usage) ? sizeof(struct gw_usage) : size;
    uint8_t *buf = calloc(1, n);
    if (!buf) return 0;
    memcpy(buf, data, size);
    const char *u = gw_usage_check(buf, n);
    const char *l = gw_limits_check_header(buf, n);
    const char *u2 = gw_usage_check(data, size); /* and exactly the given bytes */
    const char *l2 = gw_limits_check_header(data, size);
    if (!u && !l) abort(); /* one magic cannot be both */
    struct gw_limits_view v;
    memcpy(&v, buf, sizeof v < n ? sizeof v : n);
    const char *c = gw_limits_check_view(&v, size > 8 ? data[size - 1] : 0);
    if (!c && v.magic != GW_LIMITS_MAGIC) abort();
    (void)u2;
    (void)l2;
    free(buf);
    return 0;
}
