/* CUPTI injection: InitializeInjection (CUDA_INJECTION64_PATH). libcupti is loaded with dlopen so
 * that NVTX-only collection never needs it. Activity buffers completed by CUPTI are queued and parsed
 * on the shim's own writer thread, never on CUPTI's thread. */
#define _GNU_SOURCE
#include "tl_cupti_convert.h"
#include "tl_msgpack.h"
#include "tl_nvtx.h"
#include "tl_writer.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define TL_EXT_KIND CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2

typedef struct tl_buf {
    uint8_t *buf;
    size_t valid;
    size_t dropped;
    struct tl_buf *next;
} tl_buf;

static struct {
    void *lib;
    CUptiResult (*GetVersion)(uint32_t *);
    CUptiResult (*GetResultString)(CUptiResult, const char **);
    CUptiResult (*GetCallbackName)(CUpti_CallbackDomain, uint32_t, const char **);
    CUptiResult (*Subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
#ifdef CUpti_SubscriberParams_STRUCT_SIZE /* CUPTI 13.0+ headers */
    CUptiResult (*Subscribe_v2)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *, CUpti_SubscriberParams *);
#endif
    CUptiResult (*EnableDomain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
    CUptiResult (*EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
    CUptiResult (*SetThreadIdType)(CUpti_ActivityThreadIdType);
    CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
    CUptiResult (*ActivityEnableRuntimeApi)(CUpti_CallbackId, uint8_t);
    CUptiResult (*ActivityEnableDriverApi)(CUpti_CallbackId, uint8_t);
    CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*ActivityRegisterTimestampCallback)(CUpti_TimestampCallbackFunc);
    CUptiResult (*ActivityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
    CUptiResult (*ActivityFlushAll)(uint32_t);
    CUptiResult (*ActivityFlushPeriod)(uint32_t);
    CUptiResult (*ActivityPushExternalCorrelationId)(CUpti_ExternalCorrelationKind, uint64_t);
    CUptiResult (*ActivityPopExternalCorrelationId)(CUpti_ExternalCorrelationKind, uint64_t *);
    CUptiResult (*ActivityGetStructSize)(CUpti_ActivityKind, uint32_t, size_t *);

    CUpti_SubscriberHandle sub;
    int active;
    pid_t pid;
    uint32_t version;
    size_t buf_size;
    /* completed-buffer queue (CUPTI thread -> writer thread) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tl_buf *head, *tail;
    tl_buf *free_bufs; /* recycled buffers */
    int n_free;
    int stop, thread_running;
    pthread_t thread;
    tl_cupti_conv *conv;
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int g_init_state; /* 0 never, 1 done (idempotent entry point) */

static const char *result_str(CUptiResult r) {
    const char *s = NULL;
    if (C.GetResultString && C.GetResultString(r, &s) == CUPTI_SUCCESS && s) return s;
    return "CUPTI error";
}

static uint64_t CUPTIAPI ts_callback(void) { return tl_now(); }

/* ---- buffers: CUPTI's thread only allocates and enqueues ---- */

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *maxNumRecords) {
    uint8_t *b = NULL;
    pthread_mutex_lock(&C.mu);
    if (C.free_bufs) {
        tl_buf *f = C.free_bufs;
        C.free_bufs = f->next;
        C.n_free--;
        b = f->buf;
        free(f);
    }
    pthread_mutex_unlock(&C.mu);
    if (!b) b = aligned_alloc(8, C.buf_size);
    *buffer = b;
    *size = b ? C.buf_size : 0;
    *maxNumRecords = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t streamId, uint8_t *buffer, size_t size, size_t validSize) {
    (void)size;
    size_t dropped = 0;
    if (C.ActivityGetNumDroppedRecords) C.ActivityGetNumDroppedRecords(ctx, streamId, &dropped);
    if (!buffer) return;
    tl_buf *q = malloc(sizeof *q);
    if (!q) { free(buffer); return; }
    q->buf = buffer;
    q->valid = validSize;
    q->dropped = dropped;
    q->next = NULL;
    pthread_mutex_lock(&C.mu);
    if (C.tail) C.tail->next = q; else C.head = q;
    C.tail = q;
    pthread_cond_signal(&C.cv);
    pthread_mutex_unlock(&C.mu);
}

static const char *cbname(void *ud, CUpti_CallbackDomain dom, uint32_t cbid) {
    (void)ud;
    const char *s = NULL;
    if (C.GetCallbackName && C.GetCallbackName(dom, cbid, &s) == CUPTI_SUCCESS) return s;
    return NULL;
}

/* ---- GPUs for the header: the CUDA driver API, on the writer thread ---- */

/* Resolved from the already loaded libcuda.so.1 (never linked, never loaded by us). By the time a device
 * id shows up in a record a context exists, so the driver is initialised and these queries need no
 * context of their own. CUPTI records them as DRIVER activity on this thread: the converter drops those
 * (self_tid). Failures are a DIAG warning (once each) and leave the field or the device out. */
static struct {
    int state; /* 0 not resolved, 1 ok, -1 unusable */
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    int warned_get, warned_total, warned_attr, warned_uuid, warned_full;
    uint32_t n_devices;
} D;

static int D_abandoned; /* set when exit stops waiting for the writer thread: no more driver calls */
static int tid_system;  /* CUPTI reports gettid() thread ids (SetThreadIdType succeeded) */

static const CUdevice_attribute dev_attrs[TL_DEV_NATTR] = {
    [TL_DEV_COMPUTE_MAJOR] = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    [TL_DEV_COMPUTE_MINOR] = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    [TL_DEV_MAX_THREADS_PER_BLOCK] = CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    [TL_DEV_MAX_THREADS_PER_SM] = CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
    [TL_DEV_REGS_PER_BLOCK] = CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
    [TL_DEV_WARP_SIZE] = CU_DEVICE_ATTRIBUTE_WARP_SIZE,
    [TL_DEV_SHMEM_PER_BLOCK] = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
    [TL_DEV_NUM_SMS] = CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    [TL_DEV_REGS_PER_SM] = CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
    [TL_DEV_SHMEM_PER_BLOCK_OPTIN] = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    [TL_DEV_SHMEM_PER_SM] = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
};

static int resolve_driver(void) {
    if (D.state) return D.state;
    D.state = -1;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); /* kept open: the driver stays anyway */
    if (!cuda) {
        tl_diag(TL_WARN, "no libcuda.so.1 in the process (RTLD_NOLOAD): GPU names not recorded");
        return -1;
    }
    *(void **)&D.DeviceGet = dlsym(cuda, "cuDeviceGet");
    *(void **)&D.DeviceGetName = dlsym(cuda, "cuDeviceGetName");
    *(void **)&D.DeviceTotalMem = dlsym(cuda, "cuDeviceTotalMem_v2");
    *(void **)&D.DeviceGetAttribute = dlsym(cuda, "cuDeviceGetAttribute");
    /* the UUID tells one physical GPU apart from another whatever each process's CUDA_VISIBLE_DEVICES
     * numbering (two processes sharing a GPU); _v2 since CUDA 11.4, the plain name before */
    *(void **)&D.DeviceGetUuid = dlsym(cuda, "cuDeviceGetUuid_v2");
    if (!D.DeviceGetUuid) *(void **)&D.DeviceGetUuid = dlsym(cuda, "cuDeviceGetUuid");
    if (!D.DeviceGetUuid) tl_diag(TL_WARN, "libcuda.so.1 has no cuDeviceGetUuid: GPU UUIDs not recorded");
    if (!D.DeviceGet || !D.DeviceGetName) {
        tl_diag(TL_WARN, "libcuda.so.1 has no %s: GPU names not recorded", D.DeviceGet ? "cuDeviceGetName" : "cuDeviceGet");
        return -1;
    }
    if (!D.DeviceTotalMem) tl_diag(TL_WARN, "libcuda.so.1 has no cuDeviceTotalMem_v2: totalGlobalMem not recorded");
    if (!D.DeviceGetAttribute) tl_diag(TL_WARN, "libcuda.so.1 has no cuDeviceGetAttribute: device attributes not recorded");
    D.state = 1;
    return 1;
}

static void on_device(void *ud, uint32_t id) {
    (void)ud;
    if (__atomic_load_n(&D_abandoned, __ATOMIC_ACQUIRE) || resolve_driver() != 1) return;
    if (D.n_devices >= TL_MAX_DEVICES) {
        if (!D.warned_full++) tl_diag(TL_WARN, "more than %d GPUs: device %u and later not in the header", TL_MAX_DEVICES, id);
        return;
    }
    tl_device_props p;
    memset(&p, 0, sizeof p);
    p.id = id;
    CUdevice dev = 0;
    CUresult r = id <= INT_MAX ? D.DeviceGet(&dev, (int)id) : CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS) r = D.DeviceGetName(p.name, (int)sizeof p.name, dev);
    p.name[sizeof p.name - 1] = 0;
    if (r != CUDA_SUCCESS || !p.name[0]) {
        if (!D.warned_get++) tl_diag(TL_WARN, "cuDeviceGet/cuDeviceGetName(%u): CUresult %d: device not in the header", id, (int)r);
        return;
    }
    size_t mem = 0;
    if (D.DeviceTotalMem) {
        r = D.DeviceTotalMem(&mem, dev);
        if (r != CUDA_SUCCESS) {
            mem = 0;
            if (!D.warned_total++) tl_diag(TL_WARN, "cuDeviceTotalMem_v2(%u): CUresult %d: totalGlobalMem left out", id, (int)r);
        }
    }
    p.total_mem = mem;
    for (int i = 0; i < TL_DEV_NATTR; i++) {
        int v = -1;
        r = D.DeviceGetAttribute ? D.DeviceGetAttribute(&v, dev_attrs[i], dev) : CUDA_ERROR_NOT_FOUND;
        if (r != CUDA_SUCCESS || v < 0) {
            v = -1;
            if (D.DeviceGetAttribute && !D.warned_attr++)
                tl_diag(TL_WARN, "cuDeviceGetAttribute(%d, %u): CUresult %d: left out", (int)dev_attrs[i], id, (int)r);
        }
        p.attr[i] = v;
    }
    if (D.DeviceGetUuid) {
        CUuuid u;
        memset(&u, 0, sizeof u);
        r = D.DeviceGetUuid(&u, dev);
        int zero = 1; /* (a driver that answered without filling it in names no GPU: left out) */
        for (int i = 0; i < 16; i++) zero &= u.bytes[i] == 0;
        if (r == CUDA_SUCCESS && zero) r = CUDA_ERROR_NOT_SUPPORTED;
        if (r == CUDA_SUCCESS) {
            const unsigned char *b = (const unsigned char *)u.bytes;
            snprintf(p.uuid, sizeof p.uuid,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                     b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        } else if (!D.warned_uuid++) {
            tl_diag(TL_WARN, "cuDeviceGetUuid(%u): CUresult %d: uuid left out", id, (int)r);
        }
    }
    D.n_devices++;
    tl_header_add_device(&p);
    tl_diag(TL_INFO, "GPU %u: %s", id, p.name);
}

static void process_buffer(tl_thread *t, tl_buf *q) {
    CUpti_Activity *rec = NULL;
    if (q->valid > 0) {
        for (;;) {
            CUptiResult r = C.ActivityGetNextRecord(q->buf, q->valid, &rec);
            if (r != CUPTI_SUCCESS) {
                if (r != CUPTI_ERROR_MAX_LIMIT_REACHED) tl_diag(TL_WARN, "cuptiActivityGetNextRecord: %s", result_str(r));
                break;
            }
            if (t) tl_cupti_convert(C.conv, t, rec);
        }
    }
    if (q->dropped && t) tl_cupti_write_dropped(t, q->dropped, "CUPTI activity buffer full");
}

static void *writer_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "teller-cupti");
    /* before any device query of on_device; only when CUPTI's thread ids are gettid()'s */
    if (__atomic_load_n(&tid_system, __ATOMIC_ACQUIRE)) C.conv->self_tid = tl_gettid();
    for (;;) {
        pthread_mutex_lock(&C.mu);
        while (!C.head && !C.stop) pthread_cond_wait(&C.cv, &C.mu);
        tl_buf *q = C.head;
        if (q) {
            C.head = q->next;
            if (!C.head) C.tail = NULL;
        }
        int stop = C.stop;
        pthread_mutex_unlock(&C.mu);
        if (!q) {
            if (stop) break;
            continue;
        }
        if (tl_enter()) { /* signals are blocked here; the guard also covers a synchronous one */
            process_buffer(tl_self(), q);
            tl_leave();
        }
        pthread_mutex_lock(&C.mu);
        if (C.n_free < 8) {
            q->next = C.free_bufs;
            C.free_bufs = q;
            C.n_free++;
            q = NULL;
        }
        pthread_mutex_unlock(&C.mu);
        if (q) { free(q->buf); free(q); }
    }
    return NULL;
}

