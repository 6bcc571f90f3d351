"""The harness's own GPU kernels: input generation, pattern fills, bitwise and tolerance comparison.

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

/* Float outputs within tolerance, the rules of kernel_lsp.core.compare.tolerance_summary (its numpy twin):
   elements with a finite reference and a finite candidate are measured in the working precision (float for
   float32/float16/bfloat16, double for float64), every step rounded as numpy rounds it; both NaN or the same
   infinity is skipped; anything else non-finite, or poison on one side only (poisoned != 0), is "special". out (zeroed by the caller): [0] bad, [1] special, [2] sum (c-r)^2 and
   [3] sum r^2 as doubles, [4] max |c-r| and [5] max |c-r|/|r| as the bits of a non-negative float/double. */
__device__ __forceinline__ float klsp_load_work(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ float klsp_load_work(const __half* p, unsigned long long i) { return __half2float(p[i]); }
__device__ __forceinline__ float klsp_load_work(const __nv_bfloat16* p, unsigned long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ double klsp_load_work(const double* p, unsigned long long i) { return p[i]; }

__device__ __forceinline__ unsigned long long klsp_bits(const float* p, unsigned long long i) { return __float_as_uint(p[i]); }
__device__ __forceinline__ unsigned long long klsp_bits(const __half* p, unsigned long long i) { return ((const unsigned short*)p)[i]; }
__device__ __forceinline__ unsigned long long klsp_bits(const __nv_bfloat16* p, unsigned long long i) { return ((const unsigned short*)p)[i]; }
__device__ __forceinline__ unsigned long long klsp_bits(const double* p, unsigned long long i) { return (unsigned long long)__double_as_longlong(p[i]); }

__device__ __forceinline__ float klsp_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double klsp_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float klsp_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double klsp_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float klsp_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double klsp_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float klsp_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double klsp_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ unsigned long long klsp_max_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned long long klsp_max_bits(double v) { return (unsigned long long)__double_as_longlong(v); }

template <typename T, typename W>
__device__ void klsp_close(const T* r, const T* c, unsigned long long n, W rtol, W atol, unsigned long long poison, int poisoned, unsigned long long* out)
{
    unsigned long long bad = 0ull, special = 0ull, max_abs = 0ull, max_rel = 0ull;
    double err_sq = 0.0, ref_sq = 0.0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        W rv = klsp_load_work(r, i);
        W cv = klsp_load_work(c, i);
        bool r_finite = isfinite(rv), c_finite = isfinite(cv);
        bool poison_on_one_side = poisoned && (klsp_bits(c, i) == poison) != (klsp_bits(r, i) == poison);
        if (poison_on_one_side || r_finite != c_finite) {
            special += 1ull;
            continue;
        }
        if (!r_finite) {
            if (!((isnan(rv) && isnan(cv)) || rv == cv)) {
                special += 1ull;
            }
            continue;
        }
        W abs_err = fabs(klsp_sub(cv, rv));
        W abs_ref = fabs(rv);
        if (abs_err > klsp_add(klsp_mul(abs_ref, rtol), atol)) {
            bad += 1ull;
        }
        W rel = abs_ref != (W)0 ? klsp_div(abs_err, abs_ref) : (W)0;
        unsigned long long abs_bits = klsp_max_bits(abs_err), rel_bits = klsp_max_bits(rel);
        max_abs = max_abs > abs_bits ? max_abs : abs_bits;
        max_rel = max_rel > rel_bits ? max_rel : rel_bits;
        double e = (double)abs_err, a = (double)abs_ref;
        err_sq = __dadd_rn(err_sq, __dmul_rn(e, e));
        ref_sq = __dadd_rn(ref_sq, __dmul_rn(a, a));
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        bad += __shfl_down_sync(0xffffffffu, bad, offset);
        special += __shfl_down_sync(0xffffffffu, special, offset);
        err_sq += __shfl_down_sync(0xffffffffu, err_sq, offset);
        ref_sq += __shfl_down_sync(0xffffffffu, ref_sq, offset);
        unsigned long long a = __shfl_down_sync(0xffffffffu, max_abs, offset);
        unsigned long long b = __shfl_down_sync(0xffffffffu, max_rel, offset);
        max_abs = max_abs > a ? max_abs : a;
        max_rel = max_rel > b ? max_rel : b;
    }
    if ((threadIdx.x & 31) == 0 && (bad || special || err_sq != 0.0 || ref_sq != 0.0 || max_abs || max_rel)) {
        atomicAdd(&out[0], bad);
        atomicAdd(&out[1], special);
        atomicAdd((double*)&out[2], err_sq);
        atomicAdd((double*)&out[3], ref_sq);
        atomicMax(&out[4], max_abs);
        atomicMax(&out[5], max_rel);
    }
}

extern "C" __global__ void klsp_close_f32(const float* r, const float* c, unsigned long long n, float rtol, float atol, unsigned long long poison, int poisoned, unsigned long long* out)
{
    klsp_close<float, float>(r, c, n, rtol, atol, poison, poisoned, out);
}

extern "C" __global__ void klsp_close_f16(const __half* r, const __half* c, unsigned long long n, float rtol, float atol, unsigned long long poison, int poisoned, unsigned long long* out)
{
    klsp_close<__half, float>(r, c, n, rtol, atol, poison, poisoned, out);
}

extern "C" __global__ void klsp_close_bf16(const __nv_bfloat16* r, const __nv_bfloat16* c, unsigned long long n, float rtol, float atol, unsigned long long poison, int poisoned, unsigned long long* out)
{
    klsp_close<__nv_bfloat16, float>(r, c, n, rtol, atol, poison, poisoned, out);
}

extern "C" __global__ void klsp_close_f64(const double* r, const double* c, unsigned long long n, double rtol, double atol, unsigned long long poison, int poisoned, unsigned long long* out)
{
    klsp_close<double, double>(r, c, n, rtol, atol, poison, poisoned, out);
}
"""

#: The comparison kernel for each float element type (:meth:`PycudaBackend.tolerance_summary`).
CLOSE_KERNELS = {"float32": "klsp_close_f32", "float16": "klsp_close_f16", "bfloat16": "klsp_close_bf16", "float64": "klsp_close_f64"}
