/* tl_now() (TSC path when enabled) must agree with clock_gettime(CLOCK_MONOTONIC); after a fork that
 * caught another thread calibrating (its lock held, the anchor half written), the child's clock must
 * calibrate again instead of falling back to clock_gettime for good. */
#define _GNU_SOURCE
#include "tl_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* in a fork child, as a fork in the middle of another thread's calibration leaves it: the clock must
 * be calibrated again within 200 ms */
static int fork_mid_calibration(void) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        tl_clock_test_hold_lock();
        tl_clock_fork_child(); /* what the shim's atfork child handler calls */
        uint64_t t_end = tl_mono_ns() + 200000000ull;
        while (tl_mono_ns() < t_end) (void)tl_now();
        int ok = (tl_clk.seq & 1) == 0 && tl_clk.mult != 0;
        if (!ok) fprintf(stderr, "clock: not calibrated after a fork mid-calibration (seq %llu, mult %llu)\n",
                         (unsigned long long)tl_clk.seq, (unsigned long long)tl_clk.mult);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int main(void) {
    tl_clock_init();
    uint64_t t_end = tl_mono_ns() + 400000000ull; /* 400 ms: covers calibration and several re-anchors */
    int64_t worst = 0;
    int64_t worst_back = 0;
    uint64_t last = 0, n = 0;
    while (tl_mono_ns() < t_end) {
        uint64_t a = tl_mono_ns();
        uint64_t x = tl_now();
        uint64_t b = tl_mono_ns();
        int64_t err = 0;
        if (x < a) err = (int64_t)(a - x);
        else if (x > b) err = (int64_t)(x - b);
        if (err > worst) worst = err;
        if (last && x < last && (int64_t)(last - x) > worst_back) worst_back = (int64_t)(last - x);
        last = x;
        n++;
    }
    printf("clock: tsc=%d, %llu reads, worst error %lld ns, worst step back %lld ns\n", tl_clock_tsc,
           (unsigned long long)n, (long long)worst, (long long)worst_back);
    int forked = tl_clock_tsc ? fork_mid_calibration() : 0; /* (clock_gettime: nothing to calibrate) */
    printf("clock: fork mid-calibration %s\n", tl_clock_tsc ? (forked ? "FAILED" : "recalibrated") : "n/a");
    return (worst < 20000 && worst_back < 20000 && !forked) ? 0 : 1;
}
