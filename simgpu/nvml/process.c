/* Per-process views: running compute processes and their utilization. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

#define NO_MIG_INSTANCE 0xFFFFFFFFu /* gpuInstanceId/computeInstanceId without MIG */

struct proc_mem {
    unsigned int pid;
    unsigned long long mem;
};

/* collect_users fills out (SG_MAX_PROCS entries) with the live processes that
 * hold memory or a context on device dev, and returns how many. Dead
 * processes are reaped first, so a SIGKILLed user vanishes from the list. */
static unsigned int collect_users(struct sg_state *s, unsigned int dev, struct proc_mem *out) {
    sg_reap_dead(s);
    unsigned int n = 0;
    for (int k = 0; k < SG_MAX_PROCS; k++) {
        struct sg_proc *p = &s->procs[k];
        if (atomic_load(&p->state) != SG_PROC_LIVE) continue;
        unsigned long long mem = atomic_load(&p->mem[dev]);
        if (!mem && !atomic_load(&p->contexts[dev])) continue;
        out[n].pid = (unsigned int)p->pid;
        out[n].mem = mem;
        n++;
    }
    return n;
}

/* The part v1, v2 and v3 share: argument checks, the snapshot, and NVIDIA's
 * sizing protocol (*infoCount == 0 with infos NULL asks for the count; a
 * short buffer gets NVML_ERROR_INSUFFICIENT_SIZE and the count needed). */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount,
                                      const void *infos, struct proc_mem *found) {
    struct sg_state *s;
    unsigned int dev;
    nvmlReturn_t ret = nvml_device(device, &s, &dev);
    if (ret != NVML_SUCCESS) return ret;
    if (!infoCount || (*infoCount && !infos)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = collect_users(s, dev, found);
    ret = n > *infoCount ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *infoCount = n;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_v1_t *infos) {
    struct proc_mem found[SG_MAX_PROCS];
    nvmlReturn_t ret = running_processes(device, infoCount, infos, found);
    if (ret != NVML_SUCCESS) return ret;
    for (unsigned int i = 0; i < *infoCount; i++) {
        memset(&infos[i], 0, sizeof infos[i]);
        infos[i].pid = found[i].pid;
        infos[i].usedGpuMemory = found[i].mem;
    }
    return NVML_SUCCESS;
}

static void fill_v2(nvmlProcessInfo_v2_t *info, const struct proc_mem *p) {
    memset(info, 0, sizeof *info);
    info->pid = p->pid;
    info->usedGpuMemory = p->mem;
    info->gpuInstanceId = NO_MIG_INSTANCE;
    info->computeInstanceId = NO_MIG_INSTANCE;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_v2_t *infos) {
    struct proc_mem found[SG_MAX_PROCS];
    nvmlReturn_t ret = running_processes(device, infoCount, infos, found);
    if (ret != NVML_SUCCESS) return ret;
    for (unsigned int i = 0; i < *infoCount; i++) fill_v2(&infos[i], &found[i]);
    return NVML_SUCCESS;
}

/* v3 differs from v2 only in the name of its struct type (nvmlProcessInfo_t, one
 * typedef with nvmlProcessInfo_v2_t in nvml.h). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos) {
    return nvmlDeviceGetComputeRunningProcesses_v2(device, infoCount, infos);
}

/* NVIDIA's view (SIMGPU_MODEL=h200): from the samples newer than since (0:
 * every sample the buffer holds), one per live process, its latest one with
 * non-zero utilization. A process that was not on the engine at any sample
 * instant gets nothing, however busy it was in between. */
static unsigned int sampled(struct sg_state *s, unsigned int dev, unsigned long long since,
                            nvmlProcessUtilizationSample_t *found) {
    const struct sg_device *d = &s->dev[dev];
    unsigned int n = 0;
    for (int i = 0; i < SG_NVML_SAMPLES; i++) {
        const struct sg_nvml_sample *x = &d->nvml[i];
        uint64_t ts = atomic_load(&x->ts_us);
        int32_t pid = atomic_load(&x->pid);
        uint32_t pct = atomic_load(&x->pct);
        if (!ts || ts <= since || !pct || atomic_load(&x->ts_us) != ts) continue; /* rewritten meanwhile */
        int live = 0;
        for (int k = 0; k < SG_MAX_PROCS && !live; k++)
            live = atomic_load(&s->procs[k].state) == SG_PROC_LIVE && s->procs[k].pid == pid;
        if (!live) continue;
        unsigned int j = 0;
        while (j < n && found[j].pid != (unsigned int)pid) j++;
        if (j == n) n++;
        else if (found[j].timeStamp > ts) continue;
        memset(&found[j], 0, sizeof found[j]);
        found[j].pid = (unsigned int)pid;
        found[j].timeStamp = ts;
        found[j].smUtil = pct;
        found[j].memUtil = pct / 2; /* as the exact view */
    }
    return n;
}

/* Exact model: one sample per live process whose share of the device since
 * lastSeenTimeStamp (0: the last second) is non-zero, as NVIDIA returns one
 * per process "that had some non-zero utilization". The sample's timeStamp is
 * when it was measured, for the caller's next lastSeenTimeStamp. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                         nvmlProcessUtilizationSample_t *utilization,
                                                         unsigned int *processSamplesCount,
                                                         unsigned long long lastSeenTimeStamp) {
    struct sg_state *s;
    unsigned int dev;
    nvmlReturn_t ret = nvml_device(device, &s, &dev);
    if (ret != NVML_SUCCESS) return ret;
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    /* Nothing can be newer than now; sg_busy_percent would read a future
     * timestamp as "the last second". */
    if (lastSeenTimeStamp >= sg_wall_ns() / 1000) return NVML_ERROR_NOT_FOUND;
    sg_reap_dead(s);

    nvmlProcessUtilizationSample_t found[SG_MAX_PROCS];
    unsigned int n = 0, live = 0;
    for (int k = 0; k < SG_MAX_PROCS; k++) {
        struct sg_proc *p = &s->procs[k];
        if (atomic_load(&p->state) != SG_PROC_LIVE) continue;
        live++;
        if (sg_model.h200) continue;
        uint64_t ts;
        unsigned int pct = sg_busy_percent(&p->busy[dev], lastSeenTimeStamp, &ts);
        if (!pct) continue;
        memset(&found[n], 0, sizeof found[n]);
        found[n].pid = (unsigned int)p->pid;
        found[n].timeStamp = ts;
        found[n].smUtil = pct;
        found[n].memUtil = pct / 2; /* as nvmlDeviceGetUtilizationRates models memory */
        n++;
    }
    if (sg_model.h200) n = sampled(s, dev, lastSeenTimeStamp, found);
    if (!n) return NVML_ERROR_NOT_FOUND;
    if (!utilization) {
        /* The sizing call: answer with room for every live process, not just
         * today's active ones, so that one starting before the caller's
         * second call still fits (NVIDIA answers with its buffer's capacity). */
        *processSamplesCount = live;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > *processSamplesCount) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(utilization, found, n * sizeof found[0]);
    *processSamplesCount = n;
    return NVML_SUCCESS;
}
