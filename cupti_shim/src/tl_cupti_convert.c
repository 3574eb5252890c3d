#define _GNU_SOURCE
#include "tl_cupti_convert.h"
#include "tl_msgpack.h"

#include <stdio.h>

/* Fields read from each record must lie within the runtime record size. */
#define END_OF(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

void tl_cupti_conv_check_sizes(tl_cupti_conv *cv) {
    cv->skip_kernel = cv->size_kernel && cv->size_kernel < END_OF(tl_kernel_rec, name);
    cv->skip_memcpy = cv->size_memcpy && cv->size_memcpy < END_OF(CUpti_ActivityMemcpy6, correlationId);
    cv->skip_memset = cv->size_memset && cv->size_memset < END_OF(CUpti_ActivityMemset4, correlationId);
    cv->skip_sync = cv->size_sync && cv->size_sync < END_OF(CUpti_ActivitySynchronization2, streamId);
}

const CUpti_CallbackId tl_quiet_runtime[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaPeekAtLastError_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaDeviceGetAttribute_v5000,
    0};
const CUpti_CallbackId tl_quiet_driver[] = {
    CUPTI_DRIVER_TRACE_CBID_cuDevicePrimaryCtxGetState,
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent,
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetDevice,
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetId,
    CUPTI_DRIVER_TRACE_CBID_cuDeviceGet,
    CUPTI_DRIVER_TRACE_CBID_cuDeviceGetAttribute,
    CUPTI_DRIVER_TRACE_CBID_cuKernelGetName,
    CUPTI_DRIVER_TRACE_CBID_cuKernelGetAttribute,
    CUPTI_DRIVER_TRACE_CBID_cuFuncGetName,
    CUPTI_DRIVER_TRACE_CBID_cuFuncGetAttribute,
    CUPTI_DRIVER_TRACE_CBID_cuGetErrorString,
    CUPTI_DRIVER_TRACE_CBID_cuGetErrorName,
    CUPTI_DRIVER_TRACE_CBID_cuPointerGetAttribute,
    CUPTI_DRIVER_TRACE_CBID_cuPointerGetAttributes,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCtx,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetId,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCtx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetId_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCtx_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetCtx_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetDevice,
    CUPTI_DRIVER_TRACE_CBID_cuStreamGetDevice_ptsz,
#if CUPTI_API_VERSION >= 130001
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetDevice_v2,
#endif
    CUPTI_DRIVER_TRACE_CBID_cuDriverGetVersion,
    CUPTI_DRIVER_TRACE_CBID_cuCtxGetLimit,
    CUPTI_DRIVER_TRACE_CBID_cuGetProcAddress,
    CUPTI_DRIVER_TRACE_CBID_cuGetProcAddress_v2,
    0};

void tl_cupti_conv_quiet_defaults(tl_cupti_conv *cv) {
    for (const CUpti_CallbackId *c = tl_quiet_runtime; *c; c++)
        if (*c < TL_CBID_CACHE) cv->quiet[0][*c] = 1;
    for (const CUpti_CallbackId *c = tl_quiet_driver; *c; c++)
        if (*c < TL_CBID_CACHE) cv->quiet[1][*c] = 1;
}

static uint32_t device_of_context(tl_cupti_conv *cv, uint32_t ctx) {
    for (uint32_t i = 0; i < cv->n_ctx; i++)
        if (cv->ctx_id[i] == ctx) return cv->ctx_dev[i];
    return 0;
}

static void note_device_slow(tl_cupti_conv *cv, uint32_t dev) {
    if (dev < 64) {
        cv->dev_seen |= 1ull << dev;
    } else {
        for (uint32_t i = 0; i < cv->n_dev_big; i++)
            if (cv->dev_big[i] == dev) return;
        if (cv->n_dev_big == TL_DEV_BIG) return;
        cv->dev_big[cv->n_dev_big++] = dev;
    }
    if (cv->on_device) cv->on_device(cv->device_ud, dev);
}

/* Kernel/memcpy/memset records too, not only CONTEXT: one branch per record, and the header still
 * gets its GPU if the CONTEXT kind could not be enabled. */
