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

void gwr_spin_readable(int fd, const struct gwr_tls *tls, uint64_t yield_from_ns, uint64_t until_ns) {
    if (tls && gwr_tls_pending(tls)) return;
    for (uint64_t now; (now = gwr_mono_ns()) < until_ns;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 0) return;
        if (now < yield_from_ns)
            __builtin_ia32_pause();
        else
            sched_yield();
    }
}
