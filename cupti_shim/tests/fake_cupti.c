/* A fake libcupti (loaded by the shim through TELLER_CUPTI_PATH) that implements the subset of the
 * CUPTI API the shim uses, to test the injection pipeline on a CPU-only machine: subscriber callbacks,
 * activity buffers completed on the caller's thread, external correlation, timestamps, dropped counts,
 * flush at exit, CONTEXT records (devices 0 and 1 of the fake libcuda, and 7, which it does not know)
 * ahead of the first API record, DRIVER records for the fake libcuda's device queries (on the querying
 * thread, as CUPTI records the shim's own calls). FAKE_CUPTI_MODE=multi makes cuptiSubscribe fail like
 * CUPTI under nsys/torch.profiler.
 * Any cuptiActivityGetNextRecord call made from inside the buffer-completed callback is a violation of
 * the "never parse on CUPTI's thread" rule and is reported on stderr. */
#define _GNU_SOURCE
#include <cupti.h>
#include "../src/tl_cupti_convert.h" /* tl_kernel_rec, tl_context_rec: the record versions the headers declare */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V __attribute__((visibility("default")))

static CUpti_CallbackFunc g_cb;
static CUpti_BuffersCallbackRequestFunc g_req;
static CUpti_BuffersCallbackCompleteFunc g_done;
static CUpti_TimestampCallbackFunc g_ts;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *g_buf;
static size_t g_size, g_used;
static uint32_t g_corr = 100;
static int g_enabled[64];
static __thread uint64_t t_ext[64];
static __thread int t_ext_n;
static __thread int t_in_complete;
static int g_dropped_once = 3;
static int g_cb_enabled[1024];
static int g_drv_cb_enabled[1024];
static int g_domain_enabled;

static uint64_t now(void) {
    if (g_ts) return g_ts();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

V CUptiResult cuptiGetVersion(uint32_t *v) { *v = CUPTI_API_VERSION; return CUPTI_SUCCESS; }
V CUptiResult cuptiGetResultString(CUptiResult r, const char **s) {
    *s = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED" : "fake error";
    return CUPTI_SUCCESS;
}
V CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain d, uint32_t cbid, const char **s) {
    if (d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000) { *s = "cudaLaunchKernel"; return CUPTI_SUCCESS; }
    if (d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020) { *s = "cudaStreamSynchronize"; return CUPTI_SUCCESS; }
    if (d == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize) { *s = "cuCtxSynchronize"; return CUPTI_SUCCESS; }
    if (d == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize) { *s = "cuStreamSynchronize"; return CUPTI_SUCCESS; }
    return CUPTI_ERROR_INVALID_PARAMETER;
}
V CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *h, CUpti_CallbackFunc cb, void *ud) {
    (void)ud;
    const char *m = getenv("FAKE_CUPTI_MODE");
    if (m && strcmp(m, "multi") == 0) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    g_cb = cb;
    *h = (CUpti_SubscriberHandle)(void *)&g_cb;
    return CUPTI_SUCCESS;
}
#ifdef CUpti_SubscriberParams_STRUCT_SIZE
V CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *h, CUpti_CallbackFunc cb, void *ud, CUpti_SubscriberParams *p) {
    if (!p || p->structSize < CUpti_SubscriberParams_STRUCT_SIZE) return CUPTI_ERROR_INVALID_PARAMETER;
    const char *m = getenv("FAKE_CUPTI_MODE");
    if (m && strcmp(m, "multi") == 0 && p->oldSubscriberName && p->oldSubscriberSize > 0)
        snprintf(p->oldSubscriberName, p->oldSubscriberSize, "fake-nsys");
    return cuptiSubscribe(h, cb, ud);
}
#endif
V CUptiResult cuptiEnableDomain(uint32_t en, CUpti_SubscriberHandle h, CUpti_CallbackDomain d) {
    (void)h;
    if (d == CUPTI_CB_DOMAIN_RUNTIME_API) g_domain_enabled = (int)en;
    return CUPTI_SUCCESS;
}
V CUptiResult cuptiEnableCallback(uint32_t en, CUpti_SubscriberHandle h, CUpti_CallbackDomain d, CUpti_CallbackId cbid) {
    (void)h;
    if (cbid >= 1024) return CUPTI_ERROR_INVALID_PARAMETER;
    if (d == CUPTI_CB_DOMAIN_RUNTIME_API) g_cb_enabled[cbid] = (int)en;
    else if (d == CUPTI_CB_DOMAIN_DRIVER_API) g_drv_cb_enabled[cbid] = (int)en;
    else return CUPTI_ERROR_INVALID_PARAMETER;
    return CUPTI_SUCCESS;
}
V CUptiResult cuptiSetThreadIdType(CUpti_ActivityThreadIdType t) { (void)t; return CUPTI_SUCCESS; }
V CUptiResult cuptiActivityEnable(CUpti_ActivityKind k) { if ((int)k < 64) g_enabled[k] = 1; return CUPTI_SUCCESS; }
/* Per-API switches (12.6+): as the real one, enabling the kind afterwards would reset them, so the fake
 * refuses a switch asked before its kind is enabled (the shim's DIAG then counts fewer than asked). */
V CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t en) {
    (void)cbid; (void)en;
    return g_enabled[CUPTI_ACTIVITY_KIND_RUNTIME] ? CUPTI_SUCCESS : CUPTI_ERROR_NOT_INITIALIZED;
}
V CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t en) {
    (void)cbid; (void)en;
    return g_enabled[CUPTI_ACTIVITY_KIND_DRIVER] ? CUPTI_SUCCESS : CUPTI_ERROR_NOT_INITIALIZED;
}
V CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r, CUpti_BuffersCallbackCompleteFunc d) { g_req = r; g_done = d; return CUPTI_SUCCESS; }
V CUptiResult cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc f) { g_ts = f; return CUPTI_SUCCESS; }
V CUptiResult cuptiActivityFlushPeriod(uint32_t ms) { (void)ms; return CUPTI_SUCCESS; }
V CUptiResult cuptiActivityGetStructSize(CUpti_ActivityKind k, uint32_t v, size_t *s) {
    (void)v;
    switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: *s = sizeof(tl_kernel_rec); return CUPTI_SUCCESS;
    case CUPTI_ACTIVITY_KIND_MEMCPY: *s = sizeof(CUpti_ActivityMemcpy6); return CUPTI_SUCCESS;
    case CUPTI_ACTIVITY_KIND_MEMSET: *s = sizeof(CUpti_ActivityMemset4); return CUPTI_SUCCESS;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: *s = sizeof(CUpti_ActivitySynchronization2); return CUPTI_SUCCESS;
    default: return CUPTI_ERROR_INVALID_KIND;
    }
}
V CUptiResult cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind k, uint64_t id) {
    (void)k;
    if (t_ext_n < 64) t_ext[t_ext_n] = id;
    t_ext_n++;
    return CUPTI_SUCCESS;
}
V CUptiResult cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind k, uint64_t *last) {
    (void)k;
    if (t_ext_n <= 0) return CUPTI_ERROR_QUEUE_EMPTY;
    t_ext_n--;
    if (last) *last = t_ext_n < 64 ? t_ext[t_ext_n] : 0;
    return CUPTI_SUCCESS;
}

static size_t rsize(CUpti_ActivityKind k) {
    switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(tl_kernel_rec);
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(CUpti_ActivityExternalCorrelation);
    case CUPTI_ACTIVITY_KIND_CONTEXT: return sizeof(tl_context_rec);
    default: return 0;
    }
}

V CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **rec) {
    if (t_in_complete) fprintf(stderr, "fake_cupti: VIOLATION: activity buffer parsed inside the completion callback\n");
    uint8_t *p = *rec ? (uint8_t *)*rec + ((rsize((*rec)->kind) + 7) & ~(size_t)7) : buf;
    if (p >= buf + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *rec = (CUpti_Activity *)(void *)p;
    return CUPTI_SUCCESS;
}
V CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext c, uint32_t s, size_t *n) {
    (void)c; (void)s;
    *n = (size_t)g_dropped_once;
    g_dropped_once = 0;
    return CUPTI_SUCCESS;
}

static void complete_locked(void) {
    if (!g_buf) return;
    uint8_t *b = g_buf;
    size_t used = g_used, size = g_size;
    g_buf = NULL;
    g_used = 0;
    t_in_complete = 1;
    g_done(NULL, 0, b, size, used);
    t_in_complete = 0;
}

static void *put(size_t n) {
    size_t need = (n + 7) & ~(size_t)7;
    if (g_buf && g_used + need > g_size) complete_locked();
    if (!g_buf) {
        size_t maxrec = 0;
        g_req(&g_buf, &g_size, &maxrec);
        g_used = 0;
    }
    void *p = g_buf + g_used;
    memset(p, 0, n);
    g_used += need;
    return p;
}

static int g_driver_calls;

/* Called by the fake libcuda for every device query (the shim's on_device, on its writer thread). */
V void fake_cupti_driver_call(uint32_t cbid, unsigned tid) {
    pthread_mutex_lock(&g_mu);
    if (g_req && g_enabled[CUPTI_ACTIVITY_KIND_DRIVER]) {
        CUpti_ActivityAPI *a = put(sizeof *a);
        a->kind = CUPTI_ACTIVITY_KIND_DRIVER;
        a->cbid = cbid;
        a->start = now();
        a->end = a->start + 10;
        a->threadId = tid;
        a->correlationId = __atomic_add_fetch(&g_corr, 1, __ATOMIC_RELAXED);
    }
    g_driver_calls++;
    pthread_mutex_unlock(&g_mu);
}

V CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    pthread_mutex_lock(&g_mu);
    complete_locked();
    pthread_mutex_unlock(&g_mu);
    return CUPTI_SUCCESS;
}

/* ---- test driver entry points ---- */