/* ---- callbacks: blocking synchronization calls become BEGIN/END (layer sync) so a hang is visible ---- */

/* Ids newer than some headers the shim builds against (CUPTI callback ids are a stable ABI). An older
 * libcupti refuses to enable an id it does not know; that is all. */
enum { TL_CBID_cudaExecutionCtxSynchronize = 534, TL_CBID_cuCtxSynchronize_v2 = 800 };

static const CUpti_CallbackId runtime_sync_cbids[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaThreadSynchronize_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020, TL_CBID_cudaExecutionCtxSynchronize};
/* The driver's own blocking calls, made directly by NCCL, Triton, XLA and CuPy. The runtime's sync calls
 * make them too, nested: those are skipped (the thread already has its runtime sync range open). */
static const CUpti_CallbackId driver_sync_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize,
    CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz, CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize,
    TL_CBID_cuCtxSynchronize_v2};

static int is_blocking(CUpti_CallbackDomain dom, CUpti_CallbackId cbid) {
    const CUpti_CallbackId *ids;
    size_t n;
    if (dom == CUPTI_CB_DOMAIN_RUNTIME_API) { ids = runtime_sync_cbids; n = sizeof runtime_sync_cbids / sizeof *ids; }
    else if (dom == CUPTI_CB_DOMAIN_DRIVER_API) { ids = driver_sync_cbids; n = sizeof driver_sync_cbids / sizeof *ids; }
    else return 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == cbid) return 1;
    return 0;
}

