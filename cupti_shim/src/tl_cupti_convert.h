/* CUPTI activity record -> raw trace records. Runs on the shim's writer thread (never on CUPTI's). */
#ifndef TL_CUPTI_CONVERT_H
#define TL_CUPTI_CONVERT_H
#include <cupti.h>
#include <stddef.h>
#include <stdint.h>
#include "tl_writer.h"

/* The newest kernel and context record versions the headers declare: CUPTI 13.1+ (API 130101) has
 * Kernel11 / Context4, 13.0 (130001) Kernel10 / Context3, 12.8 (26) Kernel9 / Context3. Every field read here
 * sits at the same offset in all of them (checked against the 12.8, 13.0, 13.1, 13.2 and 13.5 headers;
 * the asserts below pin it), so one build reads the records of any of these libcupti versions. */
#if CUPTI_API_VERSION < 26 /* 12.8's; older 12.x headers lack Memcpy6, Synchronization2, Context3 */
#error "teller's shim needs CUPTI headers from CUDA 12.8 or newer (CUPTI_API_VERSION >= 26): use --cuda-home, or the nvidia-cuda-cupti(-cu12) 12.8+ wheel"
#endif
#if CUPTI_API_VERSION >= 130101
typedef CUpti_ActivityKernel11 tl_kernel_rec;
typedef CUpti_ActivityContext4 tl_context_rec;
#elif CUPTI_API_VERSION >= 130001
typedef CUpti_ActivityKernel10 tl_kernel_rec;
typedef CUpti_ActivityContext3 tl_context_rec;
#else
typedef CUpti_ActivityKernel9 tl_kernel_rec;
typedef CUpti_ActivityContext3 tl_context_rec;
#endif
#define TL_SAME_OFFSET(a, b, f) _Static_assert(offsetof(a, f) == offsetof(b, f), #f " moved between " #a " and " #b)
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, start);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, end);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, deviceId);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, streamId);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, gridX);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, blockZ);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, correlationId);
TL_SAME_OFFSET(tl_kernel_rec, CUpti_ActivityKernel9, name);
TL_SAME_OFFSET(tl_context_rec, CUpti_ActivityContext3, contextId);
TL_SAME_OFFSET(tl_context_rec, CUpti_ActivityContext3, deviceId);

#define TL_EXT_MAP 65536 /* corr -> external id, direct mapped */
#define TL_MAX_CTX 256
#define TL_CBID_CACHE 4096

typedef const char *(*tl_cbname_fn)(void *ud, CUpti_CallbackDomain domain, uint32_t cbid);

/* Called (on the converting thread) the first time a device id shows up in a CONTEXT, kernel, memcpy or
 * memset record. */
typedef void (*tl_device_fn)(void *ud, uint32_t device_id);

#define TL_DEV_BIG 16 /* device ids >= 64 remembered (later ones are not reported) */

typedef struct tl_cupti_conv {
    tl_cbname_fn callback_name; /* may be NULL: names become "cbid:<n>" */
    void *ud;
    tl_device_fn on_device; /* may be NULL */
    void *device_ud;
    uint32_t self_tid; /* API records of this thread are the shim's own driver queries: not converted */
    uint64_t dev_seen; /* bit i: device i reported */
    uint32_t dev_big[TL_DEV_BIG], n_dev_big;
    /* runtime record sizes (0 = unknown: trust the compiled layout) */
    size_t size_kernel, size_memcpy, size_memset, size_sync, size_api;
    uint8_t skip_kernel, skip_memcpy, skip_memset, skip_sync; /* layout too small: conversion disabled */
    uint32_t ext_corr[TL_EXT_MAP];
    uint64_t ext_id[TL_EXT_MAP];
    uint32_t ctx_id[TL_MAX_CTX], ctx_dev[TL_MAX_CTX];
    uint32_t n_ctx;
    const char *cbname_rt[TL_CBID_CACHE], *cbname_drv[TL_CBID_CACHE];
    /* API calls not recorded (tl_cupti_conv_quiet_defaults): [0] runtime, [1] driver, by cbid */
    uint8_t quiet[2][TL_CBID_CACHE];
    uint64_t n_converted, n_ignored, n_quiet;
} tl_cupti_conv;

/* The query calls that the CUDA runtime and libraries make around every launch (cudaGetDevice,
 * cudaGetLastError, cuDevicePrimaryCtxGetState, cuKernelGetName, ...): on an H200 Llama decode they were
 * 90% of all API records (14 per kernel) and launch nothing. Kineto drops cudaGetDevice and
 * cudaGetLastError as well and records no driver queries. Lists of cbids, 0-terminated. */
extern const CUpti_CallbackId tl_quiet_runtime[], tl_quiet_driver[];

/* Mark the quiet lists in cv->quiet (the converter drops them even where libcupti could not be told to
 * skip them). */
void tl_cupti_conv_quiet_defaults(tl_cupti_conv *cv);

/* Check runtime struct sizes (from cuptiActivityGetStructSize) against the fields this converter
 * reads; kinds whose records are too small are skipped (and reported by the caller). */
TL_HIDDEN void tl_cupti_conv_check_sizes(tl_cupti_conv *cv);
TL_HIDDEN void tl_cupti_convert(tl_cupti_conv *cv, tl_thread *t, const CUpti_Activity *rec);
TL_HIDDEN void tl_cupti_write_dropped(tl_thread *t, uint64_t n, const char *reason);
#endif
