/* gpuwarden's control block: the one definition of the files the interposer
 * (libgpuwarden.so) and the agent share, per container, under the control
 * directory (GPUWARDEN_CONTROL_DIR, default /run/gpuwarden):
 *
 *   <control dir>/<container key>/limits  written by the agent only; mounted
 *                                         read-only into the container
 *   <control dir>/<container key>/usage   written by the container's processes;
 *                                         untrusted input to everything else
 *
 * The container key is the process's cgroup v2 path escaped into one
 * directory name (README.md in this directory gives the rule; Go computes it
 * in enforcer/controlblock). Both files are little-endian, fixed-size, and
 * mapped MAP_SHARED by every party. Fields that more than one process touches
 * at once are _Atomic; the Go side (enforcer/controlblock) mirrors this layout
 * and a test checks every offset and size against this header.
 *
 * Versioning: readers require the same major version and a size at least
 * their own struct's size; a minor version only adds fields inside the
 * reserved space, which writers of an older minor leave zero. A ledger's
 * abi_minor is its creator's: the fields of a later minor are written and
 * read only in ledgers of that minor or later.
 *
 * Minor 1: launches and throttled time per device (usage.launches_dev,
 * usage.throttled_ns_dev; what of a process's counts they hold:
 * slot.launches_placed, slot.throttled_placed_ns).
 *
 * Minor 2: usage.dev_mismatches, the interposer's check of the device it
 * keeps for each thread's current context against the driver's.
 *
 * Minor 3: usage.mark_rec_ns and usage.mark_done_ns, completion marks:
 * when the work launched before a closed gate has run (the agent's clock
 * for a time slice).
 *
 * Minor 4: gate.closes, counted by the agent at every close, so that a
 * thread's tickets taken ahead of its launches (a batch) lapse at a close.
 */
#ifndef GPUWARDEN_ABI_H
#define GPUWARDEN_ABI_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define GW_ABI_MAJOR 1
#define GW_ABI_MINOR 4

#define GW_MAX_DEVICES 16  /* device ordinals as the container's processes see them */
#define GW_MAX_SLOTS 128   /* processes per container using the GPU at once */
#define GW_CGROUP_PATH_MAX 512

#define GW_LIMITS_MAGIC 0x5354494d494c5747ull /* "GWLIMITS" */
#define GW_USAGE_MAGIC 0x0045474153555747ull  /* "GWUSAGE\0" */

#define GW_DEFAULT_CONTEXT_RESERVE (64ull << 20)   /* bytes charged per context */
#define GW_DEFAULT_GRACE_NS 10000000000ull         /* an agent silent this long lifts the gate */

/* One device's launch gate, on a cache line of its own. The agent raises
 * grant and then bumps wake and FUTEX_WAKEs it; a launch holding ticket t
 * (from usage.launches_issued) runs once t <= grant. At the end of the
 * container's time slice the agent lowers grant to the tickets taken and
 * then adds one to closes, so that what it released and was not used waits
 * for the next slice (a launch that took its ticket just before may still
 * pass). A thread may take several tickets at once (limits of minor 4); those
 * it took before a close and has not used lapse when it sees closes move. */
struct gw_gate {
    _Atomic uint64_t grant;   /* launches allowed on this device, container-wide, since usage was created */
    _Atomic uint32_t wake;    /* futex word: +1 after every grant change */
    uint32_t pad0;
    _Atomic uint64_t closes;  /* minor 4: closes of this gate so far */
    uint64_t reserved[5];
};

enum gw_priority { GW_PRIORITY_NORMAL = 0, GW_PRIORITY_HIGH = 1 };