static void api_record(const CUpti_CallbackData *d);

static void CUPTIAPI api_callback(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *data) {
    (void)ud;
    if (!is_blocking(dom, cbid)) return;
    const CUpti_CallbackData *d = data;
    if (!d->correlationData) return;
    if (d->callbackSite == CUPTI_API_ENTER) *d->correlationData = 0; /* no END without its BEGIN */
    if (!tl_enter()) return;
    api_record(d);
    tl_leave();
}

static void api_record(const CUpti_CallbackData *d) {
    tl_thread *t = tl_self();
    if (!t) return;
    if (d->callbackSite == CUPTI_API_ENTER) {
        if (t->sync_open) return; /* the driver call inside a runtime sync (or any sync nested in one) */
        uint64_t id = tl_next_range_id(t);
        const char *nm = d->functionName ? d->functionName : "cudaSynchronize";
        uint32_t name = tl_intern(t, nm, strlen(nm));
        uint8_t *r = tl_reserve(t, 96);
        if (!r) return;
        *d->correlationData = id;
        uint8_t *c = r + 1;
        mp_uint(&c, TL_BEGIN);
        mp_uint(&c, id);
        mp_uint(&c, TL_L_SYNC);
        mp_uint(&c, name);
        mp_uint(&c, t->tid);
        mp_uint(&c, tl_now());
        mp_uint(&c, 0);
        mp_map(&c, 1);
        mp_str(&c, "corr", 4);
        mp_uint(&c, d->correlationId);
        tl_commit(t, r, c, 0x98);
        t->sync_open++;
    } else if (*d->correlationData) {
        if (t->sync_open) t->sync_open--;
        uint8_t *r = tl_reserve(t, 32);
        if (!r) return;
        uint8_t *c = r + 1;
        mp_uint(&c, TL_END);
        mp_uint(&c, *d->correlationData);
        mp_uint(&c, t->tid);
        mp_uint(&c, tl_now());
        tl_commit(t, r, c, 0x94);
    }
}

