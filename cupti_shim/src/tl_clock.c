#define _GNU_SOURCE
#include "tl_clock.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

tl_clk_t tl_clk;
int tl_clock_tsc;

#ifdef TL_HAVE_TSC
static int g_lock;
static uint64_t g_cal_tsc, g_cal_ns; /* previous anchor, for the rate */

#define TL_CLK_FIRST_NS 20000000ull  /* first calibration after 20 ms */
#define TL_CLK_PERIOD_NS 50000000ull /* then re-anchor every 50 ms */

/* a (tsc, ns) pair read back to back: the tightest of three tries */
static void read_pair(uint64_t *tsc, uint64_t *ns) {
    uint64_t best = ~0ull;
    *tsc = __rdtsc();
    *ns = tl_mono_ns();
    for (int i = 0; i < 3; i++) {
        uint64_t a = __rdtsc();
        uint64_t n = tl_mono_ns();
        uint64_t b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            *tsc = a + (b - a) / 2;
            *ns = n;
        }
    }
}

uint64_t tl_now_slow(void) {
    if (__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE) != 0) return tl_mono_ns();
    uint64_t tsc = 0, ns = 0;
    read_pair(&tsc, &ns);
    uint64_t need = g_cal_ns && __atomic_load_n(&tl_clk.mult, __ATOMIC_RELAXED) ? TL_CLK_PERIOD_NS : TL_CLK_FIRST_NS;
    if (g_cal_ns == 0 || g_cal_tsc == 0 || tsc <= g_cal_tsc) { /* (a half-stored pair: anchor again) */
        g_cal_tsc = tsc;
        g_cal_ns = ns;
    } else if (ns - g_cal_ns >= need) {
        uint64_t mult = (uint64_t)((((unsigned __int128)(ns - g_cal_ns)) << 32) / (tsc - g_cal_tsc));
        uint64_t period_ticks = (uint64_t)((((unsigned __int128)TL_CLK_PERIOD_NS) << 32) / (mult ? mult : 1));
        __atomic_store_n(&tl_clk.seq, tl_clk.seq + 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        __atomic_store_n(&tl_clk.tsc0, tsc, __ATOMIC_RELAXED);
        __atomic_store_n(&tl_clk.ns0, ns, __ATOMIC_RELAXED);
        __atomic_store_n(&tl_clk.mult, mult, __ATOMIC_RELAXED);
        __atomic_store_n(&tl_clk.next_tsc, tsc + period_ticks, __ATOMIC_RELAXED);
        __atomic_store_n(&tl_clk.seq, tl_clk.seq + 1, __ATOMIC_RELEASE);
        g_cal_tsc = tsc;
        g_cal_ns = ns;
    }
    __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE);
    return ns;
}

void tl_clock_fork_child(void) {
    /* (only the forking thread runs here: no reader or writer to race with) */
    if (tl_clk.seq & 1) { /* torn by the fork: recalibrate from scratch */
        tl_clk.mult = 0;
        tl_clk.next_tsc = 0;
        tl_clk.seq++;
    }
    /* a calibration under way may have stored one of the previous anchor's two halves: a new anchor
     * (the published map stays, consistent) */
    if (g_lock) g_cal_tsc = g_cal_ns = 0;
    __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE);
}

#ifdef TL_CLOCK_TESTING
void tl_clock_test_hold_lock(void) {
    __atomic_store_n(&g_lock, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&tl_clk.seq, tl_clk.seq | 1, __ATOMIC_RELAXED);
}
#endif

static int file_has(const char *path, const char *word) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    static char buf[1 << 16];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strstr(buf, word) != NULL;
}

void tl_clock_init(void) {
    const char *m = getenv("TELLER_CLOCK");
    if (m && strcmp(m, "gettime") == 0) return;
    /* only where the kernel trusts the TSC as its own clocksource */
    if (!file_has("/sys/devices/system/clocksource/clocksource0/current_clocksource", "tsc")) return;
    if (!file_has("/proc/cpuinfo", "constant_tsc") || !file_has("/proc/cpuinfo", "nonstop_tsc")) return;
    tl_clk.next_tsc = 0; /* uncalibrated: every read takes the slow path until the first anchor */
    tl_clock_tsc = 1;
}
#else
uint64_t tl_now_slow(void) { return tl_mono_ns(); }
void tl_clock_init(void) {}
void tl_clock_fork_child(void) {}
#ifdef TL_CLOCK_TESTING
void tl_clock_test_hold_lock(void) {}
#endif
#endif
