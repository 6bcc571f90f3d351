// BROKEN (modified input): reduces each chunk in place in global memory, using the
// read-only `in` array as scratch (const cast away): every tree step overwrites in[] with
// partial sums. out[] is right, but the caller's input is destroyed: input_modified.
// Each block touches only its own chunk, so the in-place tree has no inter-block race.
extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    float* scratch = const_cast<float*>(in);
    long long begin = (long long)blockIdx.x * chunk;
    long long len = (begin + chunk < n ? begin + chunk : n) - begin;
    for (long long s = 1; s < len; s *= 2) {
        for (long long j = (long long)threadIdx.x * 2 * s; j + s < len; j += (long long)blockDim.x * 2 * s) {
            scratch[begin + j] += scratch[begin + j + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = scratch[begin];
    }
}