/* ---- NVTX push/pop -> external correlation ---- */

static int ext_push(uint64_t id) {
    return C.active && C.ActivityPushExternalCorrelationId(TL_EXT_KIND, id) == CUPTI_SUCCESS ? 0 : -1;
}
static void ext_pop(void) {
    uint64_t last = 0;
    if (C.active) C.ActivityPopExternalCorrelationId(TL_EXT_KIND, &last);
}

/* ---- lifecycle ---- */

static void cupti_atexit_guarded(void);

static void cupti_atexit(void) {
    /* exit() from a signal handler that interrupted the shim: CUPTI is left unflushed rather than
     * wait for a lock this thread holds or write over its record in progress */
    if (!tl_enter()) return;
    cupti_atexit_guarded();
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_busy = 0;
}

static void cupti_atexit_guarded(void) {
    if (!C.active || C.pid != getpid()) return;
    tl_ext_push = NULL;
    tl_ext_pop = NULL;
    CUptiResult r = C.ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS) tl_diag(TL_WARN, "cuptiActivityFlushAll: %s", result_str(r));
    pthread_mutex_lock(&C.mu);
    C.stop = 1;
    pthread_cond_signal(&C.cv);
    pthread_mutex_unlock(&C.mu);
    if (C.thread_running) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 10; /* never hang the host's exit */
        if (pthread_timedjoin_np(C.thread, NULL, &ts) != 0) {
            /* exit() goes on into the driver's destructors: the thread must not call the driver now */
            __atomic_store_n(&D_abandoned, 1, __ATOMIC_RELEASE);
            tl_diag(TL_WARN, "CUPTI writer thread did not finish in 10 s");
        }
        else C.thread_running = 0;
    }
    tl_diag(TL_INFO, "CUPTI: %llu activity records converted, %llu ignored, %llu query API records dropped",
            (unsigned long long)C.conv->n_converted, (unsigned long long)C.conv->n_ignored,
            (unsigned long long)C.conv->n_quiet);
    C.active = 0;
}

