/* Caffe src/caffe/layers/embed_layer.cu: the kernel as written, with its forward declaration; host code dropped (see ORIGIN). */
#include "../_common/caffe_device_alternate.cuh"
#include "gpu_util.cuh"

namespace caffe {


template <typename Dtype>
__global__ void EmbedBackward(const int nthreads, const Dtype* bottom_data,
    const Dtype* top_diff, const int M, const int N, const int K,
    Dtype* weight_diff);

template <typename Dtype>
__global__ void EmbedBackward(const int nthreads, const Dtype* bottom_data,
    const Dtype* top_diff, const int M, const int N, const int K,
    Dtype* weight_diff) {
  CUDA_KERNEL_LOOP(top_index, nthreads) {
    const int n = top_index / N;
    const int d = top_index % N;
    const int index = static_cast<int>(bottom_data[n]);
    const int weight_index = index * N + d;
    caffe_gpu_atomic_add(top_diff[top_index], weight_diff + weight_index);
  }
}

// The float instance EmbedLayer<float>::Backward_gpu launches.
template __global__ void EmbedBackward<float>(const int nthreads, const float* bottom_data, const float* top_diff, const int M, const int N, const int K, float* weight_diff);

}  // namespace caffe
