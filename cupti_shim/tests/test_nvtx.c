/* NVTX scenarios for the shim. The program uses the header-only NVTX v3 API; NVTX loads the shim
 * through NVTX_INJECTION64_PATH. It prints one JSON line of facts (tids, pids) that check_raw.py
 * compares with the decoded trace. Usage: test_nvtx SCENARIO [READY_FILE] */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define NTHREADS 4
#define ITERS 1000

static unsigned tid(void) { return (unsigned)syscall(SYS_gettid); }

static nvtxDomainHandle_t g_dom;
static nvtxRangeId_t g_cross_id;
static pthread_barrier_t g_bar;
static unsigned g_worker_tids[NTHREADS];
static unsigned g_ender_tid;

static void *worker(void *arg) {
    int idx = (int)(intptr_t)arg;
    g_worker_tids[idx] = tid();
    char name[64];
    snprintf(name, sizeof name, "worker-%d", idx);
    nvtxNameOsThreadA(tid(), name);
    for (int i = 0; i < ITERS; i++) {
        char l0[32], l1[32];
        snprintf(l0, sizeof l0, "w%d-outer", idx);
        snprintf(l1, sizeof l1, "w%d-inner-%d", idx, i % 3);
        nvtxRangePushA(l0);
        nvtxRangePushA(l1);
        nvtxRangePushA("leaf");
        nvtxRangePop();
        nvtxRangePop();
        nvtxRangePop();
    }
    if (idx == 0) {
        /* end a range started on the main thread */
        pthread_barrier_wait(&g_bar);
        g_ender_tid = tid();
        nvtxRangeEnd(g_cross_id);
    }
    return NULL;
}

static void scenario_basic(void) {
    nvtxNameOsThreadA(tid(), "main-thread");
    nvtxRangePushA("outer");
    nvtxRangePushA("inner");
    nvtxMarkA("mark-a");
    nvtxRangePop();
    nvtxRangePop();

    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = 0xFF00FF00u;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = -42;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = "colored";
    nvtxRangePushEx(&a);
    nvtxRangePop();
    nvtxMarkEx(&a);

    g_dom = nvtxDomainCreateA("my-domain");
    nvtxStringHandle_t reg = nvtxDomainRegisterStringA(g_dom, "registered-name");
    nvtxEventAttributes_t b = {0};
    b.version = NVTX_VERSION;
    b.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    b.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    b.message.registered = reg;
    nvtxRangePushA("default-outer");
    nvtxDomainRangePushEx(g_dom, &b);
    nvtxDomainRangePushEx(g_dom, &b);
    nvtxDomainRangePop(g_dom);
    nvtxDomainRangePop(g_dom);
    nvtxRangePop();
    nvtxDomainMarkEx(g_dom, &b);
    nvtxRangeId_t dr = nvtxDomainRangeStartEx(g_dom, &b);
    nvtxDomainRangeEnd(g_dom, dr);

    a.message.ascii = "cross-thread";
    a.colorType = NVTX_COLOR_UNKNOWN;
    a.payloadType = NVTX_PAYLOAD_UNKNOWN;
    g_cross_id = nvtxRangeStartEx(&a);

    pthread_barrier_init(&g_bar, NULL, 2);
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    pthread_barrier_wait(&g_bar);
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);

    printf("{\"pid\": %d, \"main_tid\": %u, \"ender_tid\": %u, \"worker_tids\": [%u, %u, %u, %u], \"iters\": %d}\n",
           (int)getpid(), tid(), g_ender_tid, g_worker_tids[0], g_worker_tids[1], g_worker_tids[2], g_worker_tids[3], ITERS);
}

/* Names whose STRING record could not be written while the file refused to grow (RLIMIT_FSIZE stands
 * in for a full disk) must still reach the file: at their next use once it grows again (`fresh`, and a
 * registered string), at the next chunk this process takes (`only-while-full-A`, used once), or in the
 * exit's tail (`only-while-full-B`, used once while the file stays full to the end).
 * Run with TELLER_GROW_MB=0 TELLER_CHUNK_KB=64: every chunk after the first needs the file to grow. */
