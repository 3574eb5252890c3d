/* teller-shim raw trace writer: per-thread chunks of a file-backed MAP_SHARED mapping.
 * See cupti_shim/README.md for the design and docs/trace-format.md for the format. */
#ifndef TL_WRITER_H
#define TL_WRITER_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "tl_clock.h"

#define TL_VISIBLE __attribute__((visibility("default")))
#define TL_HIDDEN __attribute__((visibility("hidden")))
#define TL_LIKELY(x) __builtin_expect(!!(x), 1)
#define TL_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum { /* record types */
    TL_HEADER = 1, TL_STRING = 2, TL_SPAN = 3, TL_GPU = 4, TL_BEGIN = 5, TL_END = 6, TL_MARK = 7,
    TL_THREAD_NAME = 8, TL_COUNTER = 9, TL_DROPPED = 10, TL_CLOCK_SYNC = 11, TL_DIAG = 12
};
enum { /* layers */
    TL_L_OTHER = 0, TL_L_ANNOTATION = 1, TL_L_HOST_OP = 2, TL_L_PYTHON = 3, TL_L_RUNTIME = 4,
    TL_L_DRIVER = 5, TL_L_KERNEL = 6, TL_L_MEMCPY = 7, TL_L_MEMSET = 8, TL_L_SYNC = 9, TL_L_MARKER = 10
};
enum { TL_INFO = 0, TL_WARN = 1, TL_ERROR = 2 };

#define TL_MAX_DEPTH 1024 /* deeper push/pop nesting is counted, not recorded */
#define TL_SCACHE 512 /* per-thread string cache slots (power of two) */
#define TL_MAX_STR 65535

typedef struct tl_stack_entry {
    uint64_t id;
    const void *domain;
    uint64_t start;    /* SPAN mode only */
    uint32_t name;     /* SPAN mode only */
    uint8_t ext_pushed;
    uint8_t begun;     /* BEGIN was written (not dropped) */
} tl_stack_entry;

typedef struct tl_scache_entry {
    const char *text; /* owned by the global table, stable for one file generation */
    uint32_t len, hash, sid;
} tl_scache_entry;

/* A name written past the string table's budget: its own copy, so that a thread using it again
 * (a kernel first launched late in a run of unique NVTX names) reuses its STRING. */
#define TL_OCACHE 64
typedef struct tl_ocache_entry {
    char *text; /* owned by this entry (malloc), NULL when empty */
    uint32_t len, hash, sid;
} tl_ocache_entry;

typedef struct tl_thread {
    uint8_t *pos, *end;   /* free space in the current chunk */
    uint8_t *chunk;       /* mapping of the current chunk */
    size_t chunk_len;
    uint64_t chunk_off;   /* file offset of the current chunk */
    size_t next_chunk_len;/* chunks grow 64 KiB -> TELLER_CHUNK_KB, so idle threads cost little */
    uint32_t tid;
    uint32_t gen;         /* file generation this struct belongs to */
    uint64_t rid_next, rid_limit;
    uint64_t dropped;     /* records dropped by this thread, not yet reported (atomic: collected at exit) */
    uint64_t reentered;   /* calls refused by the reentrancy guard, not yet reported */
    int depth;            /* may exceed TL_MAX_DEPTH (entries beyond are not tracked nor recorded) */
    uint64_t too_deep;    /* pushes beyond TL_MAX_DEPTH */
    uint32_t sync_open;   /* blocking-sync callbacks begun and not yet ended (nested driver calls skipped) */
    tl_stack_entry stack[TL_MAX_DEPTH];
    tl_scache_entry scache[TL_SCACHE];
    tl_ocache_entry ocache[TL_OCACHE];
    struct tl_thread *next, *prev;
} tl_thread;

/* Interned name with a per-file-generation cached string id (domains, registered strings). */
typedef struct tl_name {
    uint32_t magic, len, hash;
    char *text;
    uint64_t cache; /* (gen << 32) | sid, accessed atomically */
} tl_name;

/* One GPU for the HEADER's `deviceProperties` (Kineto's keys). Fields a driver query could not fill
 * are left out of the map (total_mem 0, attr < 0). The attribute order is Kineto's key order. */