static void cupti_fork_child(void) {
    /* CUDA cannot be used in a forked child of an initialised parent; drop CUPTI state. */
    C.active = 0;
    C.thread_running = 0;
    C.head = C.tail = NULL;
    C.free_bufs = NULL;
    C.n_free = 0;
    pthread_mutex_init(&C.mu, NULL);
    pthread_cond_init(&C.cv, NULL);
    tl_ext_push = NULL;
    tl_ext_pop = NULL;
    /* the converter is not used again here; its device set belongs to the parent anyway */
    if (C.conv) { C.conv->dev_seen = 0; C.conv->n_dev_big = 0; }
    D.n_devices = 0;
}

#define LOAD(field, sym, required)                                                                          \
    do {                                                                                                    \
        *(void **)(&C.field) = dlsym(C.lib, sym);                                                           \
        if (!C.field && (required)) { tl_diag(TL_ERROR, "libcupti has no %s: CUPTI disabled", sym); return -1; } \
    } while (0)

/* dl_iterate_phdr callback: a loaded libcudart (e.g. from the nvidia-cuda-runtime wheel) tells where the
 * wheel's libcupti.so.13 lives (nvidia/cu13/lib), which is usually not on the loader's search path. */
static int find_cuda_lib_dir(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const char *n = info->dlpi_name;
    if (!n || !*n) return 0;
    const char *base = strrchr(n, '/');
    if (!base || !(strstr(base, "libcudart.so") || strstr(base, "libcublas.so") || strstr(base, "libcupti.so"))) return 0;
    size_t len = (size_t)(base - n);
    if (len + sizeof "/libcupti.so.13" >= PATH_MAX) return 0;
    memcpy(data, n, len);
    memcpy((char *)data + len, "/libcupti.so.13", sizeof "/libcupti.so.13");
    return 1;
}

static int load_cupti(void) {
    const char *p = getenv("TELLER_CUPTI_PATH");
    static char near_cudart[PATH_MAX];
    near_cudart[0] = 0;
    dl_iterate_phdr(find_cuda_lib_dir, near_cudart);
    const char *cands[] = {p && *p ? p : NULL, "libcupti.so.13", near_cudart[0] ? near_cudart : NULL, "libcupti.so"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0] && !C.lib; i++) {
        if (!cands[i]) continue;
        C.lib = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!C.lib && getenv("TELLER_SHIM_VERBOSE")) tl_diag(TL_INFO, "dlopen(%s): %s", cands[i], dlerror());
        if (p && *p && i == 0 && !C.lib) {
            tl_diag(TL_ERROR, "TELLER_CUPTI_PATH=%s: %s", p, dlerror());
            break; /* explicit path failed: don't guess */
        }
    }
    if (!C.lib) {
        tl_diag(TL_ERROR, "libcupti.so.13 not found (not loaded, not on the search path, not next to libcudart; "
                          "set TELLER_CUPTI_PATH): GPU activity not collected");
        return -1;
    }
    {
        char where[PATH_MAX] = "";
        void *sym = dlsym(C.lib, "cuptiGetVersion");
        Dl_info di;
        if (sym && dladdr(sym, &di) && di.dli_fname) snprintf(where, sizeof where, "%s", di.dli_fname);
        tl_diag(TL_INFO, "libcupti: %s", where[0] ? where : "(unknown path)");
    }
    LOAD(GetVersion, "cuptiGetVersion", 1);
    LOAD(GetResultString, "cuptiGetResultString", 0);
    LOAD(GetCallbackName, "cuptiGetCallbackName", 0);
    LOAD(Subscribe, "cuptiSubscribe", 1);
