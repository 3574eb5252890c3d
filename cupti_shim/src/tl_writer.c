/* teller-shim raw trace writer. */
#define _GNU_SOURCE
#include "tl_writer.h"
#include "tl_msgpack.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define TL_PRODUCER "teller-shim 0.1.0"
#define TL_HEADER_REGION (64u * 1024u) /* bytes reserved at the start of the file for the HEADER */
#define TL_NAME_MAGIC_STR 0x54535452u

__thread tl_thread *tl_tls __attribute__((tls_model("initial-exec")));
__thread uint8_t tl_busy __attribute__((tls_model("initial-exec")));
__thread uint64_t tl_reentered __attribute__((tls_model("initial-exec")));
uint32_t tl_gen;          /* bumped for every new file (first open, fork child) */
uint64_t tl_rid_global = 1;

typedef struct {
    char *text;
    uint32_t len, hash, sid;
    /* its STRING record: 0 not in the file yet (its reservation failed: written at the next chunk
     * hand-out, the next use, or at exit), 1 being written by one thread (the others use the id
     * without caching it), 2 written */
    uint8_t written;
} tl_gstr;

static struct {
    pthread_mutex_t mu;  /* file growth, chunk hand-out, thread list, header rewrite */
    pthread_mutex_t smu; /* global string table */
    int state;           /* 0 = not initialised, 1 = enabled, -1 = disabled (open failed) */
    pid_t pid;           /* process that owns fd */
    int fd;
    char path[PATH_MAX];
    uint64_t size, next_off, max_size, grow_step;
    size_t chunk_size;
    uint64_t start_ns;
    uint64_t dropped_unreported; /* atomic */
    uint64_t reentered_unreported; /* atomic: refused reentrant calls of exited threads */
    uint64_t full_until;         /* after a failed growth, don't retry before this time (ns) */
    uint64_t last_sync;          /* CLOCK_SYNC written at most every sync_ns (on chunk hand-out) */
    uint64_t sync_ns;
    tl_thread *threads;
    pthread_key_t key;
    /* string table (open addressing) */
    tl_gstr *strs;
    uint32_t strs_cap, strs_count, next_sid;
    uint32_t strs_pending; /* entries whose STRING could not be written yet (written == 0), under smu */
    /* The table's budget (TELLER_MAX_NAMES names, TELLER_NAMES_MB of text): past it a name not in the
     * table gets a fresh id and its STRING at each use, and is not kept. Decision: every name kept to
     * the exit made a program whose names are all new (torch's emit_nvtx names each range
     * "aten::add, seq = N", a review measured 126 MB for 1M of them) grow without end; past the
     * budget a name used again costs a STRING per use instead. */
    uint32_t strs_max;
    uint64_t strs_bytes, strs_bytes_max;
    int strs_over_said;
    /* header extras (rewritten in place) */
    uint32_t cupti_version;
    char cupti_error[512];
    tl_device_props devs[TL_MAX_DEVICES]; /* sorted by id */
    uint32_t n_devs;
    int verbose;
    void (*fork_child_hooks[4])(void);
    int n_fork_child_hooks;
} g = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .smu = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dev_t g_dev;
static ino_t g_ino;
static int g_lost; /* our descriptor was closed (and maybe reused) by the program */

/* Programs (daemons, close_fds loops) may close our descriptor and reuse its number for their own
 * file: before any operation on the file, check that the descriptor still is our trace file, so that
 * the shim can never write into, extend or truncate someone else's file. Called with g.mu held. */
static int fd_ours(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == g_dev && st.st_ino == g_ino;
}
static int fd_ok_locked(void) {
    if (g.fd < 0 || g.pid != getpid() || g_lost) return 0;
    if (fd_ours(g.fd)) return 1;
    g_lost = 1;
    if (!getenv("TELLER_SHIM_QUIET"))
        fprintf(stderr, "teller-shim: the program closed the trace file's descriptor; recording stops when the "
                        "current chunks are full (%s)\n", g.path);
    return 0;
}

int tl_has_avx;

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx"))) void tl_store32(uint8_t *dst, const uint8_t *src) {
    _mm256_storeu_si256((__m256i *)(void *)dst, _mm256_loadu_si256((const __m256i *)(const void *)src));
}
#else
void tl_store32(uint8_t *dst, const uint8_t *src) { memcpy(dst, src, 32); }
#endif

uint32_t tl_gettid(void) { return (uint32_t)syscall(SYS_gettid); }

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    return (end && *end == 0) ? (uint64_t)x : dflt;
}

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Process start on CLOCK_MONOTONIC (from /proc/self/stat starttime, which counts from boot). */
static uint64_t process_start_ns(void) {
    uint64_t now = tl_mono_ns();
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return now;
    char buf[2048];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return now;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return now;
    /* after ")" come fields 3.. ; starttime is field 22 */
    int field = 2;
    unsigned long long start_ticks = 0;
    for (char *q = p + 1; *q; q++) {
        if (*q == ' ') {
            field++;
            if (field == 22) { start_ticks = strtoull(q + 1, NULL, 10); break; }
        }
    }
    long hz = sysconf(_SC_CLK_TCK);
    if (start_ticks == 0 || hz <= 0) return now;
    struct timespec bt;
    clock_gettime(CLOCK_BOOTTIME, &bt);
    uint64_t boot_now = (uint64_t)bt.tv_sec * 1000000000ull + (uint64_t)bt.tv_nsec;
    uint64_t start_boot = (uint64_t)start_ticks * (1000000000ull / (uint64_t)hz);
    uint64_t age = boot_now > start_boot ? boot_now - start_boot : 0;
    return now > age ? now - age : 0;
}

static int env_wanted(const char *kv) {
    static const char *keys[] = {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "CUDA_VISIBLE_DEVICES=",
                                 /* (which GPU an index names: FASTEST_FIRST by default, or PCI_BUS_ID) */
                                 "CUDA_DEVICE_ORDER="};
    if (strncmp(kv, "TELLER_", 7) == 0) return 1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strncmp(kv, keys[i], strlen(keys[i])) == 0) return 1;
    return 0;
}

