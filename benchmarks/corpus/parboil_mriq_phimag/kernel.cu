/* Parboil mri-q src/cuda/computeQ.cu: the kernel as written, with its block-size macro; host code and ComputeQ_GPU dropped (see ORIGIN). */
#define KERNEL_PHI_MAG_THREADS_PER_BLOCK 512

__global__ void
ComputePhiMag_GPU(float* phiR, float* phiI, float* phiMag, int numK) {
  int indexK = blockIdx.x*KERNEL_PHI_MAG_THREADS_PER_BLOCK + threadIdx.x;
  if (indexK < numK) {
    float real = phiR[indexK];
    float imag = phiI[indexK];
    phiMag[indexK] = real*real + imag*imag;
  }
}
