// Layer normalization of each row of a rows x cols row-major matrix:
// y = (x - mean) / sqrt(var + eps) * gamma + beta, one thread per row, two passes for the
// statistics (mean, then the mean squared deviation) and one to write. Lanes of a warp walk
// 32 rows 4*cols bytes apart: every warp load touches 32 cache lines, and each row is read
// three times. Launch: block 256, grid ceil(rows/256).
extern "C" __global__ void layernorm(const float* x, const float* gamma, const float* beta, float* y, int rows, int cols, float eps)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const float* xr = x + (long long)r * cols;
    float* yr = y + (long long)r * cols;
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) {
        sum += xr[c];
    }
    float mean = sum / cols;
    float sq = 0.0f;
    for (int c = 0; c < cols; ++c) {
        float d = xr[c] - mean;
        sq += d * d;
    }
    float rstd = rsqrtf(sq / cols + eps);
    for (int c = 0; c < cols; ++c) {
        yr[c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
    }
}