static void fill_refused(void) {
    struct rlimit lim;
    getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 4096;
    setrlimit(RLIMIT_FSIZE, &lim);
    for (int i = 0; i < 20000; i++) { nvtxRangePushA("filler"); nvtxRangePop(); } /* the chunk fills */
}

/* `prefix` then 'n's: 200 bytes, so that its STRING (232 reserved) never fits the tail a refused range
 * (128 reserved) leaves */
static const char *long_name(char *buf, const char *prefix) {
    memset(buf, 'n', 200);
    memcpy(buf, prefix, strlen(prefix));
    buf[200] = 0;
    return buf;
}

static void scenario_transient_full(void) {
    signal(SIGXFSZ, SIG_IGN); /* growth past the limit fails with EFBIG instead of killing the process */
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    nvtxDomainHandle_t dom = nvtxDomainCreateA("transient");
    nvtxRangePushA("before-full");
    nvtxRangePop();
    fill_refused();
    char fresh[201], name_a[201], name_b[201];
    long_name(fresh, "fresh-");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = nvtxDomainRegisterStringA(dom, "registered-while-full");
    nvtxRangePushA(fresh); /* their STRINGs do not fit: dropped with the ranges, pending */
    nvtxRangePop();
    nvtxDomainRangePushEx(dom, &a);
    nvtxDomainRangePop(dom);
    nvtxMarkA(long_name(name_a, "only-while-full-A"));
    setrlimit(RLIMIT_FSIZE, &old);
    usleep(1100000); /* the shim's back-off after a refused growth (1 s) */
    nvtxRangePushA(fresh);
    nvtxRangePop();
    nvtxDomainRangePushEx(dom, &a);
    nvtxDomainRangePop(dom);
    fill_refused(); /* full again, to the end */
    nvtxMarkA(long_name(name_b, "only-while-full-B"));
    setrlimit(RLIMIT_FSIZE, &old); /* (the exit's tail may be written) */
    printf("{\"pid\": %d}\n", (int)getpid());
}

static void scenario_fork(void) {
    nvtxRangePushA("parent-before-fork");
    nvtxRangePushA("parent-open-at-fork");
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        nvtxRangePushA("child-range");
        nvtxMarkA("child-mark");
        nvtxRangePop();
        nvtxRangePop(); /* inherited range: must not write into the parent's file */
        _exit(0);
    }
    nvtxRangePop();
    nvtxRangePop();
    int st = 0;
    waitpid(c, &st, 0);
    pid_t c2 = fork(); /* a second child that exits normally (atexit runs) */
    if (c2 == 0) {
        nvtxRangePushA("child2-range");
        nvtxRangePop();
        exit(0);
    }
    waitpid(c2, &st, 0);
    printf("{\"pid\": %d, \"child\": %d, \"child2\": %d}\n", (int)getpid(), (int)c, (int)c2);
}

static void *spinner(void *arg) {
    (void)arg;
    nvtxNameOsThreadA(tid(), "spinner");
    nvtxRangePushA("spinner-open");
    for (;;) {
        nvtxRangePushA("spin");
        nvtxRangePop();
    }
    return NULL;
}

/* crash scenarios: complete some ranges, leave "doomed" open, then die */
static void scenario_crash(const char *how, const char *ready) {
    for (int i = 0; i < 100; i++) {
        nvtxRangePushA("done");
        nvtxRangePop();
    }
    nvtxMarkA("before-death");
    nvtxRangePushA("doomed");
    printf("{\"pid\": %d, \"main_tid\": %u}\n", (int)getpid(), tid());
    fflush(stdout);
    if (strcmp(how, "exit") == 0) _exit(3);
    if (strcmp(how, "segv") == 0) {
        signal(SIGSEGV, SIG_DFL);
        volatile int *volatile bad = NULL;
        *bad = 1;
    }
    if (strcmp(how, "abort") == 0) abort();
    /* kill / term: wait to be killed by the driver script, with a second thread writing records */
    pthread_t th;
    pthread_create(&th, NULL, spinner, NULL);
    usleep(200000);
    if (ready) {
        FILE *f = fopen(ready, "w");
        if (f) fclose(f);
    }
    for (;;) pause();
}

