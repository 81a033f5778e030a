/* libFuzzer harness for the interposer's /proc/self/cgroup parser: the
 * input is the file. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cgroup.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char out[GW_CGROUP_V2_PATH_MAX], err[768];
    if (gw_cgroup_parse((const char *)data, size, out, sizeof out, err, sizeof err) == 0) {
        /* what a success promises: an absolute path from one "0::" line of the input */
        size_t n = strlen(out);
        if (out[0] != '/' || n > GW_CGROUP_V2_PATH_MAX - 1 || strchr(out, '\n') || strstr(out, "//")) abort();
        if (n > 1 && out[n - 1] == '/') abort();
        char *line = malloc(n + 4);
        if (!line) return 0;
        memcpy(line, "0::", 3);
        memcpy(line + 3, out, n + 1);
        if (!memmem(data, size, line, n + 3)) abort();
        free(line);
    } else if (!err[0] || strchr(err, '\n')) {
        abort(); /* an error is one line */
    }
    return 0;
}
