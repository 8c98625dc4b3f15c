/*
 * Probe (bench/NOTES.md, session 42): where do the CTAs of a persistent grid land, with and
 * without clusters of two? One CTA per SM (200 KB of dynamic shared memory each), 132 CTAs;
 * each records %smid. Prints, for plain launches and for 2-CTA clusters, how many of the pairs
 * (2k, 2k + 1) sit on SMs 2j and 2j + 1 (the two SMs of a TPC, if SMs are numbered by TPC),
 * and how many on one pair of SMs at all. The MoE GEMMs' static walk owes 3-5% to its CTAs 2k
 * and 2k + 1 sharing a weight block (session 41); a claimed walk can keep that only if a
 * cluster's two CTAs are such siblings.
 *
 * build: nvcc -O2 -arch=sm_90a -o cluster_placement bench/probes/cluster_placement.cu
 * usage: cluster_placement
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2);} } while (0)

__global__ void record_smid(int* smid) {
  extern __shared__ char pad[];
  if (threadIdx.x == 0) {
    int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    smid[blockIdx.x] = s;
    pad[0] = (char)s; /* keeps the shared memory (one CTA per SM) */
  }
  /* stay a while, so that every CTA is resident at once */
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < 2000000ull);
}

static void run(int cluster, int ctas, int* d_smid, int* smid) {
  const int smem = 200 << 10;
  CK(cudaFuncSetAttribute(record_smid, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = (unsigned)cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)ctas);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = &attr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, record_smid, d_smid));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(smid, d_smid, sizeof(int) * ctas, cudaMemcpyDeviceToHost));
  int tpc = 0, distinct = 0;
  for (int k = 0; k + 1 < ctas; k += 2) {
    tpc += smid[k] / 2 == smid[k + 1] / 2 && smid[k] != smid[k + 1];
    distinct += smid[k] != smid[k + 1];
  }
  printf("cluster %d: %d CTAs; pairs (2k, 2k+1) on SMs 2j, 2j+1: %d of %d (on two SMs: %d); first SMs:",
         cluster, ctas, tpc, ctas / 2, distinct);
  for (int k = 0; k < 12 && k < ctas; k++) printf(" %d", smid[k]);
  printf("\n");
}

int main(void) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int *d_smid, *smid = (int*)malloc(sizeof(int) * sms);
  CK(cudaMalloc((void**)&d_smid, sizeof(int) * sms));
  int clusters = 0;
  cudaLaunchConfig_t q = {};
  cudaLaunchAttribute qa = {};
  qa.id = cudaLaunchAttributeClusterDimension;
  qa.val.clusterDim.x = 2, qa.val.clusterDim.y = 1, qa.val.clusterDim.z = 1;
  q.gridDim = dim3((unsigned)sms), q.blockDim = dim3(128), q.dynamicSmemBytes = 200 << 10, q.attrs = &qa, q.numAttrs = 1;
  CK(cudaFuncSetAttribute(record_smid, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  CK(cudaOccupancyMaxActiveClusters(&clusters, record_smid, &q));
  printf("%d SMs; at most %d 2-CTA clusters resident\n", sms, clusters);
  run(1, sms, d_smid, smid);
  run(2, sms, d_smid, smid);
  run(1, sms, d_smid, smid);
  run(2, sms, d_smid, smid);
  return 0;
}
