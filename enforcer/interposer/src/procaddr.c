/* The backend (the real driver's functions) and the two ways a program finds
 * a function without linking it: dlsym, hooked for both of glibc's versions
 * of it, and cuGetProcAddress(_v2), the CUDA runtime's way. Each answers with
 * our hook when the driver's answer is a function we manage, and passes every
 * other answer through unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

struct gw_backend gw_be;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn _Atomic real_dlsym;

static dlsym_fn resolve_dlsym(void) {
    dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    atomic_store(&real_dlsym, f);
    return f;
}

void *gw_real_dlsym(void *handle, const char *name) {
    dlsym_fn f = atomic_load_explicit(&real_dlsym, memory_order_relaxed);
    if (GW_UNLIKELY(!f)) f = resolve_dlsym();
    return f ? f(handle, name) : NULL;
}

/* ---- loading the driver ---- */

struct gw_text gw_drv_text, gw_own_text;

struct text_query {
    uintptr_t addr;   /* an address inside the object */
    struct gw_text *out;
};

/* text_of finds the object that holds q->addr and spans its executable
 * segments (for the re-entry guard, internal.h). */
static int text_of(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct text_query *q = arg;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int mine = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        if (q->addr >= a && q->addr < b) mine = 1;
        if (!(ph->p_flags & PF_X)) continue;
        if (a < lo) lo = a;
        if (b > hi) hi = b;
    }
    if (!mine || lo >= hi) return 0;
    *q->out = (struct gw_text){.lo = lo, .len = hi - lo};
    return 1;
}

static void find_text(const void *addr, struct gw_text *out) {
    struct text_query q = {.addr = (uintptr_t)addr, .out = out};
    dl_iterate_phdr(text_of, &q);
}

/* The kernel's uretprobe trampoline: a uretprobe on a driver function (the
 * agent's eBPF puts them on libcuda) replaces that function's return address
 * with the start of the process's "[uprobes]" page, so a driver function that
 * tail-calls its base reaches the base's hook with that address. The page is
 * the kernel's (no program can map one of that name); it is made at the
 * first probe hit, so it is looked up when an address is not known, and kept.
 * Only calls made with the guard set get here: those, and a signal handler's
 * calls during a hook, which pay for reading /proc/self/maps. open, read and
 * close are async-signal-safe; nothing here allocates. */
static _Atomic uintptr_t uprobes_lo, uprobes_len;

static int find_uprobes(uintptr_t *lo, uintptr_t *len) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[4096];
    size_t have = 0;
    int found = 0;
    for (ssize_t n; !found && (n = read(fd, buf + have, sizeof buf - 1 - have)) > 0;) {
        have += (size_t)n;
        char *line = buf, *nl;
        while (!found && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
            if (nl - line > 9 && !memcmp(nl - 9, "[uprobes]", 9)) { /* "start-end perms ... [uprobes]" */
                char *end;
                uintptr_t a = strtoull(line, &end, 16), b = *end == '-' ? strtoull(end + 1, NULL, 16) : 0;
                if (b > a) *lo = a, *len = b - a, found = 1;
            }
            line = nl + 1;
        }
        size_t rest = have - (size_t)(line - buf);
        if (rest == sizeof buf - 1) rest = 0; /* a line longer than the buffer is not the one */
        memmove(buf, buf + (have - rest), rest);
        have = rest;
    }
    close(fd);
    return found;
}

int gw_from_uprobes(uintptr_t a) {
    uintptr_t lo = atomic_load_explicit(&uprobes_lo, memory_order_relaxed);
    uintptr_t len = atomic_load_explicit(&uprobes_len, memory_order_relaxed);
    if (a - lo < len) return 1;
    if (!find_uprobes(&lo, &len)) return 0;
    atomic_store_explicit(&uprobes_len, 0, memory_order_relaxed);
    atomic_store_explicit(&uprobes_lo, lo, memory_order_relaxed);
    atomic_store_explicit(&uprobes_len, len, memory_order_relaxed);
    return a - lo < len;
}

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT;
static int cuda_ok, nvml_ok;

static void *open_lib(const char *soname) {
    void *h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD); /* the one the program loaded */
    return h ? h : dlopen(soname, RTLD_LAZY);
}