extern char **environ;

/* Kineto's deviceProperties keys, in TL_DEV_* order (after id, name, totalGlobalMem). */
static const char *const dev_keys[TL_DEV_NATTR] = {
    "computeMajor", "computeMinor", "maxThreadsPerBlock", "maxThreadsPerMultiprocessor", "regsPerBlock", "warpSize",
    "sharedMemPerBlock", "numSms", "regsPerMultiprocessor", "sharedMemPerBlockOptin", "sharedMemPerMultiprocessor"};
/* Upper bound of one encoded device map: keys 220 B, name 257, id 5, 12 values of at most 9, uuid 49,
 * map 1 (640). */
#define TL_DEV_MAX_BYTES 704u

static void encode_device(uint8_t **c, const tl_device_props *d) {
    uint32_t n = 2 + (d->total_mem ? 1 : 0) + (d->uuid[0] ? 1 : 0);
    for (int i = 0; i < TL_DEV_NATTR; i++) n += d->attr[i] >= 0;
    mp_map(c, n);
    mp_cstr(c, "id"); mp_uint(c, d->id);
    mp_cstr(c, "name"); mp_str(c, d->name, strnlen(d->name, sizeof d->name - 1));
    if (d->total_mem) { mp_cstr(c, "totalGlobalMem"); mp_uint(c, d->total_mem); }
    for (int i = 0; i < TL_DEV_NATTR; i++)
        if (d->attr[i] >= 0) { mp_cstr(c, dev_keys[i]); mp_int(c, d->attr[i]); }
    /* (after Kineto's keys: not one of them) */
    if (d->uuid[0]) { mp_cstr(c, "uuid"); mp_str(c, d->uuid, strnlen(d->uuid, sizeof d->uuid - 1)); }
}

/* The HEADER is the process's fixed facts (pid, ppid, host, argv, clock, env: encoded ONCE, when the
 * file is opened) followed by the extras that arrive later (CUPTI version, errors, GPUs), and is
 * rewritten in place when an extra arrives. Later rewrites run on the CUPTI writer thread at
 * arbitrary times, so they must not read environ (another thread's setenv may free it mid-read),
 * /proc/self/cmdline (setproctitle) or getppid() (a dead launcher) again: they copy the cached bytes. */
#define TL_HDR_EXTRA_MIN (600u + 8u * TL_DEV_MAX_BYTES + 32u) /* room kept for extras: 8 GPUs at least */
static uint8_t *g_fixed;   /* the fixed key/value pairs (no map header) */
static size_t g_fixed_len;
static uint32_t g_fixed_keys;
static size_t g_hdr_len;   /* bytes of the header written so far (the longest) */

/* Encode the fixed pairs into buf (at most cap bytes); returns the length, *nkeys the pair count. */
static size_t encode_fixed(uint8_t *buf, size_t cap, uint64_t mono, uint64_t real, uint32_t *nkeys) {
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    char cmd[16384];
    size_t cmdlen = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n;
        while (cmdlen < sizeof cmd && (n = read(fd, cmd + cmdlen, sizeof cmd - cmdlen)) > 0) cmdlen += (size_t)n;
        close(fd);
    }
    uint32_t nargs = 0;
    for (size_t i = 0; i < cmdlen; i++) if (cmd[i] == 0) nargs++;
    if (cmdlen > 0 && cmd[cmdlen - 1] != 0) nargs++; /* truncated last argument */
    /* argv: 16 KiB of text at most, 5 B of string header per argument at most; the rest is small */
    if (cap < 2048 + cmdlen + 5 * (size_t)nargs) { cmdlen = 0; nargs = 0; } /* no argv rather than no header */
    uint8_t *c = buf;
    mp_cstr(&c, "pid"); mp_uint(&c, (uint64_t)getpid());
    mp_cstr(&c, "ppid"); mp_uint(&c, (uint64_t)getppid());
    mp_cstr(&c, "host"); mp_cstr(&c, host);
    mp_cstr(&c, "argv"); mp_arr(&c, nargs);
    for (size_t i = 0, s = 0; i <= cmdlen && nargs; i++) {
        if (i == cmdlen || cmd[i] == 0) {
            /* (the last argument may be cut at the buffer's end: not inside a character) */
            if (i > s || i < cmdlen) mp_str(&c, cmd + s, i == cmdlen ? tl_utf8_cut(cmd + s, i - s) : i - s);
            s = i + 1;
            if (i == cmdlen) break;
        }
    }
    mp_cstr(&c, "clock"); mp_cstr(&c, "CLOCK_MONOTONIC");
    mp_cstr(&c, "clock_sync"); mp_arr(&c, 2); mp_uint(&c, mono); mp_uint(&c, real);
    mp_cstr(&c, "start_ns"); mp_uint(&c, g.start_ns);
    /* env: one pass collects the wanted entries (those with a '='), then as many as fit are written,
     * a value that does not fit as "" (the key still says the variable was set); the map's count is
     * the number written */
    const char *kv[256];
    size_t kl[256], vl[256];
    uint32_t nkv = 0;
    for (char **e = environ; e && *e && nkv < 256; e++) {
        if (!env_wanted(*e)) continue;
        const char *eq = strchr(*e, '=');
        if (!eq || eq - *e > 255) continue;
        kv[nkv] = *e;
        kl[nkv] = (size_t)(eq - *e);
        vl[nkv] = strlen(eq + 1);
        nkv++;
    }
    size_t at = (size_t)(c - buf) + 64; /* + the "env" key, the map header and "producer" */
    uint32_t nenv = 0;
    for (uint32_t i = 0; i < nkv; i++) {
        if (at + kl[i] + vl[i] + 16 > cap) vl[i] = 0;
        if (at + kl[i] + vl[i] + 16 > cap) break;
        at += kl[i] + vl[i] + 16;
        nenv++;
    }
    mp_cstr(&c, "env"); mp_map(&c, nenv);
    for (uint32_t i = 0; i < nenv; i++) { mp_str(&c, kv[i], kl[i]); mp_str(&c, kv[i] + kl[i] + 1, vl[i]); }
    mp_cstr(&c, "producer"); mp_cstr(&c, TL_PRODUCER);
    *nkeys = 9; /* pid ppid host argv clock clock_sync start_ns env producer */
    return (size_t)(c - buf);
}

