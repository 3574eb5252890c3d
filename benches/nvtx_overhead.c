/* ns per NVTX push/pop pair. Usage: nvtx_overhead [PAIRS] [THREADS]
 * Run without NVTX_INJECTION64_PATH for the no-tool baseline, with it pointing at a tool. */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long g_pairs;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run(void *arg) {
    (void)arg;
    for (long i = 0; i < g_pairs; i++) {
        nvtxRangePushA("bench-range");
        nvtxRangePop();
    }
    return NULL;
}

int main(int argc, char **argv) {
    g_pairs = argc > 1 ? atol(argv[1]) : 10000000L;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    nvtxRangePushA("warmup"); /* loads the injection library (if any) outside the timed loop */
    nvtxRangePop();
    double t0 = now_s();
    if (threads <= 1) {
        run(NULL);
    } else {
        pthread_t th[64];
        for (int i = 0; i < threads && i < 64; i++) pthread_create(&th[i], NULL, run, NULL);
        for (int i = 0; i < threads && i < 64; i++) pthread_join(th[i], NULL);
    }
    double dt = now_s() - t0;
    printf("%.2f\n", dt * 1e9 / (double)g_pairs / (threads > 1 ? 1 : 1));
    return 0;
}
