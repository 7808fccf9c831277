// Fused attention for a GPU (src/prim/flash.rs compiles this with NVRTC, HD
// the head dim, defined before this text). One thread per query row (forward,
// dq) or key row (dk, dv); the other side's rows stream through shared memory
// in tiles, and the softmax is online, so the [T, S] scores never exist in
// memory. f32 throughout. Layouts: q, o, do [B, T, H, HD]; k, v [B, S, H, HD];
// lse and the row dots [B, H, T]. Query i sees key j when
// (!causal || j <= i) && (window <= 0 || |i - j| < window).

#define BQ 64
#define BK 32
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ bool sees(int i, int j, int causal, int window) {
    int gap = i > j ? i - j : j - i;
    return (!causal || j <= i) && (window <= 0 || gap < window);
}

// Keys a block of queries [i0, i1] can see: [*lo, *hi).
__device__ __forceinline__ void key_range(int i0, int i1, int S, int causal, int window, int* lo,
                                          int* hi) {
    *lo = 0;
    *hi = S;
    if (causal) *hi = min(S, i1 + 1);
    if (window > 0) {
        *lo = max(0, i0 - window + 1);
        *hi = min(*hi, i1 + window);
    }
}

// Queries a block of keys [j0, j1] is seen by: [*lo, *hi).
__device__ __forceinline__ void query_range(int j0, int j1, int T, int causal, int window, int* lo,
                                            int* hi) {
    *lo = causal ? j0 : 0;
    *hi = T;
    if (window > 0) {
        *lo = max(*lo, j0 - window + 1);
        *hi = min(T, j1 + window);
    }
}

// Rows [r0, r0 + BK) of x (row stride H * HD, head h) into tile, zeros past n.
__device__ __forceinline__ void load_tile(float (*tile)[HD], const float* x, int b, int n, int H,
                                          int h, int r0, float mul) {
    for (int x_ = threadIdx.x; x_ < BK * HD; x_ += blockDim.x) {
        int r = x_ / HD, e = x_ % HD;
        int row = r0 + r;
        tile[r][e] = row < n ? x[(((long)b * n + row) * H + h) * HD + e] * mul : 0.0f;
    }
}

// Forward: o = softmax(q k^T * scale, masked) v and lse per query row; with
// want_out == 0 only lse (the derivative's recomputation).
extern "C" __global__ void attn_fwd(const float* q, const float* k, const float* v, float* o,
                                    float* lse, int B, int T, int S, int H, float scale,
                                    int causal, int window, int want_out) {
    __shared__ float ks[BK][HD];
    __shared__ float vs[BK][HD];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int i0 = blockIdx.x * BQ, i = i0 + threadIdx.x;
    bool live = i < T;
    float qr[HD], acc[HD];
    long row = (((long)b * T + i) * H + h) * HD;
#pragma unroll
    for (int e = 0; e < HD; e++) {
        qr[e] = live ? q[row + e] * scale : 0.0f;
        acc[e] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    int lo, hi;
    key_range(i0, min(T, i0 + BQ) - 1, S, causal, window, &lo, &hi);
    for (int j0 = lo; j0 < hi; j0 += BK) {
        load_tile(ks, k, b, S, H, h, j0, 1.0f);
        if (want_out) load_tile(vs, v, b, S, H, h, j0, 1.0f);
        __syncthreads();
        if (live) {
            float s[BK];
            float mt = NEG_INF;
#pragma unroll
            for (int jj = 0; jj < BK; jj++) {
                int j = j0 + jj;
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < HD; e++) d += qr[e] * ks[jj][e];
                s[jj] = (j < S && sees(i, j, causal, window)) ? d : NEG_INF;
                mt = fmaxf(mt, s[jj]);
            }
            if (mt > NEG_INF) {
                float mn = fmaxf(m, mt);
                float corr = m == NEG_INF ? 0.0f : expf(m - mn);
                l *= corr;
                if (want_out) {
#pragma unroll
                    for (int e = 0; e < HD; e++) acc[e] *= corr;
                }
#pragma unroll
                for (int jj = 0; jj < BK; jj++) {
                    float p = s[jj] == NEG_INF ? 0.0f : expf(s[jj] - mn);
                    l += p;
                    if (want_out) {
#pragma unroll
                        for (int e = 0; e < HD; e++) acc[e] += p * vs[jj][e];
                    }
                }
                m = mn;
            }
        }
        __syncthreads();
    }
    if (live) {
        if (want_out) {
            float inv = 1.0f / l;
#pragma unroll
            for (int e = 0; e < HD; e++) o[row + e] = acc[e] * inv;
        }
        lse[(long)bh * T + i] = m + logf(l);
    }
}

