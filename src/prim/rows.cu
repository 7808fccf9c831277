// Softmax cross-entropy's two row passes on a GPU (src/prim/cross_entropy_fast.rs
// launches them; the CPU's fused passes there compute the same). Logits are
// [rows, v] f32, contiguous; labels are i64 class ids, `off` this device's
// first class (a label outside [off, off + v) matches no class here).

// First pass, one block per row: e = exp(x - m), its row sum, and the row's
// logit at its label (0 outside this device's classes).
extern "C" __global__ void ce_first(const float* x, const float* m, const long long* lab,
                                    float* e, float* se, float* tgt, int v, long long off) {
    __shared__ float part[32];
    int r = blockIdx.x;
    const float* xr = x + (long long)r * v;
    float* er = e + (long long)r * v;
    float mr = m[r];
    float acc = 0.0f;
    for (int c = threadIdx.x; c < v; c += blockDim.x) {
        float y = expf(xr[c] - mr);
        er[c] = y;
        acc += y;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffff, acc, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        int warps = (blockDim.x + 31) >> 5;
        acc = lane < warps ? part[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffff, acc, o);
        if (lane == 0) {
            se[r] = acc;
            long long c = lab[r] - off;
            tgt[r] = (c >= 0 && c < v) ? xr[c] : 0.0f;
        }
    }
}

// The gradient: ((e / se - onehot) * scale) * mul per element.
extern "C" __global__ void ce_grad(const float* e, const float* se, const long long* lab, float* d,
                                   long long n, int v, long long off, float scale, float mul) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / v;
        int c = (int)(i - r * v);
        float p = e[i] / se[r];
        if (lab[r] - off == c) p -= 1.0f;
        d[i] = (p * scale) * mul;
    }
}
