/* Polling for a frame that is expected soon. A blocking read that the
 * peer's bytes wake costs tens of microseconds on a virtual machine (a few
 * hundred at worst); polling for the frame first saves the wake-up, at the
 * price of a core that polls: the client's synchronous calls poll for
 * their reply as the CUDA driver's synchronize polls for the device
 * (client.c), the worker for a client's next frame a round trip long
 * after a reply (worker.c). */
#ifndef GPUWARDEN_REMOTE_SPIN_H
#define GPUWARDEN_REMOTE_SPIN_H

#include <stdatomic.h>
#include <stdint.h>

#include "tls13.h"

uint64_t gwr_mono_ns(void);
/* gwr_spin_readable polls fd (or tls's buffered records) until it has
 * something to read, or word (where not NULL) is not 0, or the monotonic
 * clock reaches until_ns: 1, 2 or 0. From yield_from_ns it gives the core
 * to any other runnable thread between polls (sched_yield(2)): the thread
 * that will make a reply that is not a round trip away (the driver's, on a
 * small machine the worker or the peer) must not wait for the poller's
 * time slice. */
int gwr_spin_readable(int fd, const struct gwr_tls *tls, uint64_t yield_from_ns, uint64_t until_ns,
                      const _Atomic uint32_t *word);

#endif
