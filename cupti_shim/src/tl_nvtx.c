/* NVTX v3 injection: InitializeInjectionNvtx2. */
#define _GNU_SOURCE
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include "tl_msgpack.h"
#include "tl_nvtx.h"
#include "tl_writer.h"

#include <stdlib.h>

#define TL_DOMAIN_MAGIC 0x444f4d4eu
#define TL_REGSTR_MAGIC 0x52535452u

/* Category names (nvtxNameCategory / nvtxDomainNameCategory: the Python `nvtx` package names its
 * categories this way, numbering them per domain), written as args.category in place of the number.
 * Lock-free (a callback may run in a forked child or a signal handler): an entry is reserved by an
 * atomic count and published by its `ready` flag; the first name given to (domain, id) stands (two
 * threads naming one pair at once may both be kept, the first found read); at
 * most TL_MAX_CATS, names cut at a character to TL_CAT_NAME - 1 bytes (the records' reservations
 * allow for that). */
#define TL_MAX_CATS 256
#define TL_CAT_NAME 32
typedef struct {
    const void *dom;
    uint32_t id;
    uint8_t len, ready;
    char name[TL_CAT_NAME];
} tl_cat;
static tl_cat g_cats[TL_MAX_CATS];
static uint32_t g_ncats;

static void name_category(const void *dom, uint32_t id, const char *name) {
    if (!name || !*name || !id) return; /* (category 0 is "none"; an empty name names nothing) */
    uint32_t n = __atomic_load_n(&g_ncats, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < TL_MAX_CATS; i++)
        if (__atomic_load_n(&g_cats[i].ready, __ATOMIC_ACQUIRE) && g_cats[i].dom == dom && g_cats[i].id == id) return;
    uint32_t i = __atomic_fetch_add(&g_ncats, 1, __ATOMIC_ACQ_REL);
    if (i >= TL_MAX_CATS) return;
    size_t len = strlen(name);
    if (len > TL_CAT_NAME - 1) len = tl_utf8_cut(name, TL_CAT_NAME - 1);
    g_cats[i].dom = dom;
    g_cats[i].id = id;
    memcpy(g_cats[i].name, name, len);
    g_cats[i].len = (uint8_t)len;
    __atomic_store_n(&g_cats[i].ready, 1, __ATOMIC_RELEASE);
}


/* Set by the CUPTI side when external correlation is active (thread-scoped push/pop only). */
tl_ext_push_fn tl_ext_push;
tl_ext_pop_fn tl_ext_pop;

/* Start/end ranges may end on another thread: END carries the ending thread's tid and the reader
 * takes the range's tid from its BEGIN. Push/pop ranges: BEGIN at push, END at pop (default), or one
 * SPAN at pop (TELLER_NVTX_MODE=span). */
static int g_span_mode;

typedef struct {
    uint32_t name;     /* string id */
    uint8_t has_color, has_payload, payload_kind; /* kind: 0 u64, 1 i64, 2 double */
    uint32_t color, category;
    uint64_t payload;
    uint8_t cat_len;   /* the category's name (NameCategory), 0: none, the number is written */
    char cat_name[TL_CAT_NAME];
} tl_attr;

static void category_name(const void *dom, tl_attr *o) {
    uint32_t n = __atomic_load_n(&g_ncats, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < TL_MAX_CATS; i++) {
        const tl_cat *c = &g_cats[i];
        if (__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE) && c->dom == dom && c->id == o->category) {
            memcpy(o->cat_name, c->name, c->len);
            o->cat_len = c->len;
            return;
        }
    }
}

/* The wide-character (W) entry points and NVTX_MESSAGE_TYPE_UNICODE take wchar_t text: UTF-32 on
 * Linux, written as UTF-8 (a value that is no character, a surrogate or past U+10FFFF, as U+FFFD),
 * cut at a character to fit TL_WIDE_MAX bytes (a stack buffer: callbacks run on the program's
 * threads, whose stacks may be small). */