/* The whole HEADER record from the cached fixed pairs and the current extras; 0 if nothing cached. */
static size_t encode_header(uint8_t *buf, size_t cap) {
    if (!g_fixed) return 0;
    /* GPUs go last; with a huge argv the last ones are left out rather than the whole header */
    uint32_t ndev = g.n_devs;
    size_t base = 16 + g_fixed_len + 600;
    while (ndev && base + ndev * TL_DEV_MAX_BYTES + 32 > cap) ndev--;
    uint8_t *c = buf;
    uint32_t nkeys = g_fixed_keys + (g.cupti_version ? 1 : 0) + (g.cupti_error[0] ? 1 : 0) + (ndev ? 1 : 0);
    mp_arr(&c, 4);
    mp_uint(&c, TL_HEADER);
    mp_cstr(&c, "teller-trace");
    mp_uint(&c, 1);
    mp_map(&c, nkeys);
    memcpy(c, g_fixed, g_fixed_len);
    c += g_fixed_len;
    if (g.cupti_version) { mp_cstr(&c, "cupti_version"); mp_uint(&c, g.cupti_version); }
    if (g.cupti_error[0]) { mp_cstr(&c, "errors"); mp_arr(&c, 1); mp_cstr(&c, g.cupti_error); }
    if (ndev) {
        mp_cstr(&c, "deviceProperties");
        mp_arr(&c, ndev);
        for (uint32_t i = 0; i < ndev; i++) encode_device(&c, &g.devs[i]);
    }
    return (size_t)(c - buf);
}

static uint64_t g_hdr_mono, g_hdr_real;

/* Called with g.mu held. The first call of a file generation (fixed == 1) encodes the fixed pairs. */
static int write_header_locked(int fixed) {
    if (!fixed && !g_fixed) return -1; /* (no fixed part cached: never re-read environ off the opening thread) */
    if (fixed) {
        free(g_fixed);
        g_fixed = malloc(TL_HEADER_REGION);
        g_fixed_len = 0;
        if (!g_fixed) return -1;
        g_fixed_len = encode_fixed(g_fixed, TL_HEADER_REGION - 16 - TL_HDR_EXTRA_MIN, g_hdr_mono, g_hdr_real,
                                   &g_fixed_keys);
        g_hdr_len = 0;
    }
    uint8_t *buf = calloc(1, TL_HEADER_REGION);
    if (!buf) return -1;
    size_t n = encode_header(buf, TL_HEADER_REGION);
    int rc = -1;
    if (n > 0) {
        /* Only the header's bytes (up to the longest written: a shorter header leaves zeros after it,
         * the padding readers skip), not the whole region. Pages after the first go first and the
         * first page last: a header within one page (the usual case) is then old or new, never torn. */
        size_t len = n > g_hdr_len ? n : g_hdr_len, pg = 4096;
        rc = 0;
        if (len > pg && pwrite(g.fd, buf + pg, len - pg, (off_t)pg) != (ssize_t)(len - pg)) rc = -1;
        size_t first = len < pg ? len : pg;
        if (rc == 0 && pwrite(g.fd, buf, first, 0) != (ssize_t)first) rc = -1;
        if (rc == 0) g_hdr_len = n;
    }
    free(buf);
    return rc;
}

static int mkdirs(const char *path) {
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int grow_locked(uint64_t need_end) {
    if (!fd_ok_locked()) return -1;
    if (need_end <= g.size) return 0;
    uint64_t ns = g.size + g.grow_step;
    if (ns < need_end) ns = need_end;
    if (ns > g.max_size) ns = g.max_size;
    if (ns < need_end) return -1;
    int rc = posix_fallocate(g.fd, (off_t)g.size, (off_t)(ns - g.size));
    if (rc != 0) {
        /* allocate only what is needed right now */
        if (ns == need_end || posix_fallocate(g.fd, (off_t)g.size, (off_t)(need_end - g.size)) != 0) return -1;
        ns = need_end;
    }
    g.size = ns;
    return 0;
}

/* Open this process's file. Called with g.mu held. */
static int open_file_locked(void) {
    const char *dir = getenv("TELLER_TRACE_DIR");
    char rawdir[PATH_MAX];
    int w = snprintf(rawdir, sizeof rawdir, "%s/raw", dir && *dir ? dir : "teller-traces");
    if (w < 0 || (size_t)w >= sizeof rawdir) { errno = ENAMETOOLONG; return -1; }
    if (mkdirs(rawdir) != 0) return -1;
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++) if (*p == '/') *p = '_';
    int fd = -1;
    for (int n = 0; n < 10000 && fd < 0; n++) {
        w = snprintf(g.path, sizeof g.path, "%s/teller-%s-%d-%d.tmsgpack", rawdir, host, (int)getpid(), n);
        if (w < 0 || (size_t)w >= sizeof g.path) { errno = ENAMETOOLONG; return -1; }
        fd = open(g.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) return -1;
    }
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return -1; }
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    g_lost = 0;
    g.fd = fd;
    g.pid = getpid();
    g.start_ns = process_start_ns();
    g_hdr_mono = tl_mono_ns();
    g_hdr_real = realtime_ns();
    g.last_sync = g_hdr_mono;
    g.size = 0;
    g.next_off = TL_HEADER_REGION;
    if (grow_locked(TL_HEADER_REGION) != 0 || write_header_locked(1) != 0) {
        close(fd);
        unlink(g.path);
        g.fd = -1;
        return -1;
    }
    __atomic_add_fetch(&tl_gen, 1, __ATOMIC_RELEASE);
    return 0;
}

static void thread_unlink_locked(tl_thread *t) {
    if (t->prev) t->prev->next = t->next; else g.threads = t->next;
    if (t->next) t->next->prev = t->prev;
    t->next = t->prev = NULL;
}

