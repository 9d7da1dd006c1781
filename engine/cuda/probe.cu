#include <cuda_runtime.h>
extern "C" int loom_probe_count(void) { int n = 0; if (cudaGetDeviceCount(&n) != cudaSuccess) return 0; return n; }
