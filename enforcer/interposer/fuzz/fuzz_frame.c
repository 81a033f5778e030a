/* libFuzzer harness for the remote protocol's frame decoder: the input is a
 * byte stream as gpuwarden-worker reads it from a (hostile) client. */
#include <stdint.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct gwr_req r;
    while (size >= GWR_HDR_SIZE) {
        struct gwr_hdr h;
        if (gwr_get_hdr(data, &h)) return 0;
        data += GWR_HDR_SIZE, size -= GWR_HDR_SIZE;
        if (h.len > size) return 0;
        if (gwr_decode(&h, data, &r) == 0 && r.data && (r.data < data || r.data + r.ndata > data + h.len))
            __builtin_trap(); /* a field outside its frame */
        data += h.len, size -= h.len;
    }
    return 0;
}
