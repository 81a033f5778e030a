/* Polling for a reply (spin.h). */
#include <poll.h>
#include <sched.h>
#include <time.h>

#include "spin.h"

uint64_t gwr_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int gwr_spin_readable(int fd, const struct gwr_tls *tls, uint64_t yield_from_ns, uint64_t until_ns,
                      const _Atomic uint32_t *word) {
    if (tls && gwr_tls_pending(tls)) return 1;
    for (uint64_t now; (now = gwr_mono_ns()) < until_ns;) {
        if (word && atomic_load_explicit(word, memory_order_acquire)) return 2;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 0) return 1;
        if (now < yield_from_ns)
            __builtin_ia32_pause();
        else
            sched_yield();
    }
    return 0;
}
