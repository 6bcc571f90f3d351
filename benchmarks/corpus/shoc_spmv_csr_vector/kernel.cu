/* SHOC src/cuda/level1/spmv/Spmv.cu: the kernel as written; host code dropped (see ORIGIN). */
// From Spmv.h:
static const int BLOCK_SIZE = 128;
static const int WARP_SIZE = 32;

// Texture Readers (used so kernels can be templated)
// Ported: the legacy texture<float, 1> vecTex that the host bound to the vector is gone from CUDA 12,
// so the reader holds the vector's pointer and reads it with a plain load.
struct texReaderSP {
   const float * __restrict__ vec;
   __device__ __forceinline__ float operator()(const int idx) const
   {
       return vec[idx];
   }
};

template <typename fpType, typename texReader>
__global__ void
spmv_csr_vector_kernel(const fpType * __restrict__ val,
                       const int    * __restrict__ cols,
                       const int    * __restrict__ rowDelimiters,
                       const int dim, fpType * __restrict__ out,
                       const fpType * __restrict__ vec)
{
    // Thread ID in block
    int t = threadIdx.x;
    // Thread ID within warp
    int id = t & (warpSize-1);
    int warpsPerBlock = blockDim.x / warpSize;
    // One row per warp
    int myRow = (blockIdx.x * warpsPerBlock) + (t / warpSize);
    // Texture reader for the dense vector
    texReader vecTexReader = {vec};

    __shared__ volatile fpType partialSums[BLOCK_SIZE];

    if (myRow < dim)
    {
        int warpStart = rowDelimiters[myRow];
        int warpEnd = rowDelimiters[myRow+1];
        fpType mySum = 0;
        for (int j = warpStart + id; j < warpEnd; j += warpSize)
        {
            int col = cols[j];
            mySum += val[j] * vecTexReader(col);
        }
        partialSums[t] = mySum;

        // Reduce partial sums
        if (id < 16) partialSums[t] += partialSums[t+16];
        if (id <  8) partialSums[t] += partialSums[t+ 8];
        if (id <  4) partialSums[t] += partialSums[t+ 4];
        if (id <  2) partialSums[t] += partialSums[t+ 2];
        if (id <  1) partialSums[t] += partialSums[t+ 1];

        // Write result
        if (id == 0)
        {
            out[myRow] = partialSums[t];
        }
    }
}

// The single-precision instance the host launches (csrTest<float, texReaderSP>).
template __global__ void spmv_csr_vector_kernel<float, texReaderSP>(const float * __restrict__ val, const int * __restrict__ cols, const int * __restrict__ rowDelimiters, const int dim, float * __restrict__ out, const float * __restrict__ vec);
