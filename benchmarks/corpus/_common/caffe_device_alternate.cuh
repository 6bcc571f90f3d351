/* CUDA_KERNEL_LOOP, Caffe's grid-stride loop, from include/caffe/util/device_alternate.hpp (BVLC/caffe commit bc1aa41af7d0ba46da4d7c71fc9109baea651ce0; licence in ../_licenses/BVLC+caffe.LICENSE).
 * Only the macro the kernels use is kept: the header's other parts are host error checks and cuBLAS/cuRAND setup. */
#ifndef CAFFE_UTIL_DEVICE_ALTERNATE_H_
#define CAFFE_UTIL_DEVICE_ALTERNATE_H_

// CUDA: grid stride looping
#define CUDA_KERNEL_LOOP(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; \
       i < (n); \
       i += blockDim.x * gridDim.x)

#endif  // CAFFE_UTIL_DEVICE_ALTERNATE_H_