_Static_assert(sizeof(wchar_t) == 4, "wchar_t is UTF-32 on the platforms the shim supports");
#define TL_WIDE_MAX 4096
static size_t wide_utf8(const wchar_t *w, char *buf, size_t cap) {
    size_t n = 0;
    for (; w && *w; w++) {
        uint32_t c = (uint32_t)*w;
        if ((c >= 0xD800u && c <= 0xDFFFu) || c > 0x10FFFFu) c = 0xFFFDu;
        unsigned char e[4];
        size_t k;
        if (c < 0x80u) { e[0] = (unsigned char)c; k = 1; }
        else if (c < 0x800u) { e[0] = (unsigned char)(0xC0u | (c >> 6)); e[1] = (unsigned char)(0x80u | (c & 0x3Fu)); k = 2; }
        else if (c < 0x10000u) {
            e[0] = (unsigned char)(0xE0u | (c >> 12)); e[1] = (unsigned char)(0x80u | ((c >> 6) & 0x3Fu));
            e[2] = (unsigned char)(0x80u | (c & 0x3Fu)); k = 3;
        } else {
            e[0] = (unsigned char)(0xF0u | (c >> 18)); e[1] = (unsigned char)(0x80u | ((c >> 12) & 0x3Fu));
            e[2] = (unsigned char)(0x80u | ((c >> 6) & 0x3Fu)); e[3] = (unsigned char)(0x80u | (c & 0x3Fu)); k = 4;
        }
        if (n + k > cap - 1) break;
        memcpy(buf + n, e, k);
        n += k;
    }
    buf[n] = 0;
    return n;
}

static inline uint32_t msg_sid(tl_thread *t, int type, const nvtxMessageValue_t *m) {
    if (type == NVTX_MESSAGE_TYPE_ASCII && m->ascii) return tl_intern(t, m->ascii, strlen(m->ascii));
    if (type == NVTX_MESSAGE_TYPE_REGISTERED && m->registered) {
        tl_name *n = (tl_name *)(void *)m->registered;
        if (n->magic == TL_REGSTR_MAGIC) return tl_intern_name(t, n);
    }
    if (type == NVTX_MESSAGE_TYPE_UNICODE && m->unicode) {
        char buf[TL_WIDE_MAX];
        return tl_intern(t, buf, wide_utf8(m->unicode, buf, sizeof buf));
    }
    return tl_intern(t, "", 0);
}

static inline void decode_attr(tl_thread *t, nvtxDomainHandle_t d, const nvtxEventAttributes_t *a, tl_attr *o) {
    memset(o, 0, sizeof *o);
    if (!a) { o->name = tl_intern(t, "", 0); return; }
    o->name = msg_sid(t, a->messageType, &a->message);
    if (a->colorType == NVTX_COLOR_ARGB) { o->has_color = 1; o->color = a->color; }
    o->category = a->category;
    if (o->category && __atomic_load_n(&g_ncats, __ATOMIC_RELAXED)) category_name(d, o);
    switch (a->payloadType) {
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64: o->has_payload = 1; o->payload_kind = 0; o->payload = a->payload.ullValue; break;
    case NVTX_PAYLOAD_TYPE_INT64: o->has_payload = 1; o->payload_kind = 1; o->payload = (uint64_t)a->payload.llValue; break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: o->has_payload = 1; o->payload_kind = 0; o->payload = a->payload.uiValue; break;
    case NVTX_PAYLOAD_TYPE_INT32: o->has_payload = 1; o->payload_kind = 1; o->payload = (uint64_t)(int64_t)a->payload.iValue; break;
    case NVTX_PAYLOAD_TYPE_DOUBLE: { double d = a->payload.dValue; o->has_payload = 1; o->payload_kind = 2; memcpy(&o->payload, &d, 8); break; }
    case NVTX_PAYLOAD_TYPE_FLOAT: { double d = a->payload.fValue; o->has_payload = 1; o->payload_kind = 2; memcpy(&o->payload, &d, 8); break; }
    default: break;
    }
}

