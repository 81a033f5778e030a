/* Device enumeration and identity: count, handles, name, UUID, PCI, minor. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* PCI identity of an H200 SXM, what the simulated device stands for. */
#define SG_PCI_DEVICE_ID 0x233510deu /* device 0x2335, vendor NVIDIA 0x10de */
#define SG_PCI_SUBSYSTEM_ID 0x18be10deu

#define H(i) {SG_NVML_HANDLE_MAGIC, i}
static struct nvmlDevice_st g_handles[SG_MAX_DEVICES] = {H(0), H(1), H(2), H(3),
                                                         H(4), H(5), H(6), H(7)};
#undef H
_Static_assert(SG_MAX_DEVICES == 8, "g_handles lists one handle per possible device");

nvmlDevice_t nvml_handle(unsigned int index) { return &g_handles[index]; }

nvmlReturn_t nvml_device(nvmlDevice_t handle, struct sg_state **s, unsigned int *index) {
    struct sg_state *st = nvml_state();
    if (!st) return NVML_ERROR_UNINITIALIZED;
    /* Only look behind pointers into our own array: a stray handle must get
     * INVALID_ARGUMENT, not a crash. */
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)g_handles;
    if (p < base || p >= base + sizeof g_handles || (p - base) % sizeof g_handles[0])
        return NVML_ERROR_INVALID_ARGUMENT;
    if (handle->magic != SG_NVML_HANDLE_MAGIC || handle->index >= st->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *s = st;
    *index = handle->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_count(unsigned int *count) {
    struct sg_state *s = nvml_state();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = s->ndev;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    return device_count(deviceCount);
}

/* v1 counted only devices the caller may use: with simgpu, all of them. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return device_count(deviceCount);
}

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    struct sg_state *s = nvml_state();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= s->ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *device = nvml_handle(index);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    struct sg_state *s = nvml_state();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < s->ndev; i++) {
        if (!strcmp(s->dev[i].uuid, uuid)) {
            *device = nvml_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* NVIDIA accepts domain:bus:device.function, domain:bus:device and
 * bus:device.function, all hexadecimal. Returns 0 for anything else. */
static int parse_bus_id(const char *id, unsigned int *dom, unsigned int *bus, unsigned int *dev,
                        unsigned int *fn) {
    int end = -1;
    *dom = 0, *fn = 0;
    if (sscanf(id, "%x:%x:%x.%x%n", dom, bus, dev, fn, &end) == 4 && end > 0 && !id[end]) return 1;
    end = -1;
    if (sscanf(id, "%x:%x:%x%n", dom, bus, dev, &end) == 3 && end > 0 && !id[end]) return 1;
    end = -1;
    *dom = 0;
    if (sscanf(id, "%x:%x.%x%n", bus, dev, fn, &end) == 3 && end > 0 && !id[end]) return 1;
    return 0;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                                          nvmlDevice_t *device) {
    struct sg_state *s = nvml_state();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    unsigned int dom, bus, dev, fn;
    if (!pciBusId || !device || !parse_bus_id(pciBusId, &dom, &bus, &dev, &fn))
        return NVML_ERROR_INVALID_ARGUMENT;
    /* simgpu devices sit at domain 0, device 0, function 0 of their own bus. */
    for (unsigned int i = 0; i < s->ndev; i++) {
        if (dom == 0 && bus == s->dev[i].pci_bus && dev == 0 && fn == 0) {
            *device = nvml_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = i;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    return nvml_copy_string(name, length, s->dev[i].name);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    return nvml_copy_string(uuid, length, s->dev[i].uuid);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sg_device *d = &s->dev[i];
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = d->pci_bus;
    pci->device = 0;
    pci->pciDeviceId = SG_PCI_DEVICE_ID;
    pci->pciSubSystemId = SG_PCI_SUBSYSTEM_ID;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             pci->domain, pci->bus, pci->device);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, pci->domain, pci->bus,
             pci->device);
    return NVML_SUCCESS;
}

/* The minor number names /dev/nvidia<minor>; simgpu numbers them like indexes. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    struct sg_state *s;
    unsigned int i;
    nvmlReturn_t ret = nvml_device(device, &s, &i);
    if (ret != NVML_SUCCESS) return ret;
    if (!minorNumber) return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = i;
    return NVML_SUCCESS;
}
