/* PolyBench/GPU 1.0 (PolyBench-ACC) mvt.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "mvt.cuh"
#include "../_common/polybench.cuh"

__global__ void mvt_kernel2(int n, DATA_TYPE *a, DATA_TYPE *x2, DATA_TYPE *y_2)
{
	for(int i = blockIdx.x * blockDim.x + threadIdx.x; i < _PB_N; i += 4) {}}