/* ---- signal handlers that call NVTX ---- */

/* Deterministic: the name a push or mark reads ends on a PROT_NONE page, so the shim faults while
 * it is inside the callback (reentrancy guard set). The SIGSEGV handler calls NVTX (which must be
 * refused, not recorded), then makes the page readable and the shim's read is retried. */
static char *g_page;
static size_t g_pagesz;
static volatile sig_atomic_t g_faults;
static volatile int g_handler_push_ret = 99;

static void segv_handler(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    if ((char *)si->si_addr < g_page + g_pagesz || (char *)si->si_addr >= g_page + 2 * g_pagesz) {
        signal(SIGSEGV, SIG_DFL); /* a real crash */
        return;
    }
    g_handler_push_ret = nvtxRangePushA("from-handler");
    nvtxMarkA("handler-mark");
    nvtxRangePop();
    mprotect(g_page + g_pagesz, g_pagesz, PROT_READ | PROT_WRITE);
    g_faults++;
}

static char *name_across_pages(const char *name) {
    size_t n = strlen(name);
    char *p = g_page + g_pagesz - n / 2; /* the first half on the readable page */
    memcpy(p, name, n + 1);
    mprotect(g_page + g_pagesz, g_pagesz, PROT_NONE);
    return p;
}

static void scenario_signal_inside(void) {
    g_pagesz = (size_t)sysconf(_SC_PAGESIZE);
    g_page = mmap(NULL, 2 * g_pagesz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g_page == MAP_FAILED) exit(2);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    nvtxRangePushA("before");
    nvtxRangePop();
    nvtxRangePushA(name_across_pages("pushed-across-a-page")); /* fault 1: inside the push */
    int push_ret = g_handler_push_ret;
    nvtxMarkA(name_across_pages("marked-across-a-page"));     /* fault 2: inside the mark */
    nvtxRangePop();
    nvtxRangePushA("from-handler"); /* the same name, from the program: recorded */
    nvtxRangePop();
    printf("{\"pid\": %d, \"faults\": %d, \"handler_push_ret\": %d}\n", (int)getpid(), (int)g_faults, push_ret);
}

/* Statistical: a 20 us interval timer whose handler pushes, marks and pops, while the main thread
 * spends nearly all its time inside the shim (new strings now and then: the string table's lock; new
 * chunks: the writer lock and mmap). Without the guard the handler writes over records in progress
 * or deadlocks on a lock its thread holds. */
static volatile sig_atomic_t g_alarms;

