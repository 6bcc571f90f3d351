/* Caffe src/caffe/layers/softmax_layer.cu: the kernel as written; host code dropped (see ORIGIN). */
#include <cfloat>

#include "../_common/caffe_device_alternate.cuh"

namespace caffe {

template <typename Dtype>
__global__ void kernel_channel_max(const int num, const int channels,
    const int spatial_dim, const Dtype* data, Dtype* out) {
  CUDA_KERNEL_LOOP(index, num * spatial_dim) {
    int n = index / spatial_dim;
    int s = index % spatial_dim;
    Dtype maxval = -FLT_MAX;
    for (int c = 0; c < channels; ++c) {
      maxval = max(data[(n * channels + c) * spatial_dim + s], maxval);
    }
    out[index] = maxval;
  }
}

// The float instance SoftmaxLayer<float>::Forward_gpu launches.
template __global__ void kernel_channel_max<float>(const int num, const int channels, const int spatial_dim, const float* data, float* out);

}  // namespace caffe