// dq, and each query row's dot(do, o) (`dots`, which dk needs).
extern "C" __global__ void attn_dq(const float* q, const float* k, const float* v, const float* o,
                                   const float* dout, const float* lse, float* dq, float* dots,
                                   int B, int T, int S, int H, float scale, int causal,
                                   int window) {
    __shared__ float ks[BK][HD];
    __shared__ float vs[BK][HD];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int i0 = blockIdx.x * BQ, i = i0 + threadIdx.x;
    bool live = i < T;
    float qr[HD], dor[HD], acc[HD];
    long row = (((long)b * T + i) * H + h) * HD;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < HD; e++) {
        qr[e] = live ? q[row + e] * scale : 0.0f;
        dor[e] = live ? dout[row + e] : 0.0f;
        dot += live ? dor[e] * o[row + e] : 0.0f;
        acc[e] = 0.0f;
    }
    float li = live ? lse[(long)bh * T + i] : 0.0f;
    int lo, hi;
    key_range(i0, min(T, i0 + BQ) - 1, S, causal, window, &lo, &hi);
    for (int j0 = lo; j0 < hi; j0 += BK) {
        load_tile(ks, k, b, S, H, h, j0, 1.0f);
        load_tile(vs, v, b, S, H, h, j0, 1.0f);
        __syncthreads();
        if (live) {
            for (int jj = 0; jj < BK; jj++) {
                int j = j0 + jj;
                if (j >= S || !sees(i, j, causal, window)) continue;
                // Four partial sums each: independent chains the SM overlaps.
                float sp[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dpp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int e = 0; e < HD; e++) {
                    sp[e & 3] += qr[e] * ks[jj][e];
                    dpp[e & 3] += dor[e] * vs[jj][e];
                }
                float s = (sp[0] + sp[1]) + (sp[2] + sp[3]);
                float dp = (dpp[0] + dpp[1]) + (dpp[2] + dpp[3]);
                float ds = expf(s - li) * (dp - dot);
#pragma unroll
                for (int e = 0; e < HD; e++) acc[e] += ds * ks[jj][e];
            }
        }
        __syncthreads();
    }
    if (live) {
#pragma unroll
        for (int e = 0; e < HD; e++) dq[row + e] = acc[e] * scale;
        dots[(long)bh * T + i] = dot;
    }
}

// dv (want_dk == 0) or dk (want_dk == 1) for one key row per thread.
extern "C" __global__ void attn_dkv(const float* q, const float* k, const float* v,
                                    const float* dout, const float* lse, const float* dots,
                                    float* dx, int B, int T, int S, int H, float scale,
                                    int causal, int window, int want_dk) {
    __shared__ float qs[BK][HD];
    __shared__ float ds_[BK][HD];
    __shared__ float ls[BK];
    __shared__ float dts[BK];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int j0 = blockIdx.x * BQ, j = j0 + threadIdx.x;
    bool live = j < S;
    float kr[HD], vr[HD], acc[HD];
    long row = (((long)b * S + j) * H + h) * HD;
#pragma unroll
    for (int e = 0; e < HD; e++) {
        kr[e] = live ? k[row + e] : 0.0f;
        vr[e] = (live && want_dk) ? v[row + e] : 0.0f;
        acc[e] = 0.0f;
    }
    int lo, hi;
    query_range(j0, min(S, j0 + BQ) - 1, T, causal, window, &lo, &hi);
    for (int i0 = lo; i0 < hi; i0 += BK) {
        // Queries pre-scaled: s = (q * scale) . k, and dk = sum ds (q * scale).
        load_tile(qs, q, b, T, H, h, i0, scale);
        load_tile(ds_, dout, b, T, H, h, i0, 1.0f);
        for (int r = threadIdx.x; r < BK; r += blockDim.x) {
            int i = i0 + r;
            ls[r] = i < T ? lse[(long)bh * T + i] : 0.0f;
            dts[r] = i < T ? dots[(long)bh * T + i] : 0.0f;
        }
        __syncthreads();
        if (live) {
            for (int ii = 0; ii < BK; ii++) {
                int i = i0 + ii;
                if (i >= T || !sees(i, j, causal, window)) continue;
                float sp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int e = 0; e < HD; e++) sp[e & 3] += qs[ii][e] * kr[e];
                float p = expf((sp[0] + sp[1]) + (sp[2] + sp[3]) - ls[ii]);
                if (want_dk) {
                    float dpp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int e = 0; e < HD; e++) dpp[e & 3] += ds_[ii][e] * vr[e];
                    float dp = (dpp[0] + dpp[1]) + (dpp[2] + dpp[3]);
                    float g = p * (dp - dts[ii]);
#pragma unroll
                    for (int e = 0; e < HD; e++) acc[e] += g * qs[ii][e];
                } else {
#pragma unroll
                    for (int e = 0; e < HD; e++) acc[e] += p * ds_[ii][e];
                }
            }
        }
        __syncthreads();
    }
    if (live) {
#pragma unroll
        for (int e = 0; e < HD; e++) dx[row + e] = acc[e];
    }
}