static void alarm_handler(int sig) {
    (void)sig;
    nvtxRangePushA("sig");
    nvtxMarkA("sig-mark");
    nvtxRangePop();
    g_alarms++;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void scenario_signal_storm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = alarm_handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    long iters = 0;
    double t0 = now_s();
    char name[32];
    while (now_s() - t0 < 0.6) {
        for (int k = 0; k < 256; k++, iters++) {
            snprintf(name, sizeof name, "n%ld", iters % 5000);
            nvtxRangePushA(name);
            nvtxRangePushA("leaf");
            nvtxMarkA("main-mark");
            nvtxRangePop();
            nvtxRangePop();
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("{\"pid\": %d, \"main_tid\": %u, \"alarms\": %d, \"iters\": %ld}\n", (int)getpid(), tid(), (int)g_alarms, iters);
}

/* strings cut at a byte limit end on a character: a range name past 64 KiB (2-byte characters), a
 * mark message (4-byte ones), a mark's domain past 200 bytes, a thread name the kernel cut at 15 */
static void *utf8_thread(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "abcdefghijklmn\xc3\xa9"); /* 16 bytes: the kernel keeps 15, half of the e-acute */
    nvtxRangePushA("named"); /* (the shim reads the name when the thread first calls it) */
    nvtxRangePop();
    return NULL;
}

static void scenario_utf8(void) {
    size_t n2 = 40000, n4 = 20000;
    char *two = malloc(2 * n2 + 1), *four = malloc(2 + 4 * n4 + 1), dname[302];
    for (size_t i = 0; i < n2; i++) memcpy(two + 2 * i, "\xc3\xa9", 2);
    two[2 * n2] = 0;
    memcpy(four, "ab", 2);
    for (size_t i = 0; i < n4; i++) memcpy(four + 2 + 4 * i, "\xf0\x9f\x98\x80", 4);
    four[2 + 4 * n4] = 0;
    dname[0] = 'x';
    for (int i = 0; i < 150; i++) memcpy(dname + 1 + 2 * i, "\xc3\xa9", 2);
    dname[301] = 0;
    nvtxRangePushA(two);
    nvtxRangePop();
    nvtxDomainHandle_t dom = nvtxDomainCreateA(dname);
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = four;
    nvtxDomainMarkEx(dom, &a);
    pthread_t th;
    pthread_create(&th, NULL, utf8_thread, NULL);
    pthread_join(th, NULL);
    free(two);
    free(four);
    printf("{\"pid\": %d}\n", (int)getpid());
}

/* more distinct names than the string table keeps (run with TELLER_MAX_NAMES=1024): each range
 * still reads its own name, a name past the budget used twice included */
static void scenario_names(void) {
    char name[64];
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "aten::add, seq = %d", i);
        nvtxRangePushA(name);
        nvtxRangePop();
    }
    nvtxRangePushA("aten::add, seq = 4999"); /* (again: past the budget, the thread's own copy) */
    nvtxRangePop();
    printf("{\"pid\": %d}\n", (int)getpid());
}

/* category names: the default domain's and a domain's own (numbered per domain, as the Python
 * `nvtx` package does), a category never named, and a name past the 31 bytes kept */
static void scenario_category(void) {
    nvtxNameCategoryA(1, "io");
    nvtxDomainHandle_t d = nvtxDomainCreateA("mydom");
    nvtxDomainNameCategoryA(d, 1, "compute");
    nvtxDomainNameCategoryA(d, 2, "a-category-name-longer-than-thirty-one-bytes");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.category = 1;
    a.message.ascii = "default-1";
    nvtxRangePushEx(&a);
    nvtxRangePop();
    a.message.ascii = "dom-1";
    nvtxDomainRangePushEx(d, &a);
    nvtxDomainRangePop(d);
    a.category = 2;
    a.message.ascii = "dom-2";
    nvtxDomainMarkEx(d, &a);
    a.category = 3;
    a.message.ascii = "default-3";
    nvtxRangePushEx(&a);
    nvtxRangePop();
    printf("{\"pid\": %d}\n", (int)getpid());
}

/* the wide-character (W) entry points and Unicode messages: recorded as UTF-8, and a RangePushW
 * nests as a RangePushA does (it was dropped while its pop still ended the range below it) */
static void scenario_wide(void) {
    nvtxRangePushA("outer");
    nvtxRangePushW(L"inner-\u00e9");
    nvtxRangePop();
    nvtxRangePushA("sibling");
    nvtxRangePop();
    nvtxRangePop();
    nvtxMarkW(L"mark-\U0001F600");
    nvtxRangeId_t id = nvtxRangeStartW(L"started-w");
    nvtxRangeEnd(id);
    nvtxNameOsThreadW(tid(), L"wide-thread");
    nvtxDomainHandle_t d = nvtxDomainCreateW(L"wide-dom");
    nvtxStringHandle_t h = nvtxDomainRegisterStringW(d, L"registered-w");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = h;
    nvtxDomainRangePushEx(d, &a);
    nvtxDomainRangePop(d);
    a.messageType = NVTX_MESSAGE_TYPE_UNICODE;
    a.message.unicode = L"caf\u00e9";
    nvtxRangePushEx(&a);
    nvtxRangePop();
    printf("{\"pid\": %d}\n", (int)getpid());
}

