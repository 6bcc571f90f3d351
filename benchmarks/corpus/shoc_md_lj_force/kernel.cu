/* SHOC src/cuda/level1/md/MD.cu: the kernel as written; host code dropped (see ORIGIN). */
#include <cuda.h>

// Ported: the legacy texture<float4, 1> posTexture that the host bound to the positions is gone from CUDA 12,
// so the reader holds the positions' pointer and reads them with a plain load.
struct texReader_sp {
   const float4 * __restrict__ pos;
   __device__ __forceinline__ float4 operator()(int idx) const
   {
       return pos[idx];
   }
};

template <class T, class forceVecType, class posVecType, bool useTexture,
          typename texReader>
__global__ void compute_lj_force(forceVecType* __restrict__ force3,
                                 const posVecType* __restrict__ position,
                                 const int neighCount,
                                 const int* __restrict__ neighList,
                                 const T cutsq,
                                 const T lj1,
                                 const T lj2,
                                 const int inum)
{
    // Global ID - one thread per atom
    int idx = blockIdx.x*blockDim.x + threadIdx.x;

    // Position of this thread's atom
    posVecType ipos = position[idx];

    // Force accumulator
    forceVecType f = {0.0f, 0.0f, 0.0f};

    texReader positionTexReader = {position};

    int j = 0;
    while (j < neighCount)
    {
        int jidx = neighList[j*inum + idx];
        posVecType jpos;
        if (useTexture)
        {
            // Use texture mem as a cache
            jpos = positionTexReader(jidx);
        }
        else
        {
            jpos = position[jidx];
        }

        // Calculate distance
        T delx = ipos.x - jpos.x;
        T dely = ipos.y - jpos.y;
        T delz = ipos.z - jpos.z;
        T r2inv = delx*delx + dely*dely + delz*delz;

        // If distance is less than cutoff, calculate force
        // and add to accumulator
        if (r2inv < cutsq)
        {
            r2inv = 1.0f/r2inv;
            T r6inv = r2inv * r2inv * r2inv;
            T force = r2inv*r6inv*(lj1*r6inv - lj2);

            f.x += delx * force;
            f.y += dely * force;
            f.z += delz * force;
        }
        j++;
    }

    // store the results
    force3[idx] = f;
}

// The single-precision instance the host launches (runTest<float, float3, float4, true, texReader_sp>).
template __global__ void compute_lj_force<float, float3, float4, true, texReader_sp>(float3* __restrict__ force3, const float4* __restrict__ position, const int neighCount, const int* __restrict__ neighList, const float cutsq, const float lj1, const float lj2, const int inum);