/* args map or nil: worst case ~70 bytes (a category name of 31) */
static inline void put_args(uint8_t **c, const tl_attr *a) {
    uint32_t n = (a->has_color ? 1u : 0u) + (a->has_payload ? 1u : 0u) + (a->category ? 1u : 0u);
    mp_map(c, n);
    if (a->has_color) { mp_str(c, "color", 5); mp_uint(c, a->color); }
    if (a->has_payload) {
        mp_str(c, "payload", 7);
        if (a->payload_kind == 0) mp_uint(c, a->payload);
        else if (a->payload_kind == 1) mp_int(c, (int64_t)a->payload);
        else { double d; memcpy(&d, &a->payload, 8); mp_f64(c, d); }
    }
    if (a->category) {
        mp_str(c, "category", 8);
        if (a->cat_len) mp_str(c, a->cat_name, a->cat_len); /* (<= 32 bytes: BEGIN's 128 allow it) */
        else mp_uint(c, a->category);
    }
}

static inline int attr_has_args(const tl_attr *a) { return a && (a->has_color || a->has_payload || a->category); }

static inline uint32_t domain_sid(tl_thread *t, nvtxDomainHandle_t d) {
    if (!d) return 0;
    tl_name *n = (tl_name *)(void *)d;
    return n->magic == TL_DOMAIN_MAGIC ? tl_intern_name(t, n) : 0;
}

/* returns 0 when the record had to be dropped (its END is then skipped too) */
static inline int write_begin(tl_thread *t, uint64_t id, uint32_t name, uint32_t dom, const tl_attr *a, uint64_t ts) {
    uint8_t *r = tl_reserve(t, 128);
    if (!r) return 0;
    uint8_t tmp[128];
    memset(tmp, 0, 32);
    uint8_t *c = tmp + 1;
    int args = attr_has_args(a);
    mp_uint(&c, TL_BEGIN);
    mp_uint(&c, id);
    mp_uint(&c, TL_L_ANNOTATION);
    mp_uint(&c, name);
    mp_uint(&c, t->tid);
    mp_uint(&c, ts);
    if (dom || args) mp_uint(&c, dom);
    if (args) put_args(&c, a);
    tmp[0] = (uint8_t)(0x90 | (args ? 8 : dom ? 7 : 6));
    tl_publish(t, r, tmp, (size_t)(c - tmp));
    return 1;
}

static inline void write_end(tl_thread *t, uint64_t id, uint64_t ts) {
    uint8_t *r = tl_reserve(t, 32);
    if (!r) return;
    uint8_t tmp[32] = {0};
    uint8_t *c = tmp + 1;
    mp_uint(&c, TL_END);
    mp_uint(&c, id);
    mp_uint(&c, t->tid);
    mp_uint(&c, ts);
    tmp[0] = 0x94;
    tl_publish(t, r, tmp, (size_t)(c - tmp)); /* at most 1+1+9+5+9 = 25 bytes */
}

/* SPAN [3, layer, name, tid, start, end, corr=0, ext=range id, args] */
static inline void write_span(tl_thread *t, uint32_t name, uint64_t start, uint64_t end, uint64_t ext) {
    uint8_t *r = tl_reserve(t, 64);
    if (!r) return;
    uint8_t tmp[64];
    memset(tmp, 0, 32);
    uint8_t *c = tmp + 1;
    mp_uint(&c, TL_SPAN);
    mp_uint(&c, TL_L_ANNOTATION);
    mp_uint(&c, name);
    mp_uint(&c, t->tid);
    mp_uint(&c, start);
    mp_uint(&c, end);
    mp_uint(&c, 0);
    mp_uint(&c, ext);
    tmp[0] = 0x98;
    tl_publish(t, r, tmp, (size_t)(c - tmp));
}

/* args.domain is written as text: ids are only resolved in sid fields, not inside args */
static void write_mark(tl_thread *t, uint32_t name, const tl_name *dom, const tl_attr *a) {
    uint8_t *r = tl_reserve(t, 352); /* 28 + domain (<= 200 + 9) + args (<= 60, a category name +32) */
    if (!r) return;
    uint8_t tmp[352];
    memset(tmp, 0, 32);
    uint8_t *c = tmp + 1;
    uint32_t n = (dom ? 1u : 0u) + (a ? (a->has_color ? 1u : 0u) + (a->has_payload ? 1u : 0u) + (a->category ? 1u : 0u) : 0u);
    mp_uint(&c, TL_MARK);
    mp_uint(&c, TL_L_MARKER);
    mp_uint(&c, name);
    mp_uint(&c, t->tid);
    mp_uint(&c, tl_now());
    if (n) {
        mp_map(&c, n);
        if (dom) { mp_str(&c, "domain", 6); mp_str(&c, dom->text, dom->len > 200 ? tl_utf8_cut(dom->text, 200) : dom->len); }
        if (a && a->has_color) { mp_str(&c, "color", 5); mp_uint(&c, a->color); }
        if (a && a->has_payload) {
            mp_str(&c, "payload", 7);
            if (a->payload_kind == 0) mp_uint(&c, a->payload);
            else if (a->payload_kind == 1) mp_int(&c, (int64_t)a->payload);
            else { double d; memcpy(&d, &a->payload, 8); mp_f64(&c, d); }
        }
        if (a && a->category) {
            mp_str(&c, "category", 8);
            if (a->cat_len) mp_str(&c, a->cat_name, a->cat_len);
            else mp_uint(&c, a->category);
        }
    }
    tmp[0] = (uint8_t)(0x90 | (n ? 6 : 5));
    tl_publish(t, r, tmp, (size_t)(c - tmp));
}

