/* This process's cgroup v2 path (see cgroup.h). */
#define _GNU_SOURCE
#include "cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int decimal(const char *s, size_t n) {
    if (n < 1 || n > 10) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* check_path accepts what the kernel writes: "/", or '/'-separated names,
 * any leading ones ".." (a cgroup outside the reader's namespace root). */
static const char *check_path(const char *p, size_t n) {
    if (!n || p[0] != '/') return "is not absolute";
    if (n > GW_CGROUP_V2_PATH_MAX - 1) return "is longer than 4095 bytes";
    if (n == 1) return NULL;
    int named = 0;
    for (const char *c = p + 1, *end = p + n;;) {
        const char *e = memchr(c, '/', (size_t)(end - c));
        if (!e) e = end;
        size_t k = (size_t)(e - c);
        if (k == 0 || (k == 1 && c[0] == '.')) return "has an empty or \".\" component";
        if (k == 2 && c[0] == '.' && c[1] == '.') {
            if (named) return "has \"..\" after a name";
        } else {
            named = 1;
        }
        if (e == end) return NULL;
        c = e + 1;
    }
}

int gw_cgroup_parse(const char *buf, size_t len, char *out, size_t outlen, char *err, size_t errlen) {
    if (len > GW_CGROUP_FILE_MAX) return fail(err, errlen, "longer than %d bytes", GW_CGROUP_FILE_MAX);
    if (memchr(buf, 0, len)) return fail(err, errlen, "holds a NUL byte");
    if (len && buf[len - 1] == '\n') len--;
    if (!len) return fail(err, errlen, "empty");
    const char *v2 = NULL;
    size_t v2len = 0, line = 0;
    int v1 = 0;
    for (const char *p = buf, *end = buf + len;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line++;
        const char *c1 = memchr(p, ':', (size_t)(le - p));
        const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(le - c1 - 1)) : NULL;
        if (!c2 || !decimal(p, (size_t)(c1 - p)))
            return fail(err, errlen, "line %zu is not <hierarchy id>:<controllers>:<path>", line);
        int zero = c1 - p == 1 && p[0] == '0', noctrl = c2 == c1 + 1;
        if (zero != noctrl) return fail(err, errlen, "line %zu: hierarchy and controllers disagree", line);
        if (!noctrl) {
            v1++;
        } else if (v2) {
            return fail(err, errlen, "line %zu is a second cgroup v2 (0::) line", line);
        } else {
            const char *bad = check_path(c2 + 1, (size_t)(le - c2 - 1));
            if (bad) return fail(err, errlen, "line %zu: cgroup v2 path %s", line, bad);
            v2 = c2 + 1, v2len = (size_t)(le - c2 - 1);
        }
        if (!nl) break;
        p = nl + 1;
    }
    if (!v2)
        return fail(err, errlen,
                    "no cgroup v2 (0::) line: the host mounts only cgroup v1 (%d v1 hierarchies); gpuwarden needs "
                    "the cgroup v2 hierarchy (a cgroup v2 or hybrid host)",
                    v1);
    if (v2len >= outlen) return fail(err, errlen, "cgroup v2 path longer than %zu bytes", outlen - 1);
    memcpy(out, v2, v2len);
    out[v2len] = 0;
    return 0;
}

int gw_cgroup_read(const char *file, char *out, size_t outlen, char *err, size_t errlen) {
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(err, errlen, "read cgroup %s: %s", file, strerror(errno));
    char *buf = malloc(GW_CGROUP_FILE_MAX + 1);
    if (!buf) {
        close(fd);
        return fail(err, errlen, "read cgroup %s: out of memory", file);
    }
    size_t len = 0;
    for (;;) { /* to one byte past the limit, so that a longer file is refused */
        ssize_t n = read(fd, buf + len, GW_CGROUP_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return fail(err, errlen, "read cgroup %s: %s", file, strerror(e));
        }
        len += (size_t)n;
        if (n == 0 || len > GW_CGROUP_FILE_MAX) break;
    }
    close(fd);
    char why[256];
    int r = gw_cgroup_parse(buf, len, out, outlen, why, sizeof why);
    free(buf);
    if (r) fail(err, errlen, "%s: %s", file, why);
    return r;
}
