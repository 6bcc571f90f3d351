/* PolyBench-ACC CUDA/stencils/fdtd-2d/fdtd2d.cu: fdtd_step2_kernel as written; host code and the other kernels dropped. */
#include "fdtd2d.cuh"
#include "polybench.cuh"

__global__ void fdtd_step2_kernel(int nx, int ny, DATA_TYPE *ex, DATA_TYPE *ey, DATA_TYPE *hz, int t)
{
	int j = blockIdx.x * blockDim.x + threadIdx.x;
	int i = blockIdx.y * blockDim.y + threadIdx.y;
	
	if ((i < _PB_NX) && (j < _PB_NY) && (j > 0))
	{
		ex[i * NY + j] = ex[i * NY + j] - 0.5f*(hz[i * NY + j] - hz[i * NY + (j-1)]);
	}
}
