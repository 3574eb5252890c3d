/* CLOCK_MONOTONIC nanoseconds, cheaply. clock_gettime costs ~26 ns on some VMs; where the kernel
 * itself uses an invariant TSC as its clocksource, the shim reads the TSC (~10 ns) and converts it
 * with a linear map re-anchored to clock_gettime every 50 ms (error well under a microsecond), under
 * a seqlock. TELLER_CLOCK=gettime forces clock_gettime. */
#ifndef TL_CLOCK_H
#define TL_CLOCK_H
#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define TL_HAVE_TSC 1
#endif

typedef struct {
    uint64_t seq;      /* odd while being updated */
    uint64_t tsc0, ns0;
    uint64_t mult;     /* ns per tick, 32.32 fixed point; 0 = not calibrated yet */
    uint64_t next_tsc; /* re-anchor when the TSC passes this */
} tl_clk_t;

extern tl_clk_t tl_clk;
extern int tl_clock_tsc; /* 1 when the TSC path is enabled */

__attribute__((visibility("hidden"))) uint64_t tl_now_slow(void);
__attribute__((visibility("hidden"))) void tl_clock_init(void);
/* In a fork child: the calibration lock or a half-written anchor of a thread that does not exist
 * there would send every read to clock_gettime for good. */
__attribute__((visibility("hidden"))) void tl_clock_fork_child(void);
#ifdef TL_CLOCK_TESTING
__attribute__((visibility("hidden"))) void tl_clock_test_hold_lock(void); /* as a fork mid-calibration leaves it */
#endif

static inline uint64_t tl_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t tl_now(void) {
#ifdef TL_HAVE_TSC
    if (__builtin_expect(tl_clock_tsc, 1)) {
        uint64_t s1 = __atomic_load_n(&tl_clk.seq, __ATOMIC_ACQUIRE);
        uint64_t tsc = __rdtsc();
        uint64_t tsc0 = __atomic_load_n(&tl_clk.tsc0, __ATOMIC_RELAXED);
        uint64_t ns0 = __atomic_load_n(&tl_clk.ns0, __ATOMIC_RELAXED);
        uint64_t mult = __atomic_load_n(&tl_clk.mult, __ATOMIC_RELAXED);
        uint64_t next = __atomic_load_n(&tl_clk.next_tsc, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t s2 = __atomic_load_n(&tl_clk.seq, __ATOMIC_RELAXED);
        if (__builtin_expect(s1 == s2 && !(s1 & 1) && tsc < next && tsc >= tsc0, 1))
            return ns0 + (uint64_t)(((unsigned __int128)(tsc - tsc0) * mult) >> 32);
        return tl_now_slow();
    }
#endif
    return tl_mono_ns();
}
#endif
