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
spmv_csr_scalar_kernel(const fpType * __restrict__ val,
                       const int    * __restrict__ cols,
                       const int    * __restrict__ rowDelimiters,
                       const int dim, fpType * __restrict__ out,
                       const fpType * __restrict__ vec)
{
    int myRow = blockIdx.x * blockDim.x + threadIdx.x;
    texReader vecTexReader = {vec};

    if (myRow < dim)
    {
        fpType t = 0.0f;
        int start = rowDelimiters[myRow];
        int end = rowDelimiters[myRow+1];
        for (int j = start; j < end; j++)
        {
            int col = cols[j];
            t += val[j] * vecTexReader(col);
        }
        out[myRow] = t;
    }
}

// The single-precision instance the host launches (csrTest<float, texReaderSP>).
template __global__ void spmv_csr_scalar_kernel<float, texReaderSP>(const float * __restrict__ val, const int * __restrict__ cols, const int * __restrict__ rowDelimiters, const int dim, float * __restrict__ out, const float * __restrict__ vec);
