/* gw-envcheck: parses the process's environment with the interposer's own
 * parser and prints the result, for the Go twin's differential test:
 *   ok mem=<b0>,...,<b15> set=<0|1> weight=W limit=L priority=P dir=D
 *   error <message>
 * With --key PATH it prints the container key of a cgroup path instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"

static const char *get(const char *name, void *arg) {
    (void)arg;
    return getenv(name);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--key")) {
        char key[256];
        if (gw_container_key(argv[2], key, sizeof key) < 0) return 1;
        printf("%s\n", key);
        return 0;
    }
    struct gw_env e;
    char err[768];
    if (gw_env_parse(get, NULL, &e, err, sizeof err)) {
        printf("error %s\n", err);
        return 0;
    }
    printf("ok mem=");
    for (int i = 0; i < GW_MAX_DEVICES; i++) printf("%s%llu", i ? "," : "", (unsigned long long)e.mem_limit[i]);
    printf(" set=%d weight=%u limit=%u priority=%u dir=%s\n", e.mem_set, e.weight, e.compute_limit, e.priority,
           e.control_dir);
    return 0;
}
