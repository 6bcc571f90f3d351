/* Loop-bound selection from PolyBench/C 3.2's utilities/polybench.h, as shipped in PolyBench-ACC
 * (cavazos-lab/PolyBench-ACC CUDA/utilities/polybench.h; licence in ../_licenses/cavazos-lab+PolyBench-ACC.LICENSE).
 * Only the macro the kernels use is kept: the instrumentation and the host-array macros are host code. */
#ifndef POLYBENCH_H
# define POLYBENCH_H

/* Scalar loop bounds in SCoPs. By default, use parametric loop bounds. */
# ifdef POLYBENCH_USE_SCALAR_LB
#  define POLYBENCH_LOOP_BOUND(x,y) x
# else
/* default: */
#  define POLYBENCH_LOOP_BOUND(x,y) y
# endif

#endif /* !POLYBENCH_H */
