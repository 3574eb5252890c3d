/* A stand-in for libcuda.so.1: lets the CPU tests reach the shim's CUPTI set-up path, which refuses to
 * touch libcupti unless the CUDA driver is loaded, and answers the device queries the shim makes for the
 * header's deviceProperties. Two devices (ordinals 0 and 1); device 1 does not support the opt-in shared
 * memory attribute (the shim must leave that key out, not the device). Every query is reported to the
 * fake libcupti, which records it as DRIVER activity on the calling thread, as CUPTI does. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cupti_driver_cbid.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define V __attribute__((visibility("default")))
#define FAKE_NDEV 2

int teller_fake_cuda_marker(void);
int teller_fake_cuda_marker(void) { return 1; }

static void record(uint32_t cbid) {
    static void (*rec)(uint32_t, unsigned);
    if (!rec) {
        const char *p = getenv("TELLER_CUPTI_PATH");
        void *h = dlopen(p && *p ? p : "libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
        if (h) *(void **)&rec = dlsym(h, "fake_cupti_driver_call");
    }
    if (rec) rec(cbid, (unsigned)syscall(SYS_gettid));
}

V CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    record(CUPTI_DRIVER_TRACE_CBID_cuDeviceGet);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= FAKE_NDEV) return CUDA_ERROR_INVALID_DEVICE;
    *dev = 100 + ordinal; /* a handle, not the ordinal: the shim must pass it back */
    return CUDA_SUCCESS;
}

static int ordinal_of(CUdevice dev) { return dev >= 100 && dev < 100 + FAKE_NDEV ? dev - 100 : -1; }

V CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    record(CUPTI_DRIVER_TRACE_CBID_cuDeviceGetName);
    int o = ordinal_of(dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Teller Fake GPU %d", o);
    return CUDA_SUCCESS;
}

V CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    record(CUPTI_DRIVER_TRACE_CBID_cuDeviceTotalMem_v2);
    int o = ordinal_of(dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)(80 + o) << 30;
    return CUDA_SUCCESS;
}

/* device 0 has a UUID; device 1's query fails (the shim must leave the key out, not the device) */
V CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    record(CUPTI_DRIVER_TRACE_CBID_cuDeviceGetUuid_v2);
    int o = ordinal_of(dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    if (o == 1) return CUDA_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < 16; i++) uuid->bytes[i] = (char)(0xa0 + i);
    return CUDA_SUCCESS;
}

V CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    record(CUPTI_DRIVER_TRACE_CBID_cuDeviceGetAttribute);
    int o = ordinal_of(dev);
    if (o < 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *pi = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132 + o; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        if (o == 1) return CUDA_ERROR_NOT_SUPPORTED;
        *pi = 232448;
        break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