static void cuda_load(void) {
    void *h = open_lib("libcuda.so.1");
    if (!h) return;
#define LOAD(ret, name, params) gw_be.name = (ret(*) params)gw_real_dlsym(h, #name);
    GW_CUDA_HOOKS(LOAD)
    GW_CUDA_USED(LOAD)
    cuda_ok = gw_be.cuInit && gw_be.cuCtxGetCurrent && gw_be.cuCtxGetDevice;
    if (cuda_ok) {
        find_text((const void *)gw_be.cuInit, &gw_drv_text);
        find_text((const void *)&text_of, &gw_own_text);
    }
}

static void nvml_load(void) {
    void *h = open_lib("libnvidia-ml.so.1");
    if (!h) return;
    GW_NVML_HOOKS(LOAD)
    GW_NVML_USED(LOAD)
#undef LOAD
    nvml_ok = gw_be.nvmlDeviceGetIndex != NULL;
}

int gw_cuda_load(void) {
    pthread_once(&cuda_once, cuda_load);
    return cuda_ok ? 0 : -1;
}

int gw_nvml_load(void) {
    pthread_once(&nvml_once, nvml_load);
    return nvml_ok ? 0 : -1;
}

/* ---- substitution ---- */

struct subst {
    const char *name;
    void *hook;
    size_t real; /* offset of the driver's function in gw_be */
};

#define SUBST(ret, name, params) {#name, (void *)name, offsetof(struct gw_backend, name)},
static const struct subst cuda_subst[] = {GW_CUDA_HOOKS(SUBST)};
static const struct subst nvml_subst[] = {GW_NVML_HOOKS(SUBST)};
#undef SUBST
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void *real_of(const struct subst *s) { return *(void **)((char *)&gw_be + s->real); }

/* substitute returns our hook for a driver function we manage, else p. */
static void *substitute(const struct subst *tab, size_t n, void *p) {
    for (size_t i = 0; i < n; i++)
        if (real_of(&tab[i]) == p) return tab[i].hook;
    return p;
}

static const struct subst *by_name(const struct subst *tab, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name)) return &tab[i];
    return NULL;
}

/* dlsym_managed answers a lookup of a name we hook. */
static __attribute__((noinline)) void *dlsym_managed(void *handle, const char *name, dlsym_fn real) {
    void *p = real(handle, name);
    if (!p) return NULL;
    int cuda = name[0] == 'c';
    const struct subst *s = cuda ? by_name(cuda_subst, NELEM(cuda_subst), name)
                                 : by_name(nvml_subst, NELEM(nvml_subst), name);
    if (!s || p == s->hook) return p;
    if (cuda ? gw_cuda_load() : gw_nvml_load()) return p;
    return real_of(s) == p ? s->hook : p; /* another library's function of that name stays */
}

static int maybe_managed(const char *name) {
    return name && ((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4));
}

/* The hook itself: a name we do not manage goes to glibc by a tail call, so
 * that dlsym(RTLD_NEXT, ...) still sees its real caller. */
static void *hook_dlsym(void *handle, const char *name) {
    dlsym_fn real = atomic_load_explicit(&real_dlsym, memory_order_relaxed);
    if (GW_UNLIKELY(!real)) real = resolve_dlsym();
    if (GW_LIKELY(!maybe_managed(name))) return real(handle, name);
    return dlsym_managed(handle, name, real);
}

/* glibc 2.34 moved dlsym into libc as dlsym@@GLIBC_2.34 and kept
 * dlsym@GLIBC_2.2.5 for programs linked before; we answer both. */
GW_EXPORT void *gw_dlsym_234(void *handle, const char *name) __attribute__((alias("hook_dlsym")));
GW_EXPORT void *gw_dlsym_225(void *handle, const char *name) __attribute__((alias("hook_dlsym")));
__asm__(".symver gw_dlsym_234, dlsym@@GLIBC_2.34");
__asm__(".symver gw_dlsym_225, dlsym@GLIBC_2.2.5");

static CUresult fix_procaddr(CUresult rc, void **pfn) {
    if (rc == CUDA_SUCCESS && pfn && *pfn) *pfn = substitute(cuda_subst, NELEM(cuda_subst), *pfn);
    return rc;
}

GW_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (gw_cuda_load() || !gw_be.cuGetProcAddress) return CUDA_ERROR_NOT_INITIALIZED;
    return fix_procaddr(gw_be.cuGetProcAddress(symbol, pfn, cudaVersion, flags), pfn);
}

GW_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    if (gw_cuda_load() || !gw_be.cuGetProcAddress_v2) return CUDA_ERROR_NOT_INITIALIZED;
    return fix_procaddr(gw_be.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus), pfn);
}