/* ---- push / pop ---- */

static inline int do_push(tl_thread *t, nvtxDomainHandle_t dom, uint32_t name, const tl_attr *a) {
    uint64_t ts = tl_now();
    uint64_t id = tl_next_range_id(t);
    int depth = t->depth++;
    if (TL_LIKELY(depth < TL_MAX_DEPTH)) {
        tl_stack_entry *e = &t->stack[depth];
        e->id = id;
        e->domain = dom;
        e->start = ts;
        e->name = name;
        e->ext_pushed = 0;
        e->begun = 1;
        tl_ext_push_fn ext_push = tl_ext_push; /* (read once: CUPTI's atexit may clear it meanwhile) */
        if (ext_push) e->ext_pushed = (uint8_t)(ext_push(id) == 0);
    }
    if (TL_UNLIKELY(depth >= TL_MAX_DEPTH)) {
        /* no stack slot: neither BEGIN nor END is written, so the trace never shows a false open range */
        if (t->too_deep++ == 0) tl_diag(TL_WARN, "NVTX push/pop nesting deeper than %d on thread %u: deeper ranges not recorded", TL_MAX_DEPTH, t->tid);
        return depth;
    }
    if (!g_span_mode) t->stack[depth].begun = (uint8_t)write_begin(t, id, name, domain_sid(t, dom), a, ts);
    return depth;
}

static inline int do_pop(tl_thread *t, nvtxDomainHandle_t dom) {
    if (t->depth <= 0) return -1;
    uint64_t ts = tl_now();
    int top = t->depth - 1;
    if (TL_UNLIKELY(top >= TL_MAX_DEPTH)) { t->depth--; return top; }
    /* innermost range of this domain (normally the top of the stack) */
    int i = top;
    while (i >= 0 && t->stack[i].domain != dom) i--;
    if (i < 0) return -1;
    tl_stack_entry e = t->stack[i];
    /* (read once: CUPTI's atexit clears them, on another thread, while this one may still pop) */
    tl_ext_push_fn ext_push = tl_ext_push;
    tl_ext_pop_fn ext_pop = tl_ext_pop;
    if (i < top && ext_pop && ext_push) {
        /* Popped out of order (another domain's range is above it): CUPTI's external-correlation
         * stack holds one id per range above, in stack order, and its pop takes the top. Pop down
         * to this range's id and push the ranges above it back, so that launches stay tied to the
         * innermost range still open (the top's id was taken instead, and later launches were
         * tied to this range, already closed). */
        for (int j = top; j > i; j--)
            if (t->stack[j].ext_pushed) ext_pop();
        if (e.ext_pushed) ext_pop();
        for (int j = i + 1; j <= top; j++)
            if (t->stack[j].ext_pushed) t->stack[j].ext_pushed = (uint8_t)(ext_push(t->stack[j].id) == 0);
        e.ext_pushed = 0;
    }
    for (int j = i; j < top; j++) t->stack[j] = t->stack[j + 1];
    t->depth--;
    if (e.ext_pushed && ext_pop) ext_pop();
    if (TL_UNLIKELY(ts < e.start)) ts = e.start; /* per-thread monotonic across clock re-anchoring */
    if (!g_span_mode) { if (e.begun) write_end(t, e.id, ts); }
    else write_span(t, e.name, e.start, ts, e.id);
    return i;
}

