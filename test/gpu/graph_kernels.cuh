/*
 * The "one kernel per call" checks of the GPU tests: a captured graph's node count and how
 * many of its nodes are kernels.
 */
#ifndef MK_GRAPH_KERNELS_CUH_
#define MK_GRAPH_KERNELS_CUH_

#include <vector>

#include "gemm_check.cuh" /* CUDA_OK */

/* Kernel nodes of `graph`; *nodes (optional): all of its nodes. */
static size_t graph_kernel_nodes(cudaGraph_t graph, size_t* nodes) {
  size_t n = 0, kernels = 0;
  CUDA_OK(cudaGraphGetNodes(graph, NULL, &n));
  std::vector<cudaGraphNode_t> list(n);
  CUDA_OK(cudaGraphGetNodes(graph, list.data(), &n));
  for (size_t i = 0; i < n; i++) {
    cudaGraphNodeType t;
    CUDA_OK(cudaGraphNodeGetType(list[i], &t));
    kernels += t == cudaGraphNodeTypeKernel;
  }
  if (nodes) *nodes = n;
  return kernels;
}

#endif /* MK_GRAPH_KERNELS_CUH_ */
