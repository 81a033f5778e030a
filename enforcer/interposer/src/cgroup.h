/* Which cgroup this process is in: the cgroup v2 path of /proc/self/cgroup,
 * by the rule of Go's enforcer/hostcgroup (a test runs both on the same
 * inputs): the one "0::" line, on a cgroup v2 host and a hybrid one alike;
 * a file without one (a cgroup v1-only host) is an error, never a v1 path,
 * since the agent and eBPF know a container by its v2 cgroup. */
#ifndef GW_CGROUP_H
#define GW_CGROUP_H

#include <stddef.h>

#define GW_CGROUP_FILE_MAX (256 * 1024) /* the most of the file read */
#define GW_CGROUP_V2_PATH_MAX 4096      /* a path's bytes and its NUL (the kernel's PATH_MAX) */

/* gw_cgroup_parse finds the v2 path in len bytes of a /proc/<pid>/cgroup
 * file and writes it, NUL-terminated, to out. On a file the kernel would
 * not write (a malformed line, a second v2 line, a path that is not
 * absolute and clean) or one without a v2 line it returns -1 and writes a
 * one-line message into err. */
int gw_cgroup_parse(const char *buf, size_t len, char *out, size_t outlen, char *err, size_t errlen);

/* gw_cgroup_read reads file (normally /proc/self/cgroup) and parses it;
 * its message names the file. */
int gw_cgroup_read(const char *file, char *out, size_t outlen, char *err, size_t errlen);

#endif