/* Every callback that writes runs inside the reentrancy guard (tl_writer.h): a call from a signal
 * handler that interrupted this thread inside the shim is refused (push -1, start 0) and counted. */

static int NVTX_API cb_RangePushA(const char *msg) {
    if (!tl_enter()) return -1;
    tl_thread *t = tl_self();
    int r = t ? do_push(t, NULL, tl_intern(t, msg ? msg : "", msg ? strlen(msg) : 0), NULL) : -1;
    tl_leave();
    return r;
}

static int push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    if (!tl_enter()) return -1;
    tl_thread *t = tl_self();
    int r = -1;
    if (t) {
        tl_attr at;
        decode_attr(t, d, a, &at);
        r = do_push(t, d, at.name, &at);
    }
    tl_leave();
    return r;
}

static int pop(nvtxDomainHandle_t d) {
    if (!tl_enter()) return -1;
    tl_thread *t = tl_self();
    int r = t ? do_pop(t, d) : -1;
    tl_leave();
    return r;
}

static int NVTX_API cb_RangePushEx(const nvtxEventAttributes_t *a) { return push_ex(NULL, a); }
static int NVTX_API cb_RangePop(void) { return pop(NULL); }
static int NVTX_API cb_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { return push_ex(d, a); }
static int NVTX_API cb_DomainRangePop(nvtxDomainHandle_t d) { return pop(d); }

/* ---- start / end (may end on another thread) ---- */

static nvtxRangeId_t start_range(nvtxDomainHandle_t d, uint32_t name, const tl_attr *a, tl_thread *t) {
    uint64_t ts = tl_now();
    uint64_t id = tl_next_range_id(t);
    return write_begin(t, id, name, domain_sid(t, d), a, ts) ? id : 0; /* 0: dropped, RangeEnd(0) is ignored */
}

static nvtxRangeId_t start_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    if (!tl_enter()) return 0;
    tl_thread *t = tl_self();
    nvtxRangeId_t id = 0;
    if (t) {
        tl_attr at;
        decode_attr(t, d, a, &at);
        id = start_range(d, at.name, &at, t);
    }
    tl_leave();
    return id;
}

static nvtxRangeId_t NVTX_API cb_RangeStartEx(const nvtxEventAttributes_t *a) { return start_ex(NULL, a); }
static nvtxRangeId_t NVTX_API cb_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { return start_ex(d, a); }

static nvtxRangeId_t NVTX_API cb_RangeStartA(const char *msg) {
    if (!tl_enter()) return 0;
    tl_thread *t = tl_self();
    nvtxRangeId_t id = t ? start_range(NULL, tl_intern(t, msg ? msg : "", msg ? strlen(msg) : 0), NULL, t) : 0;
    tl_leave();
    return id;
}

static void NVTX_API cb_RangeEnd(nvtxRangeId_t id) {
    if (!id || !tl_enter()) return;
    tl_thread *t = tl_self();
    if (t) write_end(t, id, tl_now());
    tl_leave();
}

static void NVTX_API cb_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id) {
    (void)d;
    cb_RangeEnd(id);
}

/* ---- marks ---- */

static void NVTX_API cb_MarkA(const char *msg) {
    if (!tl_enter()) return;
    tl_thread *t = tl_self();
    if (t) write_mark(t, tl_intern(t, msg ? msg : "", msg ? strlen(msg) : 0), NULL, NULL);
    tl_leave();
}

static void mark_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    if (!tl_enter()) return;
    tl_thread *t = tl_self();
    if (t) {
        tl_attr at;
        decode_attr(t, d, a, &at);
        tl_name *dn = d ? (tl_name *)(void *)d : NULL;
        write_mark(t, at.name, dn && dn->magic == TL_DOMAIN_MAGIC ? dn : NULL, &at);
    }
    tl_leave();
}

static void NVTX_API cb_MarkEx(const nvtxEventAttributes_t *a) { mark_ex(NULL, a); }
static void NVTX_API cb_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { mark_ex(d, a); }

/* ---- names, domains, registered strings ---- */

