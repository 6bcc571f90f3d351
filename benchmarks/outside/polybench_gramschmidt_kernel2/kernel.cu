/* PolyBench-ACC CUDA/linear-algebra/solvers/gramschmidt/gramschmidt.cu: gramschmidt_kernel2 as written; host code and the other kernels dropped. */
#include "gramschmidt.cuh"
#include "polybench.cuh"

__global__ void gramschmidt_kernel2(int ni, int nj, DATA_TYPE *a, DATA_TYPE *r, DATA_TYPE *q, int k)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	
	if (i < _PB_NI)
	{	
		q[i * NJ + k] = a[i * NJ + k] / r[k * NJ + k];
	}
}
