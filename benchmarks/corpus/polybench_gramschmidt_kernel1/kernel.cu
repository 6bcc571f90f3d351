/* PolyBench/GPU 1.0 (PolyBench-ACC) gramschmidt.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "gramschmidt.cuh"
#include "../_common/polybench.cuh"

__global__ void gramschmidt_kernel1(int ni, int nj, DATA_TYPE *a, DATA_TYPE *r, DATA_TYPE *q, int k)
{
	int tid = blockIdx.x * blockDim.x + threadIdx.x;

	if(tid==0)
	{
		DATA_TYPE nrm = 0.0;
		int i;
		for (i = 0; i < _PB_NI; i++)
		{
			nrm += a[i * NJ + k] * a[i * NJ + k];
		}
      		r[k * NJ + k] = sqrt(nrm);
	}
}