#ifdef CUpti_SubscriberParams_STRUCT_SIZE
    LOAD(Subscribe_v2, "cuptiSubscribe_v2", 0);
#endif
    LOAD(EnableDomain, "cuptiEnableDomain", 1);
    LOAD(EnableCallback, "cuptiEnableCallback", 0);
    LOAD(SetThreadIdType, "cuptiSetThreadIdType", 0);
    LOAD(ActivityEnable, "cuptiActivityEnable", 1);
    LOAD(ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks", 1);
    LOAD(ActivityRegisterTimestampCallback, "cuptiActivityRegisterTimestampCallback", 0);
    LOAD(ActivityGetNextRecord, "cuptiActivityGetNextRecord", 1);
    LOAD(ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords", 0);
    LOAD(ActivityFlushAll, "cuptiActivityFlushAll", 1);
    LOAD(ActivityFlushPeriod, "cuptiActivityFlushPeriod", 0);
    LOAD(ActivityPushExternalCorrelationId, "cuptiActivityPushExternalCorrelationId", 1);
    LOAD(ActivityPopExternalCorrelationId, "cuptiActivityPopExternalCorrelationId", 1);
    LOAD(ActivityGetStructSize, "cuptiActivityGetStructSize", 0);
    LOAD(ActivityEnableRuntimeApi, "cuptiActivityEnableRuntimeApi", 0);
    LOAD(ActivityEnableDriverApi, "cuptiActivityEnableDriverApi", 0);
    return 0;
}

static int env_off(const char *name) {
    const char *v = getenv(name);
    return v && (strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "false") == 0);
}

static int setup(void) {
    if (env_off("TELLER_CUPTI")) {
        tl_diag(TL_INFO, "TELLER_CUPTI=0: CUPTI collection disabled");
        return -1;
    }
    /* libcupti 13.2 recurses until the stack overflows when it is called in a process without the
     * CUDA driver: never touch it unless libcuda is already loaded (the driver calls us from cuInit). */
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cuda) {
        const char *msg = "CUDA driver (libcuda.so.1) is not loaded in this process: CUPTI collection disabled";
        tl_diag(TL_WARN, "%s", msg);
        tl_header_set_cupti(0, msg);
        return -1;
    }
    dlclose(cuda);
    if (load_cupti() != 0) return -1;
    CUptiResult r = C.GetVersion(&C.version);
    if (r != CUPTI_SUCCESS) {
        tl_diag(TL_ERROR, "cuptiGetVersion: %s: CUPTI disabled", result_str(r));
        return -1;
    }
    tl_header_set_cupti(C.version, NULL);
    tl_diag(TL_INFO, "CUPTI version %u (built against %d)", C.version, CUPTI_API_VERSION);

    C.conv = calloc(1, sizeof *C.conv);
    if (!C.conv) return -1;
    C.conv->callback_name = cbname;
    C.conv->on_device = on_device;
    if (C.ActivityGetStructSize) {
        C.ActivityGetStructSize(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, 0, &C.conv->size_kernel);
        C.ActivityGetStructSize(CUPTI_ACTIVITY_KIND_MEMCPY, 0, &C.conv->size_memcpy);
        C.ActivityGetStructSize(CUPTI_ACTIVITY_KIND_MEMSET, 0, &C.conv->size_memset);
        C.ActivityGetStructSize(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, 0, &C.conv->size_sync);
    }
    tl_cupti_conv_check_sizes(C.conv);
    if (C.conv->skip_kernel || C.conv->skip_memcpy || C.conv->skip_memset || C.conv->skip_sync)
        tl_diag(TL_ERROR, "CUPTI %u record layouts are older than the headers this shim was built with: some kinds skipped", C.version);
    else if (C.conv->size_kernel && C.conv->size_kernel != sizeof(tl_kernel_rec))
        tl_diag(TL_INFO, "CUPTI kernel record is %zu bytes (built with %zu): reading the common prefix", C.conv->size_kernel,
                sizeof(tl_kernel_rec));

    char holder[128] = "";
