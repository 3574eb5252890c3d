/* Packs real CUDA 13 CUPTI activity structs (from the installed cupti_activity.h) into an activity
 * buffer, walks it, and feeds every record to the shim's converter. check_raw.py then checks the
 * trace. The walk uses libcupti's cuptiActivityGetNextRecord when a CUDA driver is present; without
 * one (libcupti 13.2 crashes when called without libcuda.so.1) it uses a walker that advances by the
 * compiled struct sizes, which is how CUPTI lays out records of the version it was built with.
 * The device hook must fire once per new device id (CONTEXT and kernel records, ids >= 64 too); it adds
 * made-up devices to the header, then a duplicate id (ignored) and 100 more with 255-character names to
 * fill the 64-device table. */
#define _GNU_SOURCE
#include "tl_cupti_convert.h"
#include "tl_writer.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *g_buf;
static size_t g_used;

static void *put(size_t size) {
    void *p = g_buf + g_used;
    memset(p, 0, size);
    g_used += (size + 7) & ~(size_t)7;
    return p;
}

static size_t record_size(CUpti_ActivityKind k) {
    switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: return sizeof(tl_kernel_rec);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(CUpti_ActivityMemset4);
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: return sizeof(CUpti_ActivitySynchronization2);
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(CUpti_ActivityExternalCorrelation);
    case CUPTI_ACTIVITY_KIND_CONTEXT: return sizeof(tl_context_rec);
    case CUPTI_ACTIVITY_KIND_MARKER: return sizeof(CUpti_ActivityMarker2);
    default: return 0;
    }
}

