/* PolyBench/GPU 1.0 (PolyBench-ACC) mvt.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "mvt.cuh"
#include "../_common/polybench.cuh"

__global__ void mvt_kernel2(int n, DATA_TYPE *a, DATA_TYPE *x2, DATA_TYPE *y_2)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < _PB_N)
	{
		int j;
		{ float kl_acc0 = x2[i];
		for(j=0; j < _PB_N; j++)
		{
			kl_acc0 += a[j * N + i] * y_2[j];	
		}
		x2[i] = kl_acc0; }
	}
}