/* limits: the agent's word on one container. */
struct gw_limits {
    uint64_t magic;                 /* GW_LIMITS_MAGIC */
    uint16_t abi_major;             /* GW_ABI_MAJOR */
    uint16_t abi_minor;             /* GW_ABI_MINOR */
    uint32_t size;                  /* sizeof(struct gw_limits) of the writer */
    _Atomic uint64_t seq;           /* seqlock over the config below: odd while the agent writes it */
    /* config: read only under seq */
    _Atomic uint64_t generation;    /* the agent's config number; raised on every change */
    _Atomic uint64_t context_reserve; /* bytes charged per context; 0 means GW_DEFAULT_CONTEXT_RESERVE */
    _Atomic uint64_t grace_ns;      /* heartbeat older than this lifts the gate; 0 means GW_DEFAULT_GRACE_NS */
    _Atomic uint32_t gate_mask;     /* bit d set: launches on device d wait for grants */
    _Atomic uint32_t ndev;          /* informational: devices the agent configured */
    _Atomic uint64_t mem_limit[GW_MAX_DEVICES]; /* bytes per device, container-wide; 0 means no limit */
    uint64_t reserved_config[8];
    /* live: outside the seqlock */
    _Atomic uint64_t heartbeat_ns;  /* CLOCK_MONOTONIC ns of the agent's last beat */
    struct gw_gate gate[GW_MAX_DEVICES];
    uint8_t reserved[768];
};

enum gw_slot_state { GW_SLOT_FREE = 0, GW_SLOT_CLAIMING = 1, GW_SLOT_LIVE = 2, GW_SLOT_REAPING = 3 };

/* One process of the container. */
struct gw_slot {
    _Atomic uint32_t state;         /* enum gw_slot_state */
    _Atomic int32_t pid;            /* as the container's pid namespace sees it */
    _Atomic uint64_t start_time;    /* /proc/<pid>/stat field 22 (clock ticks since boot) */
    _Atomic uint64_t bytes[GW_MAX_DEVICES]; /* device bytes this process holds, context reserve included */
    _Atomic uint64_t launches;      /* kernel and graph launches */
    _Atomic uint64_t throttled_ns;  /* time launches waited at the gate */
    _Atomic uint64_t alloc_failures; /* allocations refused for the quota */
    /* minor 1: the part of launches and throttled_ns also counted per device
     * in usage.launches_dev and usage.throttled_ns_dev (the rest was counted
     * where the launch's device was not known: no gate) */
    _Atomic uint64_t launches_placed;     /* launches */
    _Atomic uint64_t throttled_placed_ns; /* ns */
    uint8_t reserved[72];
};

enum gw_claim_flags { GW_CLAIM_MEMORY_SET = 1 }; /* the environment set a memory limit */

