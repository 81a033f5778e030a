/* The bulk ring (ring.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "spin.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static void map(struct gwr_ring *r, void *p) {
    r->base = p;
    r->hdr = p;
    r->state = r->hdr->state;
    r->next = 0;
    r->polled = 0;
}

/* touch writes a zero into every page of the slots this side fills (from
 * first) and reads every page of the others'. A process's first access to
 * a page of shared memory costs a fault, and under a hypervisor that shadows
 * page tables a second one the guest never sees (9 us a page on one virtual
 * machine: 0.6 ms a slot, a third of a 64 MiB copy's time when a copy was
 * the first through the slots); paid here, once a session, a copy finds
 * the pages mapped. Each side writes only slots the other does not read
 * yet. */
static void touch(struct gwr_ring *r, uint32_t first) {
    for (uint32_t slot = 0; slot < GWR_RING_SLOTS; slot++) {
        volatile uint8_t *p = gwr_ring_slot(r, slot);
        int fills = slot >= first && slot < first + GWR_RING_SLOTS / 2;
        for (size_t off = 0; off < GWR_RING_SLOT_BYTES; off += 4096) {
            if (fills)
                p[off] = 0;
            else
                (void)p[off];
        }
    }
}

int gwr_ring_create(struct gwr_ring *r) {
    int fd = memfd_create("gpuwarden-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)GWR_RING_BYTES) == 0 && fcntl(fd, F_ADD_SEALS, SEALS) == 0)
        p = mmap(NULL, GWR_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    map(r, p);
    touch(r, GWR_RING_HTOD);
    r->hdr->client_polls = GWR_RING_POLL;
    return fd;
}

/* The worker maps only a memfd that can neither shrink (a fault in the
 * worker) nor be unsealed, of exactly the ring's size. */
int gwr_ring_map(struct gwr_ring *r, int fd) {
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & SEALS) != SEALS || fstat(fd, &st) || st.st_size != (off_t)GWR_RING_BYTES) return -1;
    void *p = mmap(NULL, GWR_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -1;
    map(r, p);
    touch(r, GWR_RING_DTOH);
    r->polled = r->hdr->client_polls == GWR_RING_POLL; /* the worker says whether it takes it */
    return 0;
}

void gwr_ring_unmap(struct gwr_ring *r) {
    if (r->base) munmap(r->base, GWR_RING_BYTES);
    r->base = NULL;
    r->state = NULL;
    r->hdr = NULL;
    r->polled = 0;
}

uint8_t *gwr_ring_slot(const struct gwr_ring *r, uint32_t slot) {
    return r->base + GWR_RING_HDR + (size_t)slot * GWR_RING_SLOT_BYTES;
}

int gwr_ring_take(struct gwr_ring *r, uint32_t first, int timeout_ms) {
    uint32_t slot = first + r->next;
    uint64_t now = gwr_mono_ns(), until = now + (uint64_t)timeout_ms * 1000000u;
    uint32_t v;
    /* The other side empties a slot in about the time this one fills one:
     * watch for it a while before sleeping (spin.h). */
    for (uint64_t spin = timeout_ms ? now + GWR_RING_SPIN_NS : 0;
         atomic_load_explicit(&r->state[slot], memory_order_acquire) && gwr_mono_ns() < spin;)
        __builtin_ia32_pause();
    while ((v = atomic_load_explicit(&r->state[slot], memory_order_acquire)) != 0) {
        uint64_t t = gwr_mono_ns();
        if (t >= until) return -1;
        /* 2: filled, and its filler sleeps on it (the emptier wakes it) */
        if (v == 1 && !atomic_compare_exchange_strong(&r->state[slot], &v, 2)) continue;
        struct timespec ts = {0, (long)(until - t < 100000000u ? until - t : 100000000u)}; /* at most 100 ms */
        /* any other value is the client's scribble: sleep on it all the same */
        syscall(SYS_futex, &r->state[slot], FUTEX_WAIT, v == 1 ? 2 : v, &ts, NULL, 0);
    }
    r->next = (r->next + 1) % (GWR_RING_SLOTS / 2);
    return (int)slot;
}

void gwr_ring_untake(struct gwr_ring *r) { r->next = (r->next + GWR_RING_SLOTS / 2 - 1) % (GWR_RING_SLOTS / 2); }

void gwr_ring_filled(struct gwr_ring *r, uint32_t slot) {
    atomic_store_explicit(&r->state[slot], 1, memory_order_release);
}

void gwr_ring_emptied(struct gwr_ring *r, uint32_t slot) {
    if (atomic_exchange_explicit(&r->state[slot], 0, memory_order_acq_rel) == 2)
        syscall(SYS_futex, &r->state[slot], FUTEX_WAKE, 1, NULL, NULL, 0);
}

int gwr_ring_announce(struct gwr_ring *r, uint32_t slot, uint32_t seq, uint64_t off, uint32_t len) {
    r->hdr->desc[slot] = (struct gwr_ring_desc){.seq = seq, .len = len, .off = off};
    /* The state's store and the sleeps word's load, and the client's pair
     * the other way round, are sequentially consistent: one side sees the
     * other's. */
    atomic_store_explicit(&r->state[slot], 1, memory_order_seq_cst);
    return atomic_load_explicit(&r->hdr->client_sleeps, memory_order_seq_cst) != 0;
}

int gwr_ring_sleeping(struct gwr_ring *r, uint32_t slot, int on) {
    atomic_store_explicit(&r->hdr->client_sleeps, on ? 1 : 0, memory_order_seq_cst);
    if (on && atomic_load_explicit(&r->state[slot], memory_order_seq_cst)) {
        atomic_store_explicit(&r->hdr->client_sleeps, 0, memory_order_relaxed);
        return 0;
    }
    return 1;
}