/* Same contract as cuptiActivityGetNextRecord: *rec NULL starts the walk. */
static CUptiResult own_next(uint8_t *buf, size_t valid, CUpti_Activity **rec) {
    uint8_t *p = *rec ? (uint8_t *)*rec + ((record_size((*rec)->kind) + 7) & ~(size_t)7) : buf;
    if (p >= buf + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    if (record_size(((CUpti_Activity *)(void *)p)->kind) == 0) return CUPTI_ERROR_INVALID_KIND;
    *rec = (CUpti_Activity *)(void *)p;
    return CUPTI_SUCCESS;
}

static uint32_t g_hook[16];
static int g_nhook;

static void fake_props(uint32_t id, int longname) {
    tl_device_props p;
    memset(&p, 0, sizeof p);
    p.id = id;
    if (longname) {
        char pre[16];
        int k = snprintf(pre, sizeof pre, "Long GPU %03u", id);
        memset(p.name, 'n', 255);
        memcpy(p.name, pre, (size_t)k);
    }
    else snprintf(p.name, sizeof p.name, "Convert GPU %u", id);
    p.total_mem = (uint64_t)(id + 1) << 30;
    for (int i = 0; i < TL_DEV_NATTR; i++) p.attr[i] = -1; /* unknown: left out */
    p.attr[TL_DEV_COMPUTE_MAJOR] = 8;
    p.attr[TL_DEV_NUM_SMS] = 100 + id;
    tl_header_add_device(&p);
}

static void on_device(void *ud, uint32_t id) {
    (void)ud;
    if (g_nhook < 16) g_hook[g_nhook] = id;
    g_nhook++;
    fake_props(id, 0);
}

static const char *names(void *ud, CUpti_CallbackDomain d, uint32_t cbid) {
    (void)ud;
    if (d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000) return "cudaLaunchKernel";
    if (d == CUPTI_CB_DOMAIN_DRIVER_API && cbid == CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize) return "cuCtxSynchronize";
    return NULL;
}

int main(void) {
    g_buf = aligned_alloc(8, 1 << 20);
    static char longname[5001];
    memset(longname, 'k', 5000);
    memcpy(longname, "void long_kernel<", 17);

    tl_context_rec *ctx = put(sizeof *ctx);
    ctx->kind = CUPTI_ACTIVITY_KIND_CONTEXT; ctx->contextId = 1; ctx->deviceId = 3;

    CUpti_ActivityExternalCorrelation *x = put(sizeof *x);
    x->kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION; x->externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
    x->externalId = 777; x->correlationId = 42;

    CUpti_ActivityAPI *api = put(sizeof *api);
    api->kind = CUPTI_ACTIVITY_KIND_RUNTIME; api->cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
    api->start = 1000; api->end = 1100; api->processId = 1; api->threadId = 4242; api->correlationId = 42;

    for (int i = 0; i < 2; i++) {
        tl_kernel_rec *k = put(sizeof *k);
        k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL; k->name = "void gemm<128, 64>(float*)";
        k->deviceId = 3; k->streamId = 7; k->start = 2000 + 1000u * (unsigned)i; k->end = 2900 + 1000u * (unsigned)i;
        k->correlationId = 42; k->gridX = 4; k->gridY = 2; k->gridZ = 1; k->blockX = 128; k->blockY = 1; k->blockZ = 1;
    }
    tl_kernel_rec *kl = put(sizeof *kl);
    kl->kind = CUPTI_ACTIVITY_KIND_KERNEL; kl->name = longname; kl->deviceId = 0; kl->streamId = 13;
    kl->start = 5000; kl->end = 6000; kl->correlationId = 50; kl->gridX = kl->gridY = kl->gridZ = 1;
    kl->blockX = kl->blockY = kl->blockZ = 32;

    CUpti_ActivityMemcpy6 *mc = put(sizeof *mc);
    mc->kind = CUPTI_ACTIVITY_KIND_MEMCPY; mc->copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD; mc->bytes = 4096;
    mc->deviceId = 3; mc->streamId = 7; mc->start = 6100; mc->end = 6200; mc->correlationId = 43;

    CUpti_ActivityMemset4 *ms = put(sizeof *ms);
    ms->kind = CUPTI_ACTIVITY_KIND_MEMSET; ms->bytes = 1024; ms->deviceId = 3; ms->streamId = 7;
    ms->start = 6300; ms->end = 6400; ms->correlationId = 44;

    CUpti_ActivitySynchronization2 *sy = put(sizeof *sy);
    sy->kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION; sy->type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
    sy->contextId = 1; sy->streamId = 7; sy->start = 6400; sy->end = 6600; sy->correlationId = 45;

    CUpti_ActivityAPI *drv = put(sizeof *drv);
    drv->kind = CUPTI_ACTIVITY_KIND_DRIVER; drv->cbid = CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize;
    drv->start = 6700; drv->end = 6800; drv->threadId = 4243; drv->correlationId = 46;

    CUpti_ActivityAPI *unk = put(sizeof *unk);
    unk->kind = CUPTI_ACTIVITY_KIND_RUNTIME; unk->cbid = 9999; unk->start = 6900; unk->end = 6950; unk->threadId = 4242;
    unk->correlationId = 47;

    static const uint32_t more_ctx[][2] = {{2, 70}, {3, 70}, {1, 3}}; /* new id >= 64, again, again */
    for (int i = 0; i < 3; i++) {
        tl_context_rec *c2 = put(sizeof *c2);
        c2->kind = CUPTI_ACTIVITY_KIND_CONTEXT; c2->contextId = more_ctx[i][0]; c2->deviceId = more_ctx[i][1];
    }
    CUpti_ActivityAPI *own = put(sizeof *own); /* the converting thread's own driver call: dropped */
    own->kind = CUPTI_ACTIVITY_KIND_DRIVER; own->cbid = CUPTI_DRIVER_TRACE_CBID_cuDeviceGetAttribute;
    own->start = 7000; own->end = 7010; own->threadId = 4244; own->correlationId = 48;

    /* query calls: dropped (tl_cupti_conv_quiet_defaults) */
    CUpti_ActivityAPI *q1 = put(sizeof *q1);
    q1->kind = CUPTI_ACTIVITY_KIND_RUNTIME; q1->cbid = CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020;
    q1->start = 7100; q1->end = 7110; q1->threadId = 4242; q1->correlationId = 49;
    CUpti_ActivityAPI *q2 = put(sizeof *q2);
    q2->kind = CUPTI_ACTIVITY_KIND_DRIVER; q2->cbid = CUPTI_DRIVER_TRACE_CBID_cuDevicePrimaryCtxGetState;
    q2->start = 7120; q2->end = 7130; q2->threadId = 4242; q2->correlationId = 50;

    CUpti_ActivityMarker2 *mk = put(sizeof *mk); /* a kind the converter does not handle */
    mk->kind = CUPTI_ACTIVITY_KIND_MARKER;

    CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **) = own_next;
    const char *walker = "compiled struct sizes (no CUDA driver: libcupti 13.2 cannot be called)";
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cuda) cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda && !getenv("TELLER_TEST_FAKE_CUDA")) {
        const char *p = getenv("TELLER_CUPTI_PATH");
        void *lib = dlopen(p && *p ? p : "libcupti.so.13", RTLD_NOW);
        if (lib && (*(void **)&next = dlsym(lib, "cuptiActivityGetNextRecord")) != NULL) walker = "libcupti cuptiActivityGetNextRecord";
        else next = own_next;
    }

    tl_cupti_conv *cv = calloc(1, sizeof *cv);
    cv->callback_name = names;
    cv->on_device = on_device;
    cv->self_tid = 4244;
    tl_cupti_conv_check_sizes(cv);
    tl_cupti_conv_quiet_defaults(cv);
    tl_thread *t = tl_self();
    if (!t) { fprintf(stderr, "cannot open trace file\n"); return 1; }
    CUpti_Activity *rec = NULL;
    int n = 0;
    CUptiResult r;
    while ((r = next(g_buf, g_used, &rec)) == CUPTI_SUCCESS) {
        tl_cupti_convert(cv, t, rec);
        n++;
    }
    if (r != CUPTI_ERROR_MAX_LIMIT_REACHED) { fprintf(stderr, "walk ended with %d\n", (int)r); return 1; }
    tl_cupti_write_dropped(t, 5, "CUPTI activity buffer full");
    fake_props(3, 1); /* an id already known: the first entry stays */
    for (uint32_t id = 100; id < 200; id++) fake_props(id, 1); /* 61 fit in the 64-device table */
    fprintf(stderr, "walker: %s; %d records, %llu converted, %llu ignored\n", walker, n,
            (unsigned long long)cv->n_converted, (unsigned long long)cv->n_ignored);
    printf("{\"records\": %d, \"converted\": %llu, \"ignored\": %llu, \"kernel11_size\": %zu, \"cupti_api\": %d, "
           "\"device_hook\": [", n, (unsigned long long)cv->n_converted, (unsigned long long)cv->n_ignored,
           sizeof(tl_kernel_rec), CUPTI_API_VERSION);
    for (int i = 0; i < g_nhook && i < 16; i++) printf("%s%u", i ? ", " : "", g_hook[i]);
    printf("]}\n");
    return (n == 18 && cv->n_ignored == 2 && cv->n_quiet == 2) ? 0 : 1;
}