/* usage: the container's ledger. */
struct gw_usage {
    uint64_t magic;                 /* GW_USAGE_MAGIC */
    uint16_t abi_major;
    uint16_t abi_minor;
    uint32_t size;                  /* sizeof(struct gw_usage) */
    uint32_t max_devices;           /* GW_MAX_DEVICES */
    uint32_t max_slots;             /* GW_MAX_SLOTS */
    uint32_t slot_size;             /* sizeof(struct gw_slot) */
    _Atomic uint32_t ndev;          /* devices the processes see (cuDeviceGetCount) */
    _Atomic uint64_t reserved_bytes[GW_MAX_DEVICES];  /* container-wide, the quota counter */
    _Atomic uint64_t launches_issued[GW_MAX_DEVICES]; /* gate tickets taken, container-wide */
    _Atomic uint64_t alloc_failures[GW_MAX_DEVICES];  /* allocations refused for the quota */
    /* what the container claims from its environment (for standalone mode and the agent) */
    _Atomic uint64_t claim_mem_limit[GW_MAX_DEVICES]; /* bytes, 0 none */
    _Atomic uint32_t claim_weight;  /* GPUWARDEN_COMPUTE_WEIGHT / ALIYUN_COM_GPU_SCHD_WEIGHT */
    _Atomic uint32_t claim_compute_limit; /* percent, 0 none */
    _Atomic uint32_t claim_priority;      /* enum gw_priority */
    _Atomic uint32_t claim_flags;         /* enum gw_claim_flags */
    _Atomic uint64_t cgroup_id;           /* inode of the cgroup directory, 0 unknown */
    char cgroup_path[GW_CGROUP_PATH_MAX]; /* as /proc/self/cgroup shows it, NUL-terminated; empty if longer; set at creation */
    uint8_t dev_uuid[GW_MAX_DEVICES][16]; /* CUDA UUID of each ordinal; zero unknown */
    uint8_t pad1[8];
    /* minor 1: container-wide, by device ordinal, the launches whose device
     * the interposer knew (those made while the container has a gate on any
     * device) and all the time launches waited at a gate; each array on
     * cache lines of its own, apart from launches_issued's */
    _Atomic uint64_t launches_dev[GW_MAX_DEVICES];   /* launches */
    _Atomic uint64_t throttled_ns_dev[GW_MAX_DEVICES]; /* ns */
    /* minor 2: times a gated launch's device, as the interposer kept it
     * from the context hooks, differed from the driver's when checked (one
     * launch in 1024): a context made current by a path the hooks did not
     * see. 0 in a sound process. */
    _Atomic uint64_t dev_mismatches;
    uint8_t pad2[56];
    /* minor 3: the latest completion mark of each device's gate: the work
     * of tickets up to mark_ticket has run by mark_done_ns. A launch that
     * waits at the gate with ticket t first records an event on its
     * stream, at mark_rec_ns (CLOCK_MONOTONIC), with mark_ticket t - 1; once
     * the work launched there before it has run, the time it was seen done
     * is mark_done_ns (0 until then); a launch that passes before then
     * withdraws its mark (mark_rec_ns 0). A synchronize that returns marks
     * its device done at once, with mark_ticket the tickets taken by then.
     * The latest mark of any process wins. Untrusted: the agent bounds it. */
    _Atomic uint64_t mark_rec_ns[GW_MAX_DEVICES];
    _Atomic uint64_t mark_done_ns[GW_MAX_DEVICES];
    _Atomic uint64_t mark_ticket[GW_MAX_DEVICES];
    uint8_t reserved[2048];
    struct gw_slot slots[GW_MAX_SLOTS];
};

/* The layout is the ABI: these hold on every compiler that builds it. */
_Static_assert(sizeof(struct gw_gate) == 64, "gw_gate");
_Static_assert(offsetof(struct gw_gate, closes) == 16, "gw_gate.closes");
_Static_assert(offsetof(struct gw_limits, gate) == 256, "gw_limits.gate");
_Static_assert(sizeof(struct gw_limits) == 2048, "gw_limits");
_Static_assert(sizeof(struct gw_slot) == 256, "gw_slot");
_Static_assert(offsetof(struct gw_slot, launches_placed) == 168, "gw_slot.launches_placed");
_Static_assert(offsetof(struct gw_usage, launches_dev) == 1344, "gw_usage.launches_dev");
_Static_assert(offsetof(struct gw_usage, launches_dev) % 64 == 0, "gw_usage.launches_dev: own cache lines");
_Static_assert(offsetof(struct gw_usage, throttled_ns_dev) % 64 == 0, "gw_usage.throttled_ns_dev: own cache lines");
_Static_assert(sizeof(((struct gw_usage *)0)->launches_dev) % 64 == 0, "gw_usage.launches_dev: whole cache lines");
_Static_assert(offsetof(struct gw_usage, dev_mismatches) == 1600, "gw_usage.dev_mismatches");
_Static_assert(offsetof(struct gw_usage, mark_rec_ns) == 1664, "gw_usage.mark_rec_ns");
_Static_assert(offsetof(struct gw_usage, reserved) == 2048, "gw_usage.reserved");
_Static_assert(offsetof(struct gw_usage, slots) == 4096, "gw_usage.slots");
_Static_assert(sizeof(struct gw_usage) == 4096 + GW_MAX_SLOTS * 256, "gw_usage");

#endif