static void ocache_free(tl_thread *t) {
    for (int i = 0; i < TL_OCACHE; i++) {
        free(t->ocache[i].text);
        t->ocache[i].text = NULL;
    }
}

static void thread_destructor(void *p) {
    tl_thread *t = p;
    if (!t) return;
    uint8_t was_busy = tl_busy; /* set when called from tl_self_slow */
    tl_busy = 1; /* a handler's NVTX call must not write into the chunk being unmapped */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    pthread_mutex_lock(&g.mu);
    int mine = (t->gen == tl_gen && fd_ok_locked());
    /* its counts move to the process's under the lock, with the unlink: tl_writer_finish (at exit,
     * on another thread) collects both under it, so none falls between the list and the totals */
    uint64_t dr = __atomic_exchange_n(&t->dropped, 0, __ATOMIC_RELAXED);
    if (dr) __atomic_add_fetch(&g.dropped_unreported, dr, __ATOMIC_RELAXED);
    uint64_t re = __atomic_exchange_n(&t->reentered, 0, __ATOMIC_RELAXED) + __atomic_exchange_n(&tl_reentered, 0, __ATOMIC_RELAXED);
    if (re) __atomic_add_fetch(&g.reentered_unreported, re, __ATOMIC_RELAXED);
    if (t->gen == tl_gen) thread_unlink_locked(t);
    if (mine && t->chunk) {
        /* give the unused tail of the chunk back to the file system (it reads as zeros: padding) */
        long pg = sysconf(_SC_PAGESIZE);
        uint64_t used = (uint64_t)(t->pos - t->chunk);
        uint64_t from = t->chunk_off + (used + (uint64_t)pg - 1) / (uint64_t)pg * (uint64_t)pg;
        uint64_t to = t->chunk_off + t->chunk_len;
        if (to > from) fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(to - from));
    }
    pthread_mutex_unlock(&g.mu);
    if (t->chunk) munmap(t->chunk, t->chunk_len);
    if (tl_tls == t) tl_tls = NULL;
    ocache_free(t);
    free(t);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_busy = was_busy;
}

/* fork handling: the child must never write into the parent's mappings or file. */
static __thread uint8_t fork_was_busy __attribute__((tls_model("initial-exec")));
static void atfork_prepare(void) {
    /* the locks are held across fork() with signals deliverable: a handler's NVTX call must not
     * wait for them (the reentrancy guard) */
    fork_was_busy = tl_busy;
    tl_busy = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    pthread_mutex_lock(&g.smu);
    pthread_mutex_lock(&g.mu);
}
static void atfork_parent(void) {
    pthread_mutex_unlock(&g.mu);
    pthread_mutex_unlock(&g.smu);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_busy = fork_was_busy;
}
static void atfork_child(void) {
    pthread_mutex_init(&g.mu, NULL);
    pthread_mutex_init(&g.smu, NULL);
    /* Drop every inherited thread buffer (the other threads do not exist in the child). */
    tl_thread *t = g.threads;
    while (t) {
        tl_thread *nx = t->next;
        if (t->chunk) munmap(t->chunk, t->chunk_len);
        if (t != tl_tls) { ocache_free(t); free(t); }
        t = nx;
    }
    if (tl_tls) { ocache_free(tl_tls); free(tl_tls); tl_tls = NULL; }
    if (g.state == 1) pthread_setspecific(g.key, NULL); /* the key's destructor must not see the freed struct */
    g.threads = NULL;
    g.full_until = 0;
    if (g.fd >= 0 && !g_lost && fd_ours(g.fd)) close(g.fd);
    g.fd = -1;
    g_lost = 0;
    g.pid = 0;
    g.dropped_unreported = 0;
    g.reentered_unreported = 0;
    tl_reentered = 0; /* the forking thread's count belongs to the parent's file */
    tl_busy = 0;
    g.cupti_version = 0;
    g.cupti_error[0] = 0;
    /* The child's file describes the child: the parent's GPUs are not claimed (CUDA is unusable in the
     * child of an initialised parent). A child whose own cuInit injects CUPTI records its devices. */
    g.n_devs = 0;
    for (uint32_t i = 0; i < g.strs_cap; i++) free(g.strs[i].text);
    free(g.strs);
    g.strs = NULL;
    g.strs_cap = g.strs_count = g.strs_pending = 0;
    g.strs_bytes = 0;
    g.strs_over_said = 0;
    g.next_sid = 1;
    /* Invalidate every cached string id and every thread struct: the child opens its own file lazily. */
    __atomic_add_fetch(&tl_gen, 1, __ATOMIC_RELEASE);
    tl_clock_fork_child();
    for (int i = 0; i < g.n_fork_child_hooks; i++) g.fork_child_hooks[i]();
}

void tl_register_fork_child(void (*fn)(void)) {
    pthread_mutex_lock(&g.mu);
    if (g.n_fork_child_hooks < 4) g.fork_child_hooks[g.n_fork_child_hooks++] = fn;
    pthread_mutex_unlock(&g.mu);
}

static void atexit_handler(void) {
    /* exit() from a signal handler that interrupted the shim: leave the file as it is (zero padding
     * after the last record) rather than wait for a lock this thread holds */
    if (!tl_enter()) return;
    tl_writer_finish();
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_busy = 0;
}

