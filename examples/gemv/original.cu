// Matrix-vector product y = A x for a rows x cols row-major float matrix, one thread per
// row. Lane i of a warp walks row i while lane i+1 walks the row 4*cols bytes further on,
// so every warp-wide load of A touches 32 different cache lines and uses 4 bytes of each.
// Launch: block 256, grid ceil(rows/256).
extern "C" __global__ void gemv(const float* A, const float* x, float* y, int rows, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const float* a = A + (long long)r * cols;
    float acc = 0.0f;
    for (int c = 0; c < cols; ++c) {
        acc += a[c] * x[c];
    }
    y[r] = acc;
}
