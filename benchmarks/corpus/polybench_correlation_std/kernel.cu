/* PolyBench/GPU 1.0 (PolyBench-ACC) correlation.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "correlation.cuh"
#include "../_common/polybench.cuh"

#define FLOAT_N 3214212.01f
#define EPS 0.005f

__global__ void std_kernel(int m, int n, DATA_TYPE *mean, DATA_TYPE *std, DATA_TYPE *data)
{
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	
	if (j < _PB_M)
	{
		std[j] = 0.0;

		int i;
		for(i = 0; i < _PB_N; i++)
		{
			std[j] += (data[i*M + j] - mean[j]) * (data[i*M + j] - mean[j]);
		}
		std[j] /= (FLOAT_N);
		std[j] = sqrt(std[j]);
		if(std[j] <= EPS) 
		{
			std[j] = 1.0;
		}
	}
}
