/* gw-envcheck: parses the process's environment with the interposer's own
 * parser and prints the result, for the Go twin's differential test:
 *   ok mem=<b0>,...,<b15> set=<0|1> weight=W limit=L priority=P dir=D
 *   error <message>
 * With --key PATH it prints the container key of a cgroup path instead;
 * with --cgroup FILE the cgroup v2 path read from a /proc/<pid>/cgroup file
 * ("ok <path>" or "error <message>"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgroup.h"
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
    if (argc == 3 && !strcmp(argv[1], "--cgroup")) {
        char path[GW_CGROUP_V2_PATH_MAX], err[768];
        if (gw_cgroup_read(argv[2], path, sizeof path, err, sizeof err)) printf("error %s\n", err);
        else printf("ok %s\n", path);
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
