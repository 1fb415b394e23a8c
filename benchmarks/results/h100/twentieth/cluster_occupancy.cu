// How many thread-block clusters of each size (1-16 CTAs) the device holds at once, for CTAs of
// 128 / 256 / 512 threads at 1-8 CTAs per SM (set by the dynamic shared memory), and which
// share of the SMs' CTA slots that fills: cudaOccupancyMaxActiveClusters on a trivial kernel.
// Build: nvcc -O2 -arch=sm_90 -o cluster_occupancy cluster_occupancy.cu (the twentieth
// session's output: cluster_occupancy.txt; NOTES.md §37).
#include <cuda_runtime.h>
#include <cstdio>
__global__ void K(float* p) {
  extern __shared__ float s[];
  if (p) {
    s[threadIdx.x] = 1;
    p[threadIdx.x] = s[threadIdx.x ^ 1];
  }
}
int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s SMs %d smem/SM %zu smem/block optin %zu\n", prop.name, prop.multiProcessorCount,
         prop.sharedMemPerMultiprocessor, prop.sharedMemPerBlockOptin);
  cudaFuncSetAttribute(K, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       (int)prop.sharedMemPerBlockOptin);
  const int threads[] = {128, 256, 512};
  for (int t : threads) {
    for (int per_sm = 1; per_sm <= 8; ++per_sm) {
      if (t * per_sm > 2048) continue;
      // shared memory per CTA so that exactly per_sm fit
      size_t smem = (prop.sharedMemPerMultiprocessor / per_sm) - 1024 - 64;
      if (smem > prop.sharedMemPerBlockOptin) smem = prop.sharedMemPerBlockOptin;
      int blocks = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, K, t, smem);
      printf("threads %3d target %d/SM (got %d/SM, smem %6zu):", t, per_sm, blocks, smem);
      for (int c = 1; c <= 16; ++c) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(c * 64);
        cfg.blockDim = dim3(t);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute a;
        a.id = cudaLaunchAttributeClusterDimension;
        a.val.clusterDim.x = c;
        a.val.clusterDim.y = 1;
        a.val.clusterDim.z = 1;
        cfg.attrs = &a;
        cfg.numAttrs = 1;
        int n = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, K, &cfg);
        if (e != cudaSuccess) {
          printf(" c%d:err", c);
          cudaGetLastError();
          continue;
        }
        printf(" c%d:%d(%.0f%%)", c, n, 100.0 * n * c / (blocks * prop.multiProcessorCount));
      }
      printf("\n");
    }
  }
  return 0;
}
