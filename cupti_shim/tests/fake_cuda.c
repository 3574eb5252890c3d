/* A stand-in for libcuda.so.1 (soname only): lets the CPU tests reach the shim's CUPTI set-up path,
 * which refuses to touch libcupti unless the CUDA driver is loaded. */
int teller_fake_cuda_marker(void);
int teller_fake_cuda_marker(void) { return 1; }