/* An API call's callbacks (ENTER, then EXIT) where the shim enabled them; `inside` runs between. */
static void callback_pair(CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const char *fname, uint32_t corr,
                          int enabled, void (*inside)(void)) {
    uint64_t corrdata = 0;
    CUpti_CallbackData d;
    memset(&d, 0, sizeof d);
    d.functionName = fname;
    d.correlationId = corr;
    d.correlationData = &corrdata;
    d.callbackSite = CUPTI_API_ENTER;
    if (getenv("FAKE_CUPTI_CALLBACK_LOG") && g_cb) fprintf(stderr, "fake_cupti: callback %s %s\n", fname, enabled ? "on" : "off");
    if (g_cb && enabled) g_cb(NULL, dom, cbid, &d);
    if (inside) inside();
    d.callbackSite = CUPTI_API_EXIT;
    if (g_cb && enabled) g_cb(NULL, dom, cbid, &d);
}

static void driver_callbacks(CUpti_CallbackId cbid, const char *fname, uint32_t corr, void (*inside)(void)) {
    callback_pair(CUPTI_CB_DOMAIN_DRIVER_API, cbid, fname, corr, cbid < 1024 && g_drv_cb_enabled[cbid], inside);
}

/* as the runtime does: cudaStreamSynchronize calls cuStreamSynchronize */
static void nested_driver_sync(void) {
    driver_callbacks(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, "cuStreamSynchronize",
                     __atomic_add_fetch(&g_corr, 1, __ATOMIC_RELAXED), NULL);
}

static uint32_t api_call(CUpti_CallbackId cbid, const char *fname, int with_kernel, const char *kname, unsigned tid) {
    if (!g_req) return 0; /* activity API never set up (e.g. subscribe failed) */
    uint32_t corr = __atomic_add_fetch(&g_corr, 1, __ATOMIC_RELAXED);
    int enabled = g_domain_enabled || (cbid < 1024 && g_cb_enabled[cbid]);
    uint64_t start = now();
    callback_pair(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, fname, corr, enabled,
                  cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020 ? nested_driver_sync : NULL);
    uint64_t end = now() + 1000;
    pthread_mutex_lock(&g_mu);
    static int ctx_done;
    if (!ctx_done && g_enabled[CUPTI_ACTIVITY_KIND_CONTEXT]) { /* as CUPTI: the contexts before their work */
        static const uint32_t devs[] = {0, 1, 7, 0};
        ctx_done = 1;
        for (uint32_t i = 0; i < sizeof devs / sizeof devs[0]; i++) {
            tl_context_rec *c = put(sizeof *c);
            c->kind = CUPTI_ACTIVITY_KIND_CONTEXT;
            c->contextId = 1 + i;
            c->deviceId = devs[i];
        }
    }
    if (t_ext_n > 0 && g_enabled[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION]) {
        CUpti_ActivityExternalCorrelation *x = put(sizeof *x);
        x->kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
        x->externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
        x->externalId = t_ext[t_ext_n - 1];
        x->correlationId = corr;
    }
    CUpti_ActivityAPI *a = put(sizeof *a);
    a->kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    a->cbid = cbid;
    a->start = start;
    a->end = end;
    a->threadId = tid;
    a->correlationId = corr;
    if (with_kernel) {
        tl_kernel_rec *k = put(sizeof *k);
        k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k->name = kname;
        k->deviceId = 0;
        k->streamId = 7;
        k->start = end + 100;
        k->end = end + 5000;
        k->correlationId = corr;
        k->gridX = k->gridY = k->gridZ = 1;
        k->blockX = 256; k->blockY = k->blockZ = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return corr;
}

V uint32_t fake_cupti_launch(const char *kernel, unsigned tid) {
    return api_call(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cudaLaunchKernel", 1, kernel, tid);
}
V uint32_t fake_cupti_sync(unsigned tid) {
    return api_call(CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020, "cudaStreamSynchronize", 0, NULL, tid);
}
/* a direct driver call (NCCL, Triton, XLA): cuCtxSynchronize with its callbacks and DRIVER record */
V uint32_t fake_cupti_driver_sync(unsigned tid) {
    if (!g_req) return 0;
    uint32_t corr = __atomic_add_fetch(&g_corr, 1, __ATOMIC_RELAXED);
    uint64_t start = now();
    driver_callbacks(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", corr, NULL);
    pthread_mutex_lock(&g_mu);
    if (g_enabled[CUPTI_ACTIVITY_KIND_DRIVER]) {
        CUpti_ActivityAPI *a = put(sizeof *a);
        a->kind = CUPTI_ACTIVITY_KIND_DRIVER;
        a->cbid = CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize;
        a->start = start;
        a->end = now() + 1000;
        a->threadId = tid;
        a->correlationId = corr;
    }
    pthread_mutex_unlock(&g_mu);
    return corr;
}
V void fake_cupti_complete_now(void) { cuptiActivityFlushAll(0); }
/* Wait (at most timeout_ms) until the fake libcuda has answered n device queries; returns the count. */
V int fake_cupti_wait_driver_calls(int n, int timeout_ms) {
    for (int waited = 0;; waited += 10) {
        pthread_mutex_lock(&g_mu);
        int k = g_driver_calls;
        pthread_mutex_unlock(&g_mu);
        if (k >= n || waited >= timeout_ms) return k;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}