static void NVTX_API cb_NameOsThreadA(uint32_t tid, const char *name) {
    if (!name || !tl_enter()) return;
    tl_thread *t = tl_self();
    if (t) tl_write_thread_name(t, tid, name, strlen(name));
    tl_leave();
}

static nvtxDomainHandle_t NVTX_API cb_DomainCreateA(const char *name) {
    /* Handles live for the whole process (NVTX never guarantees a destroy before use ends). Refused
     * (NULL: the default domain) from a handler that interrupted the shim, which may be in malloc. */
    if (!tl_enter()) return NULL;
    nvtxDomainHandle_t d = (nvtxDomainHandle_t)(void *)tl_name_new(name ? name : "", TL_DOMAIN_MAGIC);
    tl_leave();
    return d;
}

static void NVTX_API cb_DomainDestroy(nvtxDomainHandle_t d) {
    (void)d; /* kept alive: other threads may still be using the handle's cached ids */
}

static nvtxStringHandle_t NVTX_API cb_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s) {
    (void)d;
    if (!tl_enter()) return NULL;
    nvtxStringHandle_t h = (nvtxStringHandle_t)(void *)tl_name_new(s ? s : "", TL_REGSTR_MAGIC);
    tl_leave();
    return h;
}

static void NVTX_API cb_NameCategoryA(uint32_t cat, const char *name) { name_category(NULL, cat, name); }
static void NVTX_API cb_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t cat, const char *name) {
    name_category((const void *)d, cat, name);
}

/* ---- wide-character (W) entry points: as their A twins, the text as UTF-8. Left out, a RangePushW
 * was dropped while its RangePop still ended the range below it, and a DomainCreateW's ranges fell
 * into the default domain. ---- */

static int NVTX_API cb_RangePushW(const wchar_t *msg) {
    char buf[TL_WIDE_MAX];
    size_t n = wide_utf8(msg, buf, sizeof buf);
    if (!tl_enter()) return -1;
    tl_thread *t = tl_self();
    int r = t ? do_push(t, NULL, tl_intern(t, buf, n), NULL) : -1;
    tl_leave();
    return r;
}

static nvtxRangeId_t NVTX_API cb_RangeStartW(const wchar_t *msg) {
    char buf[TL_WIDE_MAX];
    size_t n = wide_utf8(msg, buf, sizeof buf);
    if (!tl_enter()) return 0;
    tl_thread *t = tl_self();
    nvtxRangeId_t id = t ? start_range(NULL, tl_intern(t, buf, n), NULL, t) : 0;
    tl_leave();
    return id;
}

static void NVTX_API cb_MarkW(const wchar_t *msg) {
    char buf[TL_WIDE_MAX];
    size_t n = wide_utf8(msg, buf, sizeof buf);
    if (!tl_enter()) return;
    tl_thread *t = tl_self();
    if (t) write_mark(t, tl_intern(t, buf, n), NULL, NULL);
    tl_leave();
}

static void NVTX_API cb_NameOsThreadW(uint32_t tid, const wchar_t *name) {
    if (!name) return;
    char buf[TL_WIDE_MAX];
    size_t n = wide_utf8(name, buf, sizeof buf);
    if (!tl_enter()) return;
    tl_thread *t = tl_self();
    if (t) tl_write_thread_name(t, tid, buf, n);
    tl_leave();
}

static nvtxDomainHandle_t NVTX_API cb_DomainCreateW(const wchar_t *name) {
    char buf[TL_WIDE_MAX];
    wide_utf8(name, buf, sizeof buf);
    return cb_DomainCreateA(buf);
}

static nvtxStringHandle_t NVTX_API cb_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t *s) {
    char buf[TL_WIDE_MAX];
    wide_utf8(s, buf, sizeof buf);
    return cb_DomainRegisterStringA(d, buf);
}

static void NVTX_API cb_NameCategoryW(uint32_t cat, const wchar_t *name) {
    char buf[TL_CAT_NAME * 4];
    wide_utf8(name, buf, sizeof buf);
    name_category(NULL, cat, buf);
}
static void NVTX_API cb_DomainNameCategoryW(nvtxDomainHandle_t d, uint32_t cat, const wchar_t *name) {
    char buf[TL_CAT_NAME * 4];
    wide_utf8(name, buf, sizeof buf);
    name_category((const void *)d, cat, buf);
}

