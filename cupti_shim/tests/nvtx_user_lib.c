/* A shared library with its own NVTX instance (every object built with the nvtx3 headers has one):
 * NVTX calls InitializeInjectionNvtx2 once more for it. */
#include <nvtx3/nvToolsExt.h>

__attribute__((visibility("default"))) void nvtx_user_lib_work(int n);
__attribute__((visibility("default"))) void nvtx_user_lib_work(int n) {
    for (int i = 0; i < n; i++) {
        nvtxRangePushA("lib-range");
        nvtxMarkA("lib-mark");
        nvtxRangePop();
    }
}