#ifdef CUpti_SubscriberParams_STRUCT_SIZE
    if (C.Subscribe_v2) { /* 13.x: same semantics, but tells who holds CUPTI */
        CUpti_SubscriberParams sp;
        memset(&sp, 0, sizeof sp);
        sp.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
        sp.subscriberName = "teller";
        sp.oldSubscriberName = holder;
        sp.oldSubscriberSize = sizeof holder;
#if CUPTI_API_VERSION >= 130200 /* the field is new in 13.2; older headers: 0 from the memset, as asked */
        sp.allowMultipleSubscribers = 0;
#endif
        r = C.Subscribe_v2(&C.sub, (CUpti_CallbackFunc)api_callback, NULL, &sp);
        holder[sizeof holder - 1] = 0;
    } else
#endif
    {
        r = C.Subscribe(&C.sub, (CUpti_CallbackFunc)api_callback, NULL);
    }
    if (r != CUPTI_SUCCESS) {
        char msg[384];
        if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
            snprintf(msg, sizeof msg, "cuptiSubscribe: %s: another CUPTI client (%s) owns CUPTI; "
                                      "GPU activity not collected, NVTX still collected", result_str(r),
                     holder[0] ? holder : "nsys, ncu, torch.profiler, ...");
        else
            snprintf(msg, sizeof msg, "cuptiSubscribe: %s: GPU activity not collected", result_str(r));
        tl_diag(TL_ERROR, "%s", msg);
        tl_header_set_cupti(C.version, msg);
        return -1;
    }
    if (C.SetThreadIdType && C.SetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM) == CUPTI_SUCCESS) /* gettid(), as NVTX */
        __atomic_store_n(&tid_system, 1, __ATOMIC_RELEASE);
    else
        tl_diag(TL_WARN, "cuptiSetThreadIdType(SYSTEM) failed: API records carry CUPTI's default thread ids");
    if (C.ActivityRegisterTimestampCallback) {
        r = C.ActivityRegisterTimestampCallback(ts_callback);
        if (r != CUPTI_SUCCESS) tl_diag(TL_ERROR, "cuptiActivityRegisterTimestampCallback: %s: GPU timestamps not on CLOCK_MONOTONIC", result_str(r));
    } else {
        tl_diag(TL_ERROR, "no cuptiActivityRegisterTimestampCallback: GPU timestamps not on CLOCK_MONOTONIC");
    }
    C.buf_size = (size_t)(getenv("TELLER_CUPTI_BUFFER_KB") ? strtoul(getenv("TELLER_CUPTI_BUFFER_KB"), NULL, 10) : 4096) * 1024u;
    if (C.buf_size < 64 * 1024) C.buf_size = 4u << 20;
    r = C.ActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        tl_diag(TL_ERROR, "cuptiActivityRegisterCallbacks: %s: GPU activity not collected", result_str(r));
        return -1;
    }
    C.pid = getpid();
    C.stop = 0;
    /* The writer thread starts with asynchronous signals blocked, so the program's handlers (SIGALRM,
     * SIGCHLD, SIGINT, profilers' SIGPROF) run on its own threads, never on ours mid-buffer. The
     * synchronous ones stay open: blocking them makes a fault kill the process silently. */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGTRAP);
    sigdelset(&all, SIGSYS);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = pthread_create(&C.thread, NULL, writer_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!started) {
        tl_diag(TL_ERROR, "cannot start the CUPTI writer thread: GPU activity not collected");
        return -1;
    }
    C.thread_running = 1;

    /* Callbacks only for the blocking calls (every other API call stays callback-free). */
    int cb_ok = 0, drv_ok = 0;
    if (C.EnableCallback) {
        for (size_t i = 0; i < sizeof runtime_sync_cbids / sizeof runtime_sync_cbids[0]; i++)
            cb_ok += C.EnableCallback(1, C.sub, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_sync_cbids[i]) == CUPTI_SUCCESS;
        for (size_t i = 0; i < sizeof driver_sync_cbids / sizeof driver_sync_cbids[0]; i++)
            drv_ok += C.EnableCallback(1, C.sub, CUPTI_CB_DOMAIN_DRIVER_API, driver_sync_cbids[i]) == CUPTI_SUCCESS;
    }
    /* never the whole driver domain: a callback on every driver call would cost every launch */
    if (!drv_ok) tl_diag(TL_WARN, "driver-API synchronize calls get no BEGIN/END (cuptiEnableCallback refused them)");
    if (!cb_ok) {
        r = C.EnableDomain(1, C.sub, CUPTI_CB_DOMAIN_RUNTIME_API);
        if (r != CUPTI_SUCCESS) tl_diag(TL_WARN, "cuptiEnableDomain(RUNTIME_API): %s", result_str(r));
    }
    int driver_on = !env_off("TELLER_CUPTI_DRIVER");
    struct { CUpti_ActivityKind k; const char *name; int on; } kinds[] = {
        {CUPTI_ACTIVITY_KIND_CONTEXT, "CONTEXT", 1},
        {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "CONCURRENT_KERNEL", 1},
        {CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY", 1},
        {CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET", 1},
        {CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "SYNCHRONIZATION", 1},
        {CUPTI_ACTIVITY_KIND_RUNTIME, "RUNTIME", 1},
        {CUPTI_ACTIVITY_KIND_DRIVER, "DRIVER", driver_on},
        {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, "EXTERNAL_CORRELATION", 1},
    };
    int enabled = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (!kinds[i].on) continue;
        r = C.ActivityEnable(kinds[i].k);
        if (r != CUPTI_SUCCESS) tl_diag(TL_WARN, "cuptiActivityEnable(%s): %s", kinds[i].name, result_str(r));
        else enabled++;
    }
    /* The query calls (tl_quiet_*): not recorded unless TELLER_CUPTI_API=all. Asked of CUPTI after the
     * RUNTIME/DRIVER kinds are enabled (enabling a kind resets the per-API choice), so that CUPTI makes
     * no record at all; the converter drops any that still come (libcupti < 12.x, or a failed call). */
    const char *api_mode = getenv("TELLER_CUPTI_API");
    if (!(api_mode && strcmp(api_mode, "all") == 0)) {
        tl_cupti_conv_quiet_defaults(C.conv);
        int asked = 0, told = 0;
        for (const CUpti_CallbackId *c = tl_quiet_runtime; *c && C.ActivityEnableRuntimeApi; c++, asked++)
            told += C.ActivityEnableRuntimeApi(*c, 0) == CUPTI_SUCCESS;
        for (const CUpti_CallbackId *c = tl_quiet_driver; *c && C.ActivityEnableDriverApi && driver_on; c++, asked++)
            told += C.ActivityEnableDriverApi(*c, 0) == CUPTI_SUCCESS;
        tl_diag(TL_INFO, "query API calls not recorded (cudaGetDevice, cudaGetLastError, cuDevicePrimaryCtxGetState, ...; "
                         "%d of %d skipped by CUPTI itself); TELLER_CUPTI_API=all records them", told, asked);
    }
    if (C.ActivityFlushPeriod) C.ActivityFlushPeriod((uint32_t)(getenv("TELLER_CUPTI_FLUSH_MS") ? strtoul(getenv("TELLER_CUPTI_FLUSH_MS"), NULL, 10) : 1000));
    C.active = enabled > 0;
    if (!C.active) return -1;
    tl_ext_pop = ext_pop;
    tl_ext_push = ext_push;
    tl_register_fork_child(cupti_fork_child);
    atexit(cupti_atexit); /* runs before the writer's own atexit handler (registered earlier) */
    tl_diag(TL_INFO, "CUPTI collection active (%d activity kinds)", enabled);
    return 0;
}

TL_VISIBLE int InitializeInjection(void) {
    /* The driver may call this more than once (and the shim may also be loaded by NVTX): idempotent. */
    if (__atomic_exchange_n(&g_init_state, 1, __ATOMIC_ACQ_REL) != 0) return 1;
    if (tl_writer_init() != 0) return 1;
    if (tl_enter()) { /* (writes DIAG and HEADER records of this thread) */
        setup();
        tl_leave();
    }
    return 1; /* never make the driver fail because of the tool */
}
