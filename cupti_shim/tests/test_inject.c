/* CUPTI entry point tests. Usage: test_inject MODE SHIM_PATH
 *   nodriver: InitializeInjection without a CUDA driver must return, log a DIAG, and NVTX keeps working.
 *   fake:     a fake libcuda.so.1 is loaded and TELLER_CUPTI_PATH names a fake libcupti: full pipeline.
 *   multi:    the fake cuptiSubscribe fails with MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED.
 * With the fake CUPTI active, the first buffer (CONTEXT records for devices 0, 1, 7) is completed early
 * and the program waits for the shim's device queries to the fake libcuda (14 for each of devices 0
 * and 1, 1 for the unknown 7), so that the DRIVER records CUPTI makes of them are flushed at exit; then
 * it forks a child that records one NVTX range: the child's file must not claim the parent's GPUs.
 * Prints one JSON line of facts for check_raw.py. */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned tid(void) { return (unsigned)syscall(SYS_gettid); }

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: test_inject MODE SHIM\n"); return 2; }
    const char *mode = argv[1];
    int discover = strcmp(mode, "discover") == 0; /* no TELLER_CUPTI_PATH: found next to a loaded libcudart */
    int fake = strcmp(mode, "fake") == 0 || strcmp(mode, "multi") == 0 || discover;
    if (discover && !dlopen(getenv("FAKE_CUDART"), RTLD_NOW | RTLD_GLOBAL)) { fprintf(stderr, "no fake cudart: %s\n", dlerror()); return 2; }
    if (fake && !dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) { fprintf(stderr, "no fake libcuda: %s\n", dlerror()); return 2; }
    void *shim = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!shim) { fprintf(stderr, "dlopen shim: %s\n", dlerror()); return 2; }
    int (*init)(void) = (int (*)(void))dlsym(shim, "InitializeInjection");
    if (!init) { fprintf(stderr, "no InitializeInjection\n"); return 2; }
    int r1 = init();
    int r2 = init(); /* the driver may call it twice */
    if (r1 != 1 || r2 != 1) { fprintf(stderr, "InitializeInjection returned %d, %d\n", r1, r2); return 1; }

    uint32_t corr_in = 0, corr_out = 0, corr_sync = 0, corr_dsync = 0;
    uint32_t (*launch)(const char *, unsigned) = NULL;
    uint32_t (*sync)(unsigned) = NULL;
    uint32_t (*driver_sync)(unsigned) = NULL;
    void (*complete)(void) = NULL;
    int (*wait_driver)(int, int) = NULL;
    if (fake) {
        void *fc = dlopen(discover ? "libcupti.so.13" : getenv("TELLER_CUPTI_PATH"), RTLD_NOW | RTLD_NOLOAD);
        if (fc) {
            *(void **)&launch = dlsym(fc, "fake_cupti_launch");
            *(void **)&sync = dlsym(fc, "fake_cupti_sync");
            *(void **)&driver_sync = dlsym(fc, "fake_cupti_driver_sync");
            *(void **)&complete = dlsym(fc, "fake_cupti_complete_now");
            *(void **)&wait_driver = dlsym(fc, "fake_cupti_wait_driver_calls");
        }
    }
    nvtxRangePushA("step");
    if (launch) corr_in = launch("kernel_in_step", tid());
    nvtxRangePushA("inner-step");
    if (launch) launch("kernel_in_inner", tid());
    nvtxRangePop();
    nvtxRangePop();
    /* ranges of two domains popped out of order: a launch while "cross-b" (domain 2) is still open
     * belongs to it, not to "cross-a" (domain 1, already closed) */
    uint32_t corr_cross = 0;
    nvtxDomainHandle_t d1 = nvtxDomainCreateA("inject-d1"), d2 = nvtxDomainCreateA("inject-d2");
    nvtxEventAttributes_t ea;
    memset(&ea, 0, sizeof ea);
    ea.version = NVTX_VERSION;
    ea.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    ea.messageType = NVTX_MESSAGE_TYPE_ASCII;
    ea.message.ascii = "cross-a";
    nvtxDomainRangePushEx(d1, &ea);
    ea.message.ascii = "cross-b";
    nvtxDomainRangePushEx(d2, &ea);
    nvtxDomainRangePop(d1);
    if (launch) corr_cross = launch("kernel_in_cross_b", tid());
    nvtxDomainRangePop(d2);
    if (launch) corr_out = launch("kernel_outside", tid());
    if (sync) corr_sync = sync(tid());
    if (driver_sync) corr_dsync = driver_sync(tid());
    int driver_calls = -1, child = 0;
    if (corr_in && complete && wait_driver) {
        complete();
        driver_calls = wait_driver(2 * 15 + 1, 10000);
        child = (int)fork();
        if (child == 0) {
            nvtxRangePushA("child-range");
            nvtxRangePop();
            _exit(0);
        }
        int st = 0;
        if (child < 0 || waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "forked child failed\n");
            return 1;
        }
    }
    nvtxRangePushA("after-init");
    nvtxRangePop();
    printf("{\"pid\": %d, \"tid\": %u, \"corr_in\": %u, \"corr_out\": %u, \"corr_sync\": %u, \"corr_dsync\": %u, \"corr_cross\": %u, \"driver_calls\": %d, \"child\": %d}\n",
           (int)getpid(), tid(), corr_in, corr_out, corr_sync, corr_dsync, corr_cross, driver_calls, child);
    return 0; /* exit(): the shim flushes CUPTI and joins its writer thread in atexit */
}
