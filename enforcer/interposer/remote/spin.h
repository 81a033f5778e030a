/* Polling for a reply that is a round trip away. A blocking read that the
 * peer's bytes wake costs tens of microseconds on a virtual machine; where
 * the next frame is expected within a round trip, polling for it that long
 * first saves the wake-up, at the price of a short spin of one core. */
#ifndef GPUWARDEN_REMOTE_SPIN_H
#define GPUWARDEN_REMOTE_SPIN_H

#include <stdint.h>

#include "tls13.h"

uint64_t gwr_mono_ns(void);
/* gwr_spin_readable polls fd (or tls's buffered records) until it has
 * something to read or the monotonic clock reaches until_ns. */
void gwr_spin_readable(int fd, const struct gwr_tls *tls, uint64_t until_ns);

#endif
