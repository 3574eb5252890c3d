/* tl_now() (TSC path when enabled) must agree with clock_gettime(CLOCK_MONOTONIC). */
#define _GNU_SOURCE
#include "tl_clock.h"

#include <stdio.h>
#include <stdlib.h>

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
    return (worst < 20000 && worst_back < 20000) ? 0 : 1;
}
