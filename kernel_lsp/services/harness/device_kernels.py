"""The harness's own GPU kernels: input generation, pattern fills and bitwise comparison.

Compiled once per architecture by :func:`kernel_lsp.services.harness.verify.helper_cubin`
(cached on disk) and loaded by the child next to the original and the candidate.
They keep the large arrays on the device: drawing 64M floats with numpy and copying
them up cost ~0.5 s per array and seed, and copying every array back to compare
it cost as much again; here both take milliseconds.

The generator is counter-based (splitmix64 of ``key + (i + 1) * golden``): element
``i`` of an array depends only on the key and ``i``, so any thread can draw any
element, and :func:`kernel_lsp.core.inputs.counter_values` computes the same
values in numpy (bit for bit for every kind but ``normal``, whose ``logf``/``cosf``
may differ from numpy's in the last place). Arithmetic uses the ``_rn``
intrinsics so nvcc cannot contract it into an FMA the numpy twin does not do.
"""

from __future__ import annotations

#: Kind codes shared with :data:`kernel_lsp.core.inputs.GPU_KINDS`.
SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define KIND_UNIFORM 0
#define KIND_NORMAL 1
#define KIND_FILL 2
#define KIND_ARANGE 3
#define KIND_RANDINT 4

__device__ __forceinline__ unsigned long long klsp_mix(unsigned long long key, unsigned long long i)
{
    unsigned long long z = key + (i + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float klsp_value32(int kind, unsigned long long z, unsigned long long i, float a, float b)
{
    if (kind == KIND_UNIFORM) {
        float u = __fmul_rn((float)(z >> 40), 5.9604644775390625e-08f);
        return __fadd_rn(__fmul_rn(u, a), b);
    }
    if (kind == KIND_NORMAL) {
        float u1 = __fmul_rn((float)((z >> 40) + 1ull), 5.9604644775390625e-08f);
        float u2 = __fmul_rn((float)((z >> 16) & 0xFFFFFFull), 5.9604644775390625e-08f);
        float n = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864769f * u2);
        return __fadd_rn(__fmul_rn(n, a), b);
    }
    if (kind == KIND_ARANGE) {
        return (float)i;
    }
    return a;
}

extern "C" __global__ void klsp_gen_f32(float* out, unsigned long long n, unsigned long long key, int kind, float a, float b)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = klsp_value32(kind, klsp_mix(key, i), i, a, b);
    }
}

extern "C" __global__ void klsp_gen_f16(__half* out, unsigned long long n, unsigned long long key, int kind, float a, float b)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = __float2half_rn(klsp_value32(kind, klsp_mix(key, i), i, a, b));
    }
}

extern "C" __global__ void klsp_gen_bf16(__nv_bfloat16* out, unsigned long long n, unsigned long long key, int kind, float a, float b)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = __float2bfloat16_rn(klsp_value32(kind, klsp_mix(key, i), i, a, b));
    }
}

extern "C" __global__ void klsp_gen_f64(double* out, unsigned long long n, unsigned long long key, int kind, double a, double b)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long z = klsp_mix(key, i);
        double v = a;
        if (kind == KIND_UNIFORM) {
            double u = __dmul_rn((double)(z >> 11), 1.1102230246251565e-16);
            v = __dadd_rn(__dmul_rn(u, a), b);
        } else if (kind == KIND_NORMAL) {
            double u1 = __dmul_rn((double)((z >> 11) + 1ull), 1.1102230246251565e-16);
            double u2 = __dmul_rn((double)(klsp_mix(key ^ 0xD1B54A32D192ED03ull, i) >> 11), 1.1102230246251565e-16);
            v = __dadd_rn(__dmul_rn(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2), a), b);
        } else if (kind == KIND_ARANGE) {
            v = (double)i;
        }
        out[i] = v;
    }
}

/* Integers: randint draws low + z % span (span = high - low + 1; 0 means all 2^64 values);
   fill writes low; arange writes i. Stored truncated to the element width (two's complement). */
template <typename T>
__device__ void klsp_gen_int(T* out, unsigned long long n, unsigned long long key, int kind, unsigned long long low, unsigned long long span)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long v = low;
        if (kind == KIND_RANDINT) {
            unsigned long long z = klsp_mix(key, i);
            v = low + (span ? z % span : z);
        } else if (kind == KIND_ARANGE) {
            v = i;
        }
        out[i] = (T)v;
    }
}

extern "C" __global__ void klsp_gen_i8(unsigned char* out, unsigned long long n, unsigned long long key, int kind, unsigned long long low, unsigned long long span)
{
    klsp_gen_int<unsigned char>(out, n, key, kind, low, span);
}

extern "C" __global__ void klsp_gen_i32(unsigned int* out, unsigned long long n, unsigned long long key, int kind, unsigned long long low, unsigned long long span)
{
    klsp_gen_int<unsigned int>(out, n, key, kind, low, span);
}

extern "C" __global__ void klsp_gen_i64(unsigned long long* out, unsigned long long n, unsigned long long key, int kind, unsigned long long low, unsigned long long span)
{
    klsp_gen_int<unsigned long long>(out, n, key, kind, low, span);
}

/* An 8-byte pattern over n elements (memset covers 1, 2 and 4 bytes). */
extern "C" __global__ void klsp_fill_u64(unsigned long long* out, unsigned long long n, unsigned long long pattern)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = pattern;
    }
}

/* Bytes that differ between a and b: result[0] += count of differing 4-byte words (and tail bytes),
   result[1] = min byte offset of a difference. a and b are 4-byte aligned (allocation offsets are). */
extern "C" __global__ void klsp_diff(const unsigned char* a, const unsigned char* b, unsigned long long nbytes, unsigned long long* result)
{
    const unsigned int* aw = (const unsigned int*)a;
    const unsigned int* bw = (const unsigned int*)b;
    unsigned long long words = nbytes / 4ull;
    unsigned long long count = 0ull;
    unsigned long long first = ~0ull;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < words; i += (unsigned long long)gridDim.x * blockDim.x) {
        if (aw[i] != bw[i]) {
            count += 1ull;
            first = first < 4ull * i ? first : 4ull * i;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (unsigned long long j = 4ull * words; j < nbytes; ++j) {
            if (a[j] != b[j]) {
                count += 1ull;
                first = first < j ? first : j;
            }
        }
    }
    if (count) {
        atomicAdd(&result[0], count);
        atomicMin(&result[1], first);
    }
}
"""