static int install(NvtxGetExportTableFunc_t get, NvtxCallbackModule mod, const NvtxFunctionPointer *fns, unsigned n) {
    const NvtxExportTableCallbacks *etc = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
    if (!etc || !etc->GetModuleFunctionTable) return -1;
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!etc->GetModuleFunctionTable(mod, &table, &size) || !table) return -1;
    for (unsigned i = 1; i < n && i < size; i++)
        if (fns[i]) *table[i] = fns[i];
    return 0;
}

TL_VISIBLE int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    if (!getExportTable) return 0;
    if (tl_writer_init() != 0) return 0;
    const char *mode = getenv("TELLER_NVTX_MODE");
    g_span_mode = (mode && strcmp(mode, "span") == 0);

    NvtxFunctionPointer core[NVTX_CBID_CORE_SIZE] = {0};
    core[NVTX_CBID_CORE_MarkEx] = (NvtxFunctionPointer)cb_MarkEx;
    core[NVTX_CBID_CORE_MarkA] = (NvtxFunctionPointer)cb_MarkA;
    core[NVTX_CBID_CORE_RangeStartEx] = (NvtxFunctionPointer)cb_RangeStartEx;
    core[NVTX_CBID_CORE_RangeStartA] = (NvtxFunctionPointer)cb_RangeStartA;
    core[NVTX_CBID_CORE_RangeEnd] = (NvtxFunctionPointer)cb_RangeEnd;
    core[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)cb_RangePushEx;
    core[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)cb_RangePushA;
    core[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)cb_RangePop;
    core[NVTX_CBID_CORE_NameCategoryA] = (NvtxFunctionPointer)cb_NameCategoryA;
    core[NVTX_CBID_CORE_NameOsThreadA] = (NvtxFunctionPointer)cb_NameOsThreadA;
    core[NVTX_CBID_CORE_MarkW] = (NvtxFunctionPointer)cb_MarkW;
    core[NVTX_CBID_CORE_RangeStartW] = (NvtxFunctionPointer)cb_RangeStartW;
    core[NVTX_CBID_CORE_RangePushW] = (NvtxFunctionPointer)cb_RangePushW;
    core[NVTX_CBID_CORE_NameCategoryW] = (NvtxFunctionPointer)cb_NameCategoryW;
    core[NVTX_CBID_CORE_NameOsThreadW] = (NvtxFunctionPointer)cb_NameOsThreadW;

    NvtxFunctionPointer core2[NVTX_CBID_CORE2_SIZE] = {0};
    core2[NVTX_CBID_CORE2_DomainMarkEx] = (NvtxFunctionPointer)cb_DomainMarkEx;
    core2[NVTX_CBID_CORE2_DomainRangeStartEx] = (NvtxFunctionPointer)cb_DomainRangeStartEx;
    core2[NVTX_CBID_CORE2_DomainRangeEnd] = (NvtxFunctionPointer)cb_DomainRangeEnd;
    core2[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)cb_DomainRangePushEx;
    core2[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)cb_DomainRangePop;
    core2[NVTX_CBID_CORE2_DomainNameCategoryA] = (NvtxFunctionPointer)cb_DomainNameCategoryA;
    core2[NVTX_CBID_CORE2_DomainRegisterStringA] = (NvtxFunctionPointer)cb_DomainRegisterStringA;
    core2[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)cb_DomainCreateA;
    core2[NVTX_CBID_CORE2_DomainDestroy] = (NvtxFunctionPointer)cb_DomainDestroy;
    core2[NVTX_CBID_CORE2_DomainNameCategoryW] = (NvtxFunctionPointer)cb_DomainNameCategoryW;
    core2[NVTX_CBID_CORE2_DomainRegisterStringW] = (NvtxFunctionPointer)cb_DomainRegisterStringW;
    core2[NVTX_CBID_CORE2_DomainCreateW] = (NvtxFunctionPointer)cb_DomainCreateW;

    if (install(getExportTable, NVTX_CB_MODULE_CORE, core, NVTX_CBID_CORE_SIZE) != 0) return 0;
    if (install(getExportTable, NVTX_CB_MODULE_CORE2, core2, NVTX_CBID_CORE2_SIZE) != 0) return 0;
    return 1;
}