static inline void note_device(tl_cupti_conv *cv, uint32_t dev) {
    if (TL_LIKELY(dev < 64 && (cv->dev_seen >> dev) & 1)) return;
    note_device_slow(cv, dev);
}

static const char *memcpy_kind_name(uint8_t k) {
    switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "Unknown";
    }
}

static const char *sync_type_name(CUpti_ActivitySynchronizationType ty) {
    switch (ty) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "cudaEventSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "cudaStreamWaitEvent";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "cudaStreamSynchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "cudaDeviceSynchronize";
    default: return "Synchronization";
    }
}

static const char *api_name(tl_cupti_conv *cv, CUpti_CallbackDomain dom, uint32_t cbid, char *tmp, size_t n) {
    const char **cache = dom == CUPTI_CB_DOMAIN_RUNTIME_API ? cv->cbname_rt : cv->cbname_drv;
    if (cbid < TL_CBID_CACHE && cache[cbid]) return cache[cbid];
    const char *s = cv->callback_name ? cv->callback_name(cv->ud, dom, cbid) : NULL;
    if (s && cbid < TL_CBID_CACHE) cache[cbid] = s;
    if (s) return s;
    snprintf(tmp, n, "%s:%u", dom == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime_cbid" : "driver_cbid", cbid);
    return tmp;
}

static void put_xyz(uint8_t **c, int32_t x, int32_t y, int32_t z) {
    mp_arr(c, 3);
    mp_int(c, x);
    mp_int(c, y);
    mp_int(c, z);
}

/* GPU [4, layer, name, device, stream, start, end, corr, args] — args written by the caller */
static uint8_t *gpu_head(tl_thread *t, uint8_t **rec, int layer, uint32_t name, uint32_t dev, uint32_t stream,
                         uint64_t start, uint64_t end, uint32_t corr) {
    uint8_t *r = tl_reserve(t, 160);
    if (!r) return NULL;
    uint8_t *c = r + 1;
    mp_uint(&c, TL_GPU);
    mp_uint(&c, (uint64_t)layer);
    mp_uint(&c, name);
    mp_uint(&c, dev);
    mp_uint(&c, stream);
    mp_uint(&c, start);
    mp_uint(&c, end);
    mp_uint(&c, corr);
    *rec = r;
    return c;
}

void tl_cupti_write_dropped(tl_thread *t, uint64_t n, const char *reason) {
    uint32_t sid = tl_intern(t, reason, strlen(reason));
    uint8_t *r = tl_reserve(t, 32);
    if (!r) return;
    uint8_t *c = r + 1;
    mp_uint(&c, TL_DROPPED);
    mp_uint(&c, n);
    mp_uint(&c, sid);
    tl_commit(t, r, c, 0x93);
}

void tl_cupti_convert(tl_cupti_conv *cv, tl_thread *t, const CUpti_Activity *rec) {
    uint8_t *r, *c;
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        if (cv->skip_kernel) break;
        const tl_kernel_rec *k = (const tl_kernel_rec *)(const void *)rec;
        const char *nm = k->name ? k->name : "<unknown kernel>";
        note_device(cv, k->deviceId);
        uint32_t name = tl_intern(t, nm, strlen(nm));
        if (!(c = gpu_head(t, &r, TL_L_KERNEL, name, k->deviceId, k->streamId, k->start, k->end, k->correlationId))) return;
        mp_map(&c, 2);
        mp_str(&c, "grid", 4); put_xyz(&c, k->gridX, k->gridY, k->gridZ);
        mp_str(&c, "block", 5); put_xyz(&c, k->blockX, k->blockY, k->blockZ);
        tl_commit(t, r, c, 0x99);
        cv->n_converted++;
        return;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        if (cv->skip_memcpy) break;
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)(const void *)rec;
        note_device(cv, m->deviceId);
        const char *kn = memcpy_kind_name(m->copyKind);
        char nm[32];
        snprintf(nm, sizeof nm, "Memcpy %s", kn);
        uint32_t name = tl_intern(t, nm, strlen(nm));
        if (!(c = gpu_head(t, &r, TL_L_MEMCPY, name, m->deviceId, m->streamId, m->start, m->end, m->correlationId))) return;
        mp_map(&c, 2);
        mp_str(&c, "bytes", 5); mp_uint(&c, m->bytes);
        mp_str(&c, "kind", 4); mp_cstr(&c, kn);
        tl_commit(t, r, c, 0x99);
        cv->n_converted++;
        return;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        if (cv->skip_memset) break;
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)(const void *)rec;
        note_device(cv, m->deviceId);
        uint32_t name = tl_intern(t, "Memset", 6);
        if (!(c = gpu_head(t, &r, TL_L_MEMSET, name, m->deviceId, m->streamId, m->start, m->end, m->correlationId))) return;
        mp_map(&c, 1);
        mp_str(&c, "bytes", 5); mp_uint(&c, m->bytes);
        tl_commit(t, r, c, 0x99);
        cv->n_converted++;
        return;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        if (cv->skip_sync) break;
        const CUpti_ActivitySynchronization2 *s = (const CUpti_ActivitySynchronization2 *)(const void *)rec;
        const char *nm = sync_type_name(s->type);
        uint32_t name = tl_intern(t, nm, strlen(nm));
        if (!(c = gpu_head(t, &r, TL_L_SYNC, name, device_of_context(cv, s->contextId), s->streamId, s->start, s->end,
                           s->correlationId)))
            return;
        mp_map(&c, 1);
        mp_str(&c, "context", 7); mp_uint(&c, s->contextId);
        tl_commit(t, r, c, 0x99);
        cv->n_converted++;
        return;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)(const void *)rec;
        int rt = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        if (cv->self_tid && a->threadId == cv->self_tid) break; /* the device queries of on_device */
        if (a->cbid < TL_CBID_CACHE && cv->quiet[!rt][a->cbid]) {
            cv->n_quiet++;
            return;
        }
        char tmp[48];
        const char *nm = api_name(cv, rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, tmp, sizeof tmp);
        uint32_t name = tl_intern(t, nm, strlen(nm));
        uint32_t slot = a->correlationId & (TL_EXT_MAP - 1);
        uint64_t ext = (cv->ext_corr[slot] == a->correlationId) ? cv->ext_id[slot] : 0;
        r = tl_reserve(t, 80);
        if (!r) return;
        c = r + 1;
        mp_uint(&c, TL_SPAN);
        mp_uint(&c, rt ? TL_L_RUNTIME : TL_L_DRIVER);
        mp_uint(&c, name);
        mp_uint(&c, a->threadId);
        mp_uint(&c, a->start);
        mp_uint(&c, a->end);
        mp_uint(&c, a->correlationId);
        mp_uint(&c, ext);
        tl_commit(t, r, c, 0x98);
        cv->n_converted++;
        return;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        /* CUPTI writes it just before the API record it refers to (same thread, same buffer). */
        const CUpti_ActivityExternalCorrelation *x = (const CUpti_ActivityExternalCorrelation *)(const void *)rec;
        uint32_t slot = x->correlationId & (TL_EXT_MAP - 1);
        cv->ext_corr[slot] = x->correlationId;
        cv->ext_id[slot] = x->externalId;
        cv->n_converted++;
        return;
    }
    case CUPTI_ACTIVITY_KIND_CONTEXT: {
        const tl_context_rec *x = (const tl_context_rec *)(const void *)rec;
        note_device(cv, x->deviceId);
        for (uint32_t i = 0; i < cv->n_ctx; i++)
            if (cv->ctx_id[i] == x->contextId) { cv->ctx_dev[i] = x->deviceId; return; }
        if (cv->n_ctx < TL_MAX_CTX) {
            cv->ctx_id[cv->n_ctx] = x->contextId;
            cv->ctx_dev[cv->n_ctx] = x->deviceId;
            cv->n_ctx++;
        }
        cv->n_converted++;
        return;
    }
    default:
        break;
    }
    cv->n_ignored++;
}
