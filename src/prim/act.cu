// Elementwise kernels on a GPU: the fused activations and their derivatives
// (src/prim/unary_fast.rs launches them; its CPU kernels compute the same
// functions), and the broadcast binary ops (src/prim/bcast_fast.rs). `a` picks the
// activation: 0 gelu (tanh approximation), 1 silu, 2 tanh, 3 sigmoid, 4 exp.
// The derivative reads the input for gelu and silu, the output for the rest.
// The _bf16 kernels take and give bfloat16 (as its bits) and compute in f32 in
// between: one rounding per element, not one per composed op.

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_A 0.044715f

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float act_f(int a, float x) {
    switch (a) {
    case 0: return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_A * x * x)));
    case 1: return x / (1.0f + expf(-x));
    case 2: return tanhf(x);
    case 3: return sigm(x);
    default: return expf(x);
    }
}

// The derivative at v: the input x for gelu and silu, the output y otherwise.
__device__ __forceinline__ float act_df(int a, float v) {
    switch (a) {
    case 0: {
        float x2 = v * v;
        float t = tanhf(SQRT_2_OVER_PI * v * (1.0f + GELU_A * x2));
        float dinner = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_A * x2);
        return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner;
    }
    case 1: {
        float s = sigm(v);
        return s * (1.0f + v * (1.0f - s));
    }
    case 2: return 1.0f - v * v;
    case 3: return v * (1.0f - v);
    default: return v;
    }
}

extern "C" __global__ void act_fwd(const float* x, float* y, long long n, int a) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = act_f(a, x[i]);
}

extern "C" __global__ void act_bwd(const float* v, const float* ct, float* g, long long n, int a) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        g[i] = ct[i] * act_df(a, v[i]);
}

// bfloat16 bits to f32 (exact), and f32 to the nearest bfloat16 (ties to even,
// NaN kept NaN): candle's (the `half` crate's) conversions.
__device__ __forceinline__ float bf16_in(unsigned short h) {
    return __int_as_float((int)((unsigned)h << 16));
}
__device__ __forceinline__ unsigned short bf16_out(float f) {
    unsigned u = (unsigned)__float_as_int(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

extern "C" __global__ void act_fwd_bf16(const unsigned short* x, unsigned short* y, long long n,
                                        int a) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = bf16_out(act_f(a, bf16_in(x[i])));
}

extern "C" __global__ void act_bwd_bf16(const unsigned short* v, const unsigned short* ct,
                                        unsigned short* g, long long n, int a) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        g[i] = bf16_out(bf16_in(ct[i]) * act_df(a, bf16_in(v[i])));
}

// out[i] = a[i] op b[i % nb] (flip: b[i % nb] op a[i]), b a row repeated over
// a's leading dims (a bias). op: 0 add, 1 sub, 2 mul, 3 div. One f32 op, as
// candle's kernels (bf16: widened, the op, rounded once, as the `half` crate).
__device__ __forceinline__ float bin(int op, float x, float y) {
    switch (op) {
    case 0: return x + y;
    case 1: return x - y;
    case 2: return x * y;
    default: return x / y;
    }
}

__device__ __forceinline__ long long col(long long i, long long nb) {
    // 32-bit division where it fits (the common case), which is cheaper.
    return (i | nb) >> 31 ? i % nb : (long long)((unsigned)i % (unsigned)nb);
}

extern "C" __global__ void bcast_f32(const float* a, const float* b, float* out, long long n,
                                     long long nb, int op, int flip) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = a[i], y = b[col(i, nb)];
        out[i] = flip ? bin(op, y, x) : bin(op, x, y);
    }
}

extern "C" __global__ void bcast_bf16(const unsigned short* a, const unsigned short* b,
                                      unsigned short* out, long long n, long long nb, int op,
                                      int flip) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = bf16_in(a[i]), y = bf16_in(b[col(i, nb)]);
        out[i] = bf16_out(flip ? bin(op, y, x) : bin(op, x, y));
    }
}