static void init_once(void) {
    tl_clock_init();
#if defined(__x86_64__)
    tl_has_avx = __builtin_cpu_supports("avx") && !getenv("TELLER_NO_AVX");
#endif
    g.verbose = (int)env_u64("TELLER_SHIM_VERBOSE", 0);
    g.chunk_size = (size_t)env_u64("TELLER_CHUNK_KB", 256) * 1024u;
    if (g.chunk_size < 64 * 1024) g.chunk_size = 64 * 1024;
    long pg = sysconf(_SC_PAGESIZE);
    if (pg > 0) g.chunk_size = (g.chunk_size + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
    g.grow_step = env_u64("TELLER_GROW_MB", 16) << 20;
    if (g.grow_step < g.chunk_size) g.grow_step = g.chunk_size;
    g.max_size = env_u64("TELLER_MAX_FILE_MB", 4096) << 20;
    if (g.max_size < TL_HEADER_REGION + g.chunk_size) g.max_size = TL_HEADER_REGION + g.chunk_size;
    g.next_sid = 1;
    {
        uint64_t m = env_u64("TELLER_MAX_NAMES", 262144);
        g.strs_max = m < 1024 ? 1024u : m > (1u << 30) ? (1u << 30) : (uint32_t)m;
    }
    g.strs_bytes_max = env_u64("TELLER_NAMES_MB", 64) << 20;
    g.sync_ns = env_u64("TELLER_CLOCK_SYNC_MS", 10000) * 1000000ull;
    if (pthread_key_create(&g.key, thread_destructor) != 0) { g.state = -1; return; }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atexit(atexit_handler);
    g.state = 1;
}

int tl_writer_init(void) {
    pthread_once(&g_once, init_once);
    return g.state == 1 ? 0 : -1;
}

int tl_writer_enabled(void) { return g.state == 1; }

const char *tl_trace_path(void) { return g.fd >= 0 ? g.path : NULL; }

static void report_dropped(tl_thread *t);
static void report_reentered(tl_thread *t);
static void write_pending_strings(tl_thread *t, size_t keep);

#define TL_REENTERED_REASON "calls from a signal handler made while the collector was running on the same thread (NVTX ranges, CUDA synchronize callbacks)"

/* Move this thread's refused-call count into its struct, under the guard so that a handler's own
 * chunk hand-out (which reports and clears t->reentered) cannot interleave with the update. */
void tl_reentered_fold(void) {
    if (!tl_enter()) return;
    uint64_t n = __atomic_exchange_n(&tl_reentered, 0, __ATOMIC_RELAXED);
    tl_thread *t = tl_tls;
    if (t && t->gen == __atomic_load_n(&tl_gen, __ATOMIC_RELAXED)) __atomic_add_fetch(&t->reentered, n, __ATOMIC_RELAXED);
    else __atomic_add_fetch(&g.reentered_unreported, n, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tl_busy = 0; /* not tl_leave(): a count arriving now waits for the next call, no recursion */
}

tl_thread *tl_self_slow(void) {
    if (tl_writer_init() != 0) return NULL;
    tl_thread *old = tl_tls;
    if (old) { /* stale generation (cannot normally happen: fork frees them) */
        tl_tls = NULL;
        thread_destructor(old);
    }
    pthread_mutex_lock(&g.mu);
    if (g_lost && g.pid == getpid()) { pthread_mutex_unlock(&g.mu); return NULL; }
    if (g.fd < 0 || g.pid != getpid()) {
        if (g.state != 1 || open_file_locked() != 0) {
            if (g.state == 1 && !getenv("TELLER_SHIM_QUIET"))
                fprintf(stderr, "teller-shim: cannot create a trace file under %s/raw: %s; tracing disabled\n",
                        getenv("TELLER_TRACE_DIR") ? getenv("TELLER_TRACE_DIR") : "teller-traces", strerror(errno));
            g.state = -1;
            pthread_mutex_unlock(&g.mu);
            return NULL;
        }
    }
    tl_thread *t = calloc(1, sizeof *t);
    if (!t) { pthread_mutex_unlock(&g.mu); return NULL; }
    t->gen = tl_gen;
    t->tid = tl_gettid();
    t->next = g.threads;
    if (g.threads) g.threads->prev = t;
    g.threads = t;
    pthread_mutex_unlock(&g.mu);
    tl_tls = t;
    pthread_setspecific(g.key, t);
    char name[64] = {0};
    if (pthread_getname_np(pthread_self(), name, sizeof name) == 0 && name[0]) /* (cut by the kernel) */
        tl_write_thread_name(t, t->tid, name, tl_utf8_cut(name, strlen(name)));
    return t;
}

/* `count`: whether a refusal counts as a dropped record (not for a STRING: it is written later) */
static uint8_t *reserve_slow(tl_thread *t, size_t max, int count) {
    size_t len = t->next_chunk_len ? t->next_chunk_len : (g.chunk_size < 65536 ? g.chunk_size : 65536);
    if (max + 256 > len) { long pg = sysconf(_SC_PAGESIZE); len = (max + 256 + (size_t)pg - 1) / (size_t)pg * (size_t)pg; } /* room for DROPPED + CLOCK_SYNC first */
    if (TL_UNLIKELY(__atomic_load_n(&g.full_until, __ATOMIC_RELAXED) > tl_now())) {
        /* file full: no lock, no syscall, until the back-off ends. (`dropped` is an atomic counter: the
         * exiting thread collects every live thread's count, see tl_writer_finish) */
        if (count) __atomic_add_fetch(&t->dropped, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    pthread_mutex_lock(&g.mu);
    uint64_t off = g.next_off;
    if (TL_UNLIKELY(t->gen != tl_gen)) { /* stale thread state: never hand it a chunk of another file */
        pthread_mutex_unlock(&g.mu);
        if (count) __atomic_add_fetch(&t->dropped, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    int ok = grow_locked(off + len) == 0; /* grow_locked checks the descriptor */
    uint8_t *p = MAP_FAILED;
    if (ok) {
        g.next_off = off + len;
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, (off_t)off); /* under the lock: same fd as checked */
    } else {
        __atomic_store_n(&g.full_until, tl_now() + 1000000000ull, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g.mu);
    if (p == MAP_FAILED) {
        /* The chunk (if any) stays zero in the file: padding. Keep the old chunk for later, smaller records. */
        if (count) __atomic_add_fetch(&t->dropped, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    if (t->chunk) munmap(t->chunk, t->chunk_len);
    t->chunk = p;
    t->chunk_len = len;
    t->chunk_off = off;
    if (len < g.chunk_size) t->next_chunk_len = len * 2 < g.chunk_size ? len * 2 : g.chunk_size;
    t->pos = p;
    t->end = p + len;
    if (TL_UNLIKELY(__atomic_load_n(&t->dropped, __ATOMIC_RELAXED))) report_dropped(t);
    if (TL_UNLIKELY(t->reentered)) report_reentered(t);
    /* long runs: refresh the monotonic/realtime pair now and then (NTP moves realtime) */
    uint64_t last = __atomic_load_n(&g.last_sync, __ATOMIC_RELAXED), mono = tl_mono_ns();
    /* (`last` read first: another thread's later `last_sync` would make `mono - last` wrap) */
    if (mono >= last && mono - last >= g.sync_ns && __atomic_compare_exchange_n(&g.last_sync, &last, mono, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        /* the pair read back to back, in the HEADER's and the exit's order (the reader interpolates
         * between pairs: a delay between the two reads, such as the first write's page fault into
         * this fresh chunk, or the other order, would tilt the offset) */
        mono = tl_mono_ns();
        uint64_t real = realtime_ns();
        uint8_t *c = t->pos + 1;
        mp_uint(&c, TL_CLOCK_SYNC);
        mp_uint(&c, mono);
        mp_uint(&c, real);
        tl_commit(t, t->pos, c, 0x93);
    }
    if (TL_UNLIKELY(__atomic_load_n(&g.strs_pending, __ATOMIC_RELAXED))) write_pending_strings(t, max);
    return t->pos;
}

uint8_t *tl_reserve_slow(tl_thread *t, size_t max) { return reserve_slow(t, max, 1); }

static void report_dropped(tl_thread *t) {
    uint8_t *s = t->pos;
    if ((size_t)(t->end - s) < 64) return;
    uint64_t n = __atomic_exchange_n(&t->dropped, 0, __ATOMIC_RELAXED);
    if (!n) return; /* (collected at exit meanwhile) */
    uint8_t *c = s + 1;
    mp_uint(&c, TL_DROPPED);
    mp_uint(&c, n);
    mp_cstr(&c, "trace file full or unwritable");
    tl_commit(t, s, c, 0x93);
}

static void report_reentered(tl_thread *t) {
    uint8_t *s = t->pos;
    if ((size_t)(t->end - s) < 160) return; /* (up to 138 bytes: the reason is 120) */
    uint8_t *c = s + 1;
    mp_uint(&c, TL_DROPPED);
    mp_uint(&c, __atomic_exchange_n(&t->reentered, 0, __ATOMIC_RELAXED)); /* (tl_writer_finish may read it) */
    mp_cstr(&c, TL_REENTERED_REASON);
    tl_commit(t, s, c, 0x93);
}

static int strtab_grow_locked(void) {
    uint32_t ncap = g.strs_cap ? g.strs_cap * 2 : 1024;
    tl_gstr *n = calloc(ncap, sizeof *n);
    if (!n) return -1;
    for (uint32_t i = 0; i < g.strs_cap; i++) {
        tl_gstr *e = &g.strs[i];
        if (!e->text) continue;
        uint32_t j = e->hash & (ncap - 1);
        while (n[j].text) j = (j + 1) & (ncap - 1);
        n[j] = *e;
    }
    free(g.strs);
    g.strs = n;
    g.strs_cap = ncap;
    return 0;
}

/* The slot of `s` in the string table, or the empty slot where it would go (the table is never full). */
static tl_gstr *strtab_slot_locked(const char *s, uint32_t len, uint32_t h) {
    uint32_t j = h & (g.strs_cap - 1);
    while (g.strs[j].text && !(g.strs[j].hash == h && g.strs[j].len == len && memcmp(g.strs[j].text, s, len) == 0))
        j = (j + 1) & (g.strs_cap - 1);
    return &g.strs[j];
}

uint32_t tl_intern_slow(tl_thread *t, const char *s, uint32_t len, uint32_t h) {
    /* a name past the table's budget that this thread wrote lately, in this file (its STRING is
     * there): no lock. (Such a name never enters the table: within a file its counts only grow.) */
    tl_ocache_entry *oc = &t->ocache[h & (TL_OCACHE - 1)];
    if (oc->text && oc->hash == h && oc->len == len && memcmp(oc->text, s, len) == 0) return oc->sid;
    pthread_mutex_lock(&g.smu);
    if ((g.strs_count + 1) * 2 > g.strs_cap && strtab_grow_locked() != 0) {
        pthread_mutex_unlock(&g.smu);
        return 0;
    }
    tl_gstr *e = strtab_slot_locked(s, len, h);
    int fresh = 0;
    if (!e->text && (g.strs_count >= g.strs_max || g.strs_bytes + len + 1 > g.strs_bytes_max)) {
        /* over the budget: an id of its own and its STRING now, nothing kept (not cached either: the
         * text is the caller's). A STRING the file refuses leaves the id undefined: the reader names
         * it "<string #N>" and says so (the file is full; its records are being dropped too). */
        uint32_t sid = g.next_sid++;
        int say = !g.strs_over_said;
        g.strs_over_said = 1;
        uint32_t count = g.strs_count;
        pthread_mutex_unlock(&g.smu);
        if (say)
            tl_diag(TL_WARN, "the string table holds %u names (TELLER_MAX_NAMES / TELLER_NAMES_MB): a name seen for "
                    "the first time from now on is written with each use, not kept (a few per thread are)", count);
        size_t need = (size_t)len + 32;
        uint8_t *r = TL_LIKELY((size_t)(t->end - t->pos) >= need) ? t->pos : reserve_slow(t, need, 0);
        if (r) {
            uint8_t *c = r + 1;
            mp_uint(&c, TL_STRING);
            mp_uint(&c, sid);
            mp_str(&c, s, len);
            tl_commit(t, r, c, 0x93);
            char *copy = malloc((size_t)len + 1);
            if (copy) {
                memcpy(copy, s, len);
                copy[len] = 0;
                /* (the slot is emptied before its old text is freed and filled before its text is
                 * set: a fork by another thread meanwhile leaves the child nothing to free twice) */
                char *old = oc->text;
                __atomic_store_n(&oc->text, NULL, __ATOMIC_RELEASE);
                free(old);
                oc->len = len;
                oc->hash = h;
                oc->sid = sid;
                __atomic_store_n(&oc->text, copy, __ATOMIC_RELEASE);
            }
        }
        return sid;
    }
    if (!e->text) {
        char *copy = malloc((size_t)len + 1);
        if (!copy) { pthread_mutex_unlock(&g.smu); return 0; }
        memcpy(copy, s, len);
        copy[len] = 0;
        e->text = copy;
        e->len = len;
        e->hash = h;
        e->sid = g.next_sid++;
        e->written = 0;
        g.strs_count++;
        g.strs_bytes += (uint64_t)len + 1;
        fresh = 1;
    }
    uint8_t was = e->written;
    /* a pending string is tried again at its use only once the file takes records again (until then
     * it waits for the next chunk hand-out or the exit, and costs no lock-and-fail per use) */
    if (was == 0 && !fresh && __atomic_load_n(&g.full_until, __ATOMIC_RELAXED) > tl_now()) was = 1;
    if (was == 0) {
        e->written = 1; /* this thread writes it */
        if (!fresh) g.strs_pending--;
    }
    tl_scache_entry ce = {e->text, e->len, e->hash, e->sid};
    uint32_t gen = __atomic_load_n(&tl_gen, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g.smu);
    if (was == 1) return ce.sid; /* being written by another thread, or pending: not cached */
    if (was == 0) {
        /* (a refusal here is not a dropped record: the STRING is written later) */
        size_t need = (size_t)len + 32;
        uint8_t *r = TL_LIKELY((size_t)(t->end - t->pos) >= need) ? t->pos : reserve_slow(t, need, 0);
        if (r) {
            uint8_t *c = r + 1;
            mp_uint(&c, TL_STRING);
            mp_uint(&c, ce.sid);
            mp_str(&c, ce.text, ce.len);
            tl_commit(t, r, c, 0x93);
        }
        pthread_mutex_lock(&g.smu);
        /* (a fork from a signal handler since the first section: the string table is the child's, and
         * is left alone; `t` was freed there, which this frame cannot undo: a handler that forks while
         * the shim runs on its thread is not supported) */
        if (__atomic_load_n(&tl_gen, __ATOMIC_RELAXED) != gen) {
            pthread_mutex_unlock(&g.smu);
            return 0;
        }
        e = strtab_slot_locked(ce.text, ce.len, h); /* (another thread may have grown the table) */
        if (e->text) {
            e->written = r ? 2 : 0;
            if (!r) g.strs_pending++;
        }
        pthread_mutex_unlock(&g.smu);
        /* A failed reservation (file full, or growth refused for a while) leaves the string pending
         * and uncached. An event smaller than it may still fit the chunk's tail and name it: the
         * STRING follows in the next chunk this process hands out, at the next use once the file
         * takes records, or in the exit's tail (readers resolve ids against every STRING in the
         * file, wherever it lies). */
        if (!r) return ce.sid;
    }
    t->scache[h & (TL_SCACHE - 1)] = ce;
    return ce.sid;
}

/* Pending STRINGs (their first reservation failed) written into `t`'s fresh chunk as far as they fit,
 * leaving `keep` bytes for the record the chunk was taken for. (A scan of the table per chunk hand-out
 * while any is pending: a few microseconds for thousands of names; one too long for a chunk waits for
 * its next use, whose reservation is sized for it, or for the exit.) */
static void write_pending_strings(tl_thread *t, size_t keep) {
    pthread_mutex_lock(&g.smu);
    for (uint32_t i = 0; i < g.strs_cap && g.strs_pending; i++) {
        tl_gstr *e = &g.strs[i];
        if (!e->text || e->written != 0) continue;
        if ((size_t)(t->end - t->pos) < keep + (size_t)e->len + 32) continue;
        uint8_t *c = t->pos + 1;
        mp_uint(&c, TL_STRING);
        mp_uint(&c, e->sid);
        mp_str(&c, e->text, e->len);
        tl_commit(t, t->pos, c, 0x93);
        e->written = 2;
        g.strs_pending--;
    }
    pthread_mutex_unlock(&g.smu);
}

/* The pending STRINGs encoded for the exit's tail (malloc'd, *len bytes; NULL: none or no memory), at
 * most TL_TAIL_STRINGS bytes of them: most were named only by records the full file refused, and the
 * tail must not take the file far past its cap. */
#define TL_TAIL_STRINGS (1u << 20)
static uint8_t *pending_strings_tail(size_t *len) {
    *len = 0;
    pthread_mutex_lock(&g.smu);
    size_t total = 0;
    for (uint32_t i = 0; i < g.strs_cap && g.strs_pending; i++)
        if (g.strs[i].text && g.strs[i].written == 0) total += (size_t)g.strs[i].len + 32;
    if (total > TL_TAIL_STRINGS) total = TL_TAIL_STRINGS;
    uint8_t *buf = total ? malloc(total) : NULL;
    uint8_t *c = buf;
    for (uint32_t i = 0; buf && i < g.strs_cap; i++) {
        tl_gstr *e = &g.strs[i];
        if (!e->text || e->written != 0) continue;
        if ((size_t)(c - buf) + (size_t)e->len + 32 > total) continue; /* (over the budget: left out) */
        mp_arr(&c, 3);
        mp_uint(&c, TL_STRING);
        mp_uint(&c, e->sid);
        mp_str(&c, e->text, e->len);
        e->written = 2; /* (if the tail cannot be written, nothing more can be) */
        g.strs_pending--;
    }
    pthread_mutex_unlock(&g.smu);
    *len = buf ? (size_t)(c - buf) : 0;
    return buf;
}

tl_name *tl_name_new(const char *s, uint32_t magic) {
    tl_name *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    size_t len = s ? strlen(s) : 0;
    if (len > TL_MAX_STR) len = tl_utf8_cut(s, TL_MAX_STR);
    n->text = malloc(len + 1);
    if (!n->text) { free(n); return NULL; }
    if (len) memcpy(n->text, s, len);
    n->text[len] = 0;
    n->len = (uint32_t)len;
    n->hash = tl_hash(n->text, n->len);
    n->magic = magic;
    return n;
}

uint32_t tl_intern_name(tl_thread *t, tl_name *n) {
    uint64_t c = __atomic_load_n(&n->cache, __ATOMIC_RELAXED);
    if (TL_LIKELY((uint32_t)(c >> 32) == t->gen && (uint32_t)c != 0)) return (uint32_t)c;
    uint32_t sid = tl_intern(t, n->text, n->len);
    const tl_scache_entry *e = &t->scache[n->hash & (TL_SCACHE - 1)];
    if (sid && e->sid == sid && e->hash == n->hash) /* (cached only once its STRING is in the file) */
        __atomic_store_n(&n->cache, ((uint64_t)t->gen << 32) | sid, __ATOMIC_RELAXED);
    return sid;
}

void tl_write_thread_name(tl_thread *t, uint32_t tid, const char *name, size_t len) {
    uint32_t sid = tl_intern(t, name, len);
    uint8_t *r = tl_reserve(t, 32);
    if (!r) return;
    uint8_t *c = r + 1;
    mp_uint(&c, TL_THREAD_NAME);
    mp_uint(&c, tid);
    mp_uint(&c, sid);
    tl_commit(t, r, c, 0x93);
}

void tl_diag(int severity, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g.verbose || severity >= TL_ERROR) {
        if (g.verbose || getenv("TELLER_SHIM_QUIET") == NULL)
            fprintf(stderr, "teller-shim: %s\n", msg);
    }
    tl_thread *t = tl_self();
    if (!t) return;
    size_t len = tl_utf8_cut(msg, strlen(msg)); /* (vsnprintf's cut) */
    uint8_t *r = tl_reserve(t, len + 32);
    if (!r) return;
    uint8_t *c = r + 1;
    mp_uint(&c, TL_DIAG);
    mp_uint(&c, tl_now());
    mp_uint(&c, (uint64_t)severity);
    mp_str(&c, msg, len);
    tl_commit(t, r, c, 0x94);
}

void tl_header_set_cupti(uint32_t version, const char *error) {
    if (tl_self() == NULL) return; /* makes sure the file exists */
    pthread_mutex_lock(&g.mu);
    if (version) g.cupti_version = version;
    if (error && !g.cupti_error[0]) snprintf(g.cupti_error, sizeof g.cupti_error, "%s", error);
    if (fd_ok_locked()) write_header_locked(0);
    pthread_mutex_unlock(&g.mu);
}

void tl_header_add_device(const tl_device_props *d) {
    if (!d || !d->name[0] || tl_self() == NULL) return; /* tl_self makes sure the file exists */
    pthread_mutex_lock(&g.mu);
    uint32_t at = 0;
    while (at < g.n_devs && g.devs[at].id < d->id) at++;
    if ((at == g.n_devs || g.devs[at].id != d->id) && g.n_devs < TL_MAX_DEVICES) {
        memmove(&g.devs[at + 1], &g.devs[at], (g.n_devs - at) * sizeof g.devs[0]);
        g.devs[at] = *d;
        g.devs[at].name[sizeof g.devs[at].name - 1] = 0;
        g.n_devs++;
        if (fd_ok_locked()) write_header_locked(0);
    }
    pthread_mutex_unlock(&g.mu);
}

/* At exit: write pending STRINGs, report drops, add a CLOCK_SYNC, and cut the file after the last
 * handed-out chunk.
 * Threads may still be running: their chunks all lie below next_off, so the cut is safe. */
void tl_writer_finish(void) {
    if (g.state != 1 || g.fd < 0 || g.pid != getpid()) return;
    tl_thread *t = tl_tls;
    uint64_t d = 0, re = __atomic_exchange_n(&tl_reentered, 0, __ATOMIC_RELAXED);
    if (t && t->gen == tl_gen) d += __atomic_exchange_n(&t->dropped, 0, __ATOMIC_RELAXED);
    /* every live thread's counts too (threads still running at exit may never take another chunk: a
     * full file hands out none, so their drops would go unreported), and the ended threads' totals,
     * read under the lock a thread's destructor moves its counts under */
    pthread_mutex_lock(&g.mu);
    for (tl_thread *x = g.threads; x; x = x->next)
        if (x->gen == tl_gen) {
            re += __atomic_exchange_n(&x->reentered, 0, __ATOMIC_RELAXED);
            d += __atomic_exchange_n(&x->dropped, 0, __ATOMIC_RELAXED);
        }
    d += __atomic_exchange_n(&g.dropped_unreported, 0, __ATOMIC_RELAXED);
    re += __atomic_exchange_n(&g.reentered_unreported, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g.mu);
    /* The tail records go straight to the end of the file (pwrite after the last chunk), so they are
     * written even when the file is at its size cap and no chunk has room. */
    uint8_t buf[256];
    uint8_t *c = buf;
    if (d) {
        mp_arr(&c, 3);
        mp_uint(&c, TL_DROPPED);
        mp_uint(&c, d);
        mp_cstr(&c, "trace file full or unwritable");
    }
    if (re) {
        mp_arr(&c, 3);
        mp_uint(&c, TL_DROPPED);
        mp_uint(&c, re);
        mp_cstr(&c, TL_REENTERED_REASON);
    }
    mp_arr(&c, 3);
    mp_uint(&c, TL_CLOCK_SYNC);
    mp_uint(&c, tl_mono_ns());
    mp_uint(&c, realtime_ns());
    size_t len = (size_t)(c - buf), slen = 0;
    uint8_t *strs = pending_strings_tail(&slen); /* (names whose STRING no chunk could take) */
    pthread_mutex_lock(&g.mu);
    if (fd_ok_locked()) {
        uint64_t end = g.next_off;
        if (slen && pwrite(g.fd, strs, slen, (off_t)end) == (ssize_t)slen) end += slen;
        if (pwrite(g.fd, buf, len, (off_t)end) == (ssize_t)len) end += len;
        if (end != g.size && ftruncate(g.fd, (off_t)end) == 0) g.size = end;
        /* later chunks (threads still running) must start page aligned, after the tail */
        long pg = sysconf(_SC_PAGESIZE);
        g.next_off = (end + (uint64_t)pg - 1) / (uint64_t)pg * (uint64_t)pg;
    }
    pthread_mutex_unlock(&g.mu);
    free(strs);
}