enum {
    TL_DEV_COMPUTE_MAJOR, TL_DEV_COMPUTE_MINOR, TL_DEV_MAX_THREADS_PER_BLOCK, TL_DEV_MAX_THREADS_PER_SM,
    TL_DEV_REGS_PER_BLOCK, TL_DEV_WARP_SIZE, TL_DEV_SHMEM_PER_BLOCK, TL_DEV_NUM_SMS, TL_DEV_REGS_PER_SM,
    TL_DEV_SHMEM_PER_BLOCK_OPTIN, TL_DEV_SHMEM_PER_SM, TL_DEV_NATTR
};
#define TL_MAX_DEVICES 64
typedef struct tl_device_props {
    uint32_t id;        /* CUDA device ordinal (CUPTI's deviceId) */
    char name[256];     /* NUL-terminated; "" = unknown (the device is not recorded) */
    uint64_t total_mem; /* bytes, 0 = unknown */
    int64_t attr[TL_DEV_NATTR];
    char uuid[48];      /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form), "" = unknown */
} tl_device_props;

/* Initialize the writer once per process (idempotent; called from both entry points). 0 = ok. */
TL_HIDDEN int tl_writer_init(void);
TL_HIDDEN int tl_writer_enabled(void);
TL_HIDDEN tl_thread *tl_self_slow(void);
TL_HIDDEN uint8_t *tl_reserve_slow(tl_thread *t, size_t max);
TL_HIDDEN uint32_t tl_intern_slow(tl_thread *t, const char *s, uint32_t len, uint32_t hash);
TL_HIDDEN uint32_t tl_intern_name(tl_thread *t, tl_name *n);
TL_HIDDEN tl_name *tl_name_new(const char *s, uint32_t magic);
TL_HIDDEN void tl_diag(int severity, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
TL_HIDDEN void tl_header_set_cupti(uint32_t version, const char *error);
/* Add a GPU to the HEADER (rewritten in place). The first entry for an id wins; at most
 * TL_MAX_DEVICES per file. Not from a signal handler (takes the writer lock, pwrite). */
TL_HIDDEN void tl_header_add_device(const tl_device_props *d);
TL_HIDDEN void tl_write_thread_name(tl_thread *t, uint32_t tid, const char *name, size_t len);
TL_HIDDEN void tl_writer_finish(void);
TL_HIDDEN const char *tl_trace_path(void);
TL_HIDDEN uint32_t tl_gettid(void);
TL_HIDDEN void tl_register_fork_child(void (*fn)(void));

/* initial-exec: one pointer of static TLS, no __tls_get_addr call on the hot path */
extern __thread tl_thread *tl_tls __attribute__((tls_model("initial-exec")));

/* Reentrancy guard. A signal handler that calls NVTX while its thread is inside the shim (between
 * tl_reserve and tl_publish, moving the push/pop stack, or holding the writer lock) would write over
 * the record in progress or deadlock on the lock. Every entry point that touches the thread's state
 * runs between tl_enter() and tl_leave(); a call that finds the flag set does nothing and is counted
 * (reported as a DROPPED record at the next chunk hand-out, thread exit or process exit). A handler
 * runs to completion before its thread goes on, so a handler's push and pop are either both recorded
 * or both refused. Both flags are thread-local and only touched by their own thread (and its signal
 * handlers), so single-instruction updates with signal fences suffice: no lock, no atomic RMW on the
 * hot path. */
extern __thread uint8_t tl_busy __attribute__((tls_model("initial-exec")));
extern __thread uint64_t tl_reentered __attribute__((tls_model("initial-exec")));
TL_HIDDEN void tl_reentered_fold(void);

static inline int tl_enter(void) {
    if (TL_UNLIKELY(tl_busy)) {
        __atomic_fetch_add(&tl_reentered, 1, __ATOMIC_RELAXED); /* one instruction: a nested handler cannot tear it */
        return 0;
    }
    tl_busy = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    return 1;
}

static inline void tl_leave(void) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_busy = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    /* a refused call incremented the count before the flag was cleared, so it is seen here */
    if (TL_UNLIKELY(__atomic_load_n(&tl_reentered, __ATOMIC_RELAXED))) tl_reentered_fold();
}
extern uint32_t tl_gen; /* current file generation */
extern uint64_t tl_rid_global; /* atomic */


