// Sums of squares of f32 tensors on a GPU, in f64, in a fixed order (no
// atomics: the same bits every run): each block adds a grid-strided share,
// then one thread adds the blocks' sums in block order. The gradient norm
// (src/runtime/train.rs) takes every parameter's in one read.

extern "C" __global__ void sq_part(const float* x, long long n, double* part) {
    __shared__ double s[256];
    double acc = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double v = x[i];
        acc += v * v;
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = s[0];
}

extern "C" __global__ void sq_total(const double* part, int blocks, double* out, int slot) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double acc = 0.0;
    for (int b = 0; b < blocks; b++) acc += part[b];
    out[slot] = acc;
}