/* 200k push/pop pairs, then on until the process exits (exit runs while it still writes) */
static int many_done;
static void *many_thread(void *arg) {
    (void)arg;
    for (long i = 1;; i++) {
        nvtxRangePushA("many");
        nvtxRangePop();
        if (i == 200000) __atomic_store_n(&many_done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *s = argc > 1 ? argv[1] : "basic";
    if (strcmp(s, "basic") == 0) scenario_basic();
    else if (strcmp(s, "fork") == 0) scenario_fork();
    else if (strcmp(s, "wide") == 0) scenario_wide();
    else if (strcmp(s, "names") == 0) scenario_names();
    else if (strcmp(s, "category") == 0) scenario_category();
    else if (strcmp(s, "closefd") == 0 && argc > 2) {
        /* a program that closes every descriptor and reuses the numbers must never see its files
         * extended, written or truncated by the shim */
        nvtxRangePushA("before-close");
        nvtxRangePop();
        for (int fd = 3; fd < 1024; fd++) close(fd);
        FILE *uf[8];
        for (int i = 0; i < 8; i++) { /* take the low descriptor numbers, including the shim's old one */
            char path[4096];
            snprintf(path, sizeof path, "%s.%d", argv[2], i);
            uf[i] = fopen(path, "w");
            if (!uf[i]) return 2;
            fputs("USERDATA", uf[i]);
            fflush(uf[i]);
        }
        for (int i = 0; i < 100000; i++) { nvtxRangePushA("after-close"); nvtxRangePop(); } /* needs new chunks */
        for (int i = 0; i < 8; i++) fclose(uf[i]);
        printf("{\"pid\": %d}\n", (int)getpid());
    }
    else if (strcmp(s, "instances") == 0 && argc > 2) { /* two NVTX instances in one process */
        nvtxRangePushA("exe-range");
        void *lib = dlopen(argv[2], RTLD_NOW);
        void (*work)(int) = NULL;
        if (!lib || !(*(void **)&work = dlsym(lib, "nvtx_user_lib_work"))) { fprintf(stderr, "%s\n", dlerror()); return 2; }
        work(10);
        nvtxRangePop();
        nvtxRangePushA("lib-range"); /* same name from the other instance: one STRING */
        nvtxRangePop();
        printf("{\"pid\": %d}\n", (int)getpid());
    }
    else if (strcmp(s, "deep") == 0) { /* nesting deeper than the shim tracks */
        for (int i = 0; i < 1500; i++) nvtxRangePushA("deep");
        for (int i = 0; i < 1500; i++) nvtxRangePop();
        nvtxRangePushA("after-deep");
        nvtxRangePop();
        printf("{\"pid\": %d}\n", (int)getpid());
    }
    else if (strcmp(s, "many") == 0) { /* volume: 200k push/pop pairs (~10 MB) */
        for (int i = 0; i < 200000; i++) { nvtxRangePushA("many"); nvtxRangePop(); }
        printf("{\"pid\": %d}\n", (int)getpid());
    }
    else if (strcmp(s, "many-thread") == 0) { /* the volume on a thread still running at exit */
        pthread_t th;
        pthread_create(&th, NULL, many_thread, NULL);
        while (!__atomic_load_n(&many_done, __ATOMIC_ACQUIRE)) usleep(1000);
        printf("{\"pid\": %d}\n", (int)getpid());
    }
    else if (strcmp(s, "transient-full") == 0) scenario_transient_full();
    else if (strcmp(s, "utf8") == 0) scenario_utf8();
    else if (strcmp(s, "signal-inside") == 0) scenario_signal_inside();
    else if (strcmp(s, "signal-storm") == 0) scenario_signal_storm();
    else if (strncmp(s, "crash-", 6) == 0) scenario_crash(s + 6, argc > 2 ? argv[2] : NULL);
    else { fprintf(stderr, "unknown scenario %s\n", s); return 2; }
    return 0;
}