static inline tl_thread *tl_self(void) {
    tl_thread *t = tl_tls;
    if (TL_LIKELY(t != NULL && t->gen == __atomic_load_n(&tl_gen, __ATOMIC_RELAXED))) return t;
    return tl_self_slow();
}

/* Space for one record of at most `max` bytes; NULL if it had to be dropped (counted). */
static inline uint8_t *tl_reserve(tl_thread *t, size_t max) {
    if (TL_LIKELY((size_t)(t->end - t->pos) >= max)) return t->pos;
    return tl_reserve_slow(t, max);
}

/* Publish a record: the array header byte is stored last, so a record torn by SIGKILL starts with
 * a zero byte (never a plausible array header). */
static inline void tl_commit(tl_thread *t, uint8_t *start, uint8_t *end, uint8_t hdr) {
    __atomic_store_n(start, hdr, __ATOMIC_RELEASE);
    t->pos = end;
}

/* Word-at-a-time hash (the names are short; FNV byte loops dominated the NVTX hot path). */
/* Small records are encoded on the stack and published with ONE 32-byte store where the CPU has AVX: a
 * thread killed at any point leaves the whole record or nothing (signals land between instructions and a
 * faulting store has no effect), so no torn record. Larger records (or no AVX): body first, then the
 * array header byte with a release store (a torn record then reads as 0x00 + loose values). */
extern int tl_has_avx;
TL_HIDDEN void tl_store32(uint8_t *dst, const uint8_t *src);

/* tmp holds the encoded record (header byte included) of len bytes; r came from tl_reserve(t, >= 32). */
static inline void tl_publish(tl_thread *t, uint8_t *r, const uint8_t *tmp, size_t len) {
    if (TL_LIKELY(len <= 32 && tl_has_avx)) {
        tl_store32(r, tmp); /* tmp must be 32 readable bytes, zero after len */
    } else {
        memcpy(r + 1, tmp + 1, len - 1);
        __atomic_store_n(r, tmp[0], __ATOMIC_RELEASE);
    }
    t->pos = r + len;
}

static inline uint32_t tl_hash(const char *s, uint32_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ len;
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    if (i < len) {
        uint64_t w = 0;
        memcpy(&w, s + i, len - i);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    }
    h ^= h >> 32;
    return (uint32_t)h | 1u; /* never 0 */
}

/* `len` less a UTF-8 sequence left incomplete at its end: where a string is cut at a byte limit
 * (ours, or the kernel's 15-byte thread names), the cut never splits a character, so the reader
 * gets valid UTF-8 from valid input. Invalid input (Latin-1 argv) is written as given: the reader
 * replaces it and says so. */
static inline size_t tl_utf8_cut(const char *s, size_t len) {
    size_t i = len, k = 0; /* k continuation bytes (10xxxxxx) at the end */
    while (i > 0 && k < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) { i--; k++; }
    if (i == 0) return len;
    unsigned char b = (unsigned char)s[i - 1];
    size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return (b >= 0xC0 && k + 1 < need) ? i - 1 : len; /* a lead byte short of its continuation */
}

/* String id for `s` in the current file; writes a STRING record on first sight in the file. */
static inline uint32_t tl_intern(tl_thread *t, const char *s, size_t len) {
    if (len > TL_MAX_STR) len = tl_utf8_cut(s, TL_MAX_STR);
    uint32_t h = tl_hash(s, (uint32_t)len);
    tl_scache_entry *e = &t->scache[h & (TL_SCACHE - 1)];
    if (TL_LIKELY(e->hash == h && e->len == len && memcmp(e->text, s, len) == 0)) return e->sid;
    return tl_intern_slow(t, s, (uint32_t)len, h);
}

static inline uint64_t tl_next_range_id(tl_thread *t) {
    if (TL_UNLIKELY(t->rid_next == t->rid_limit)) {
        t->rid_next = __atomic_fetch_add(&tl_rid_global, 1024, __ATOMIC_RELAXED);
        t->rid_limit = t->rid_next + 1024;
    }
    return t->rid_next++;
}
#endif
