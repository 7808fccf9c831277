// layer_norm and rms_norm on a GPU (src/prim/norm.rs launches them; the
// composed path there computes the same). x, y, g, dx, gx are [rows, d] f32,
// contiguous; w and b [d]. `layer` picks layer_norm (mean removed, bias
// added) over rms_norm. One block per row.

__device__ float block_sum(float v, float* part) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = threadIdx.x < warps ? part[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) part[32] = v;
    __syncthreads();
    return part[32];
}

// The row's mean (0 for rms_norm) and 1 / sqrt(var + eps).
__device__ void stats(const float* xr, int d, float eps, int layer, float* part, float* mu,
                      float* inv) {
    float m = 0.0f;
    if (layer) {
        float s = 0.0f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) s += xr[c];
        m = block_sum(s, part) / d;
    }
    float q = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float z = xr[c] - m;
        q += z * z;
    }
    float var = block_sum(q, part) / d;
    *mu = m;
    *inv = 1.0f / sqrtf(var + eps);
}

extern "C" __global__ void norm_fwd(const float* x, const float* w, const float* b, float* y,
                                    int d, float eps, int layer) {
    __shared__ float part[33];
    long long r = blockIdx.x;
    const float* xr = x + r * d;
    float mu, inv;
    stats(xr, d, eps, layer, part, &mu, &inv);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = ((xr[c] - mu) * inv) * w[c];
        y[r * d + c] = layer ? v + b[c] : v;
    }
}

// dx, and gx = g * xhat (whose column sums are dw; those of g are db).
extern "C" __global__ void norm_bwd(const float* x, const float* w, const float* g, float* dx,
                                    float* gx, int d, float eps, int layer) {
    __shared__ float part[33];
    long long r = blockIdx.x;
    const float* xr = x + r * d;
    const float* gr = g + r * d;
    float mu, inv;
    stats(xr, d, eps, layer, part, &mu, &inv);
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float xh = (xr[c] - mu) * inv;
        float dxh = gr[c] * w[c];
        s1 += dxh;
        s2 += dxh * xh;
        gx[r * d + c] = gr[c] * xh;
    }
    float m1 = layer ? block_sum(s1, part) / d : 0.0f;
    float m2 = block_sum(s2, part) / d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float xh = (xr[c] - mu) * inv;
        float dxh = gr[c] * w[c];
        dx[r * d + c] = ((dxh - m1) - xh * m2) * inv;
    }
}

// Column sums of src [rows, d] in chunks of `per` rows: out [ceil(rows / per), d].
extern "C" __global__ void col_sums(const float* src, float* out, int rows, int d, int per) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    int r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    float s = 0.0f;
    for (int r = r0; r < r1; r++) s += src[(long long)r * d + c];
    out[(long long)blockIdx.y * d + c] = s;
}
