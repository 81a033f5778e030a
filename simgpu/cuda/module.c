/* Module images that describe their kernels. NVIDIA's driver reads each
 * kernel's parameter layout from the cubin; simgpu reads it from a small text
 * image:
 *
 *     simgpu-module 1
 *     kernel <name> sleep|record <size> <size> ...
 *
 * one line per kernel (lines starting with # are comments), each <size> a
 * parameter's bytes (1..4096). Parameters
 * are laid out as a C compiler lays out scalars: each at the next multiple of
 * its alignment (the largest power of two dividing its size, at most 8).
 * A sleep kernel runs for its first parameter's nanoseconds (a u64); a record
 * kernel writes its whole parameter buffer to the device pointer that is its
 * first parameter, so a test can see every byte that arrived. Any other image
 * (PTX, cubin, fatbin, text) keeps simgpu's original kernels: one 8-byte
 * parameter, the duration. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SG_MODULE_MAGIC "simgpu-module 1\n"
#define SG_MAX_KERNELS 256
#define SG_MAX_PARAM_SIZE 4096
#define SG_MAX_PARAM_BYTES 32764 /* NVIDIA's limit on a launch's parameters */

void sg_kernel_default(struct sg_kernel *k, const char *name) {
    memset(k, 0, sizeof *k);
    strncpy(k->name, name, sizeof k->name - 1);
    k->kind = SG_KERNEL_SLEEP;
    k->nparams = 1;
    k->size[0] = 8;
    k->bytes = 8;
}

static size_t align_of(size_t size) {
    size_t a = 1;
    while (a < 8 && size % (a * 2) == 0) a *= 2;
    return a;
}

/* parse_line reads "kernel <name> <kind> <size>..." into k. */
static int parse_line(char *line, struct sg_kernel *k) {
    char *save, *tok = strtok_r(line, " \t", &save);
    if (!tok || strcmp(tok, "kernel")) return -1;
    char *name = strtok_r(NULL, " \t", &save), *kind = strtok_r(NULL, " \t", &save);
    if (!name || !kind || strlen(name) >= sizeof k->name) return -1;
    memset(k, 0, sizeof *k);
    strcpy(k->name, name);
    if (!strcmp(kind, "sleep")) k->kind = SG_KERNEL_SLEEP;
    else if (!strcmp(kind, "record")) k->kind = SG_KERNEL_RECORD;
    else return -1;
    size_t off = 0;
    while ((tok = strtok_r(NULL, " \t", &save))) {
        char *end;
        unsigned long size = strtoul(tok, &end, 10);
        if (*end || size == 0 || size > SG_MAX_PARAM_SIZE || k->nparams == SG_MAX_PARAMS) return -1;
        size_t a = align_of(size);
        off = (off + a - 1) / a * a;
        if (off + size > SG_MAX_PARAM_BYTES) return -1;
        k->offset[k->nparams] = (uint16_t)off;
        k->size[k->nparams++] = (uint16_t)size;
        off += size;
    }
    k->bytes = off;
    /* both kinds read their first parameter as 8 bytes */
    if (!k->nparams || k->size[0] != 8) return -1;
    return 0;
}

int sg_module_parse(const char *image, struct sg_kernel **out, int *n) {
    *out = NULL;
    *n = 0;
    if (strncmp(image, SG_MODULE_MAGIC, strlen(SG_MODULE_MAGIC))) return 0;
    char *text = strdup(image + strlen(SG_MODULE_MAGIC));
    struct sg_kernel *ks = calloc(SG_MAX_KERNELS, sizeof *ks);
    int count = 0, rc = 1;
    char *save;
    for (char *line = text ? strtok_r(text, "\n", &save) : NULL; line && ks; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        if (count == SG_MAX_KERNELS || parse_line(line, &ks[count])) {
            rc = -1;
            break;
        }
        count++;
    }
    free(text);
    if (!text || !ks || rc < 0 || count == 0) {
        free(ks);
        return -1;
    }
    *out = ks;
    *n = count;
    return 1;
}
