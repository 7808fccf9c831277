// Fused attention for a GPU (src/prim/flash.rs compiles this with NVRTC, HD
// the head dim, defined before this text). FlashAttention-2's algorithm on the
// CUDA cores, in f32: a block of THREADS threads owns a tile of query rows
// (forward, dq) or key rows (dk and dv together); the other side's rows stream
// through shared memory in tiles of TS rows, and the softmax is online, so the
// [T, S] scores never exist in memory. Each tile product is register-blocked:
// thread (ty, tx) of a 16 x 8 grid holds rows ty + 16a of its own tile and
// columns tx + 8c of the streamed one (or of the head dim), so each value read
// from shared memory feeds several multiply-adds. No atomics: every output is
// one thread's sum in a fixed order, so a run keeps its bits.
// Layouts: q, o, do [B, T, H, HD]; k, v [B, S, H, HD]; lse and the rows' dots
// [B, H, T]. Query i sees key j when
// (!causal || j <= i) && (window <= 0 || |i - j| < window).

#define THREADS 128
// Rows of a streamed tile, and of the derivative kernels' own tile.
#define TS (HD > 64 ? 16 : 32)
// Rows of the forward's own (query) tile.
#define FQ (2 * TS)
// A shared tile's row stride: one float of padding, so the 8 rows the lanes of
// a column group read sit in 8 different banks.
#define LD (HD + 1)
// Head-dim columns per thread (tx + 8d).
#define CE ((HD + 7) / 8)
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

// Rows [r0, r0 + rows) of x (row stride H * HD, head h), times mul, into tile
// (row stride LD); zeros past n.
__device__ __forceinline__ void load_rows(float* tile, int rows, const float* x, int b, int n,
                                          int H, int h, int r0, float mul) {
    for (int x_ = threadIdx.x; x_ < rows * HD; x_ += THREADS) {
        int r = x_ / HD, e = x_ % HD;
        int row = r0 + r;
        tile[r * LD + e] = row < n ? x[(((long)b * n + row) * H + h) * HD + e] * mul : 0.0f;
    }
}

// out[a][c] = sum_e A[ty + 16a][e] * B[tx + 8c][e]: a tile of A B^T.
template <int RA, int CB>
__device__ __forceinline__ void dot_rows(float (*out)[CB], const float* A, const float* B, int ty,
                                         int tx) {
#pragma unroll
    for (int a = 0; a < RA; a++)
#pragma unroll
        for (int c = 0; c < CB; c++) out[a][c] = 0.0f;
#pragma unroll 8
    for (int e = 0; e < HD; e++) {
        float x[RA], y[CB];
#pragma unroll
        for (int a = 0; a < RA; a++) x[a] = A[(ty + 16 * a) * LD + e];
#pragma unroll
        for (int c = 0; c < CB; c++) y[c] = B[(tx + 8 * c) * LD + e];
#pragma unroll
        for (int a = 0; a < RA; a++)
#pragma unroll
            for (int c = 0; c < CB; c++) out[a][c] += x[a] * y[c];
    }
}

// acc[a][d] += sum_j P[ty + 16a][j] * X[j][tx + 8d] over the TS rows of X: a
// tile of P X, P with row stride TS + 1.
template <int RA>
__device__ __forceinline__ void add_product(float (*acc)[CE], const float* P, const float* X,
                                            int ty, int tx) {
#pragma unroll 4
    for (int j = 0; j < TS; j++) {
        float p[RA], x[CE];
#pragma unroll
        for (int a = 0; a < RA; a++) p[a] = P[(ty + 16 * a) * (TS + 1) + j];
#pragma unroll
        for (int d = 0; d < CE; d++) x[d] = tx + 8 * d < HD ? X[j * LD + tx + 8 * d] : 0.0f;
#pragma unroll
        for (int a = 0; a < RA; a++)
#pragma unroll
            for (int d = 0; d < CE; d++) acc[a][d] += p[a] * x[d];
    }
}

// Across the 8 lanes of a column group (consecutive lanes of one warp).
__device__ __forceinline__ float group_max(float v) {
    for (int o = 4; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float group_sum(float v) {
    for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Forward: o = softmax(q k^T * scale, masked) v and lse per query row; with
// want_out == 0 only lse (the derivative's recomputation).
extern "C" __global__ void attn_fwd(const float* q, const float* k, const float* v, float* o,
                                    float* lse, int B, int T, int S, int H, float scale,
                                    int causal, int window, int want_out) {
    const int RA = FQ / 16, CS = TS / 8;
    __shared__ float qs[FQ * LD];
    __shared__ float ks[TS * LD];
    __shared__ float vs[TS * LD];
    __shared__ float ps[FQ * (TS + 1)];
    int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int i0 = blockIdx.x * FQ;
    load_rows(qs, FQ, q, b, T, H, h, i0, scale);
    float m[RA], l[RA], acc[RA][CE];
#pragma unroll
    for (int a = 0; a < RA; a++) {
        m[a] = NEG_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int d = 0; d < CE; d++) acc[a][d] = 0.0f;
    }
    int lo, hi;
    key_range(i0, min(T, i0 + FQ) - 1, S, causal, window, &lo, &hi);
    for (int j0 = lo; j0 < hi; j0 += TS) {
        __syncthreads();
        load_rows(ks, TS, k, b, S, H, h, j0, 1.0f);
        if (want_out) load_rows(vs, TS, v, b, S, H, h, j0, 1.0f);
        __syncthreads();
        float s[RA][CS];
        dot_rows<RA, CS>(s, qs, ks, ty, tx);
#pragma unroll
        for (int a = 0; a < RA; a++) {
            int i = i0 + ty + 16 * a;
            float mt = NEG_INF;
#pragma unroll
            for (int c = 0; c < CS; c++) {
                int j = j0 + tx + 8 * c;
                if (j >= S || !sees(i, j, causal, window)) s[a][c] = NEG_INF;
                mt = fmaxf(mt, s[a][c]);
            }
            float mn = fmaxf(m[a], group_max(mt));
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < CS; c++) {
                float p = s[a][c] == NEG_INF ? 0.0f : expf(s[a][c] - mn);
                sum += p;
                ps[(ty + 16 * a) * (TS + 1) + tx + 8 * c] = p;
            }
            sum = group_sum(sum);
            // m == -inf: nothing seen yet, l and acc are still zero.
            float corr = m[a] == NEG_INF ? 0.0f : expf(m[a] - mn);
            l[a] = l[a] * corr + sum;
            m[a] = mn;
#pragma unroll
            for (int d = 0; d < CE; d++) acc[a][d] *= corr;
        }
        if (want_out) {
            __syncthreads();
            add_product<RA>(acc, ps, vs, ty, tx);
        }
    }
#pragma unroll
    for (int a = 0; a < RA; a++) {
        int i = i0 + ty + 16 * a;
        if (i >= T) continue;
        long row = (((long)b * T + i) * H + h) * HD;
        if (want_out) {
            float inv = 1.0f / l[a];
#pragma unroll
            for (int d = 0; d < CE; d++)
                if (tx + 8 * d < HD) o[row + tx + 8 * d] = acc[a][d] * inv;
        }
        if (tx == 0) lse[(long)bh * T + i] = m[a] + logf(l[a]);
    }
}

// dq, and each query row's dot(do, o) (`dots`, which dk needs).
extern "C" __global__ void attn_dq(const float* q, const float* k, const float* v, const float* o,
                                   const float* dout, const float* lse, float* dq, float* dots,
                                   int B, int T, int S, int H, float scale, int causal,
                                   int window) {
    const int RA = TS / 16, CS = TS / 8;
    __shared__ float qs[TS * LD];
    __shared__ float dos[TS * LD];
    __shared__ float ks[TS * LD];
    __shared__ float vs[TS * LD];
    __shared__ float ps[TS * (TS + 1)];
    int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int i0 = blockIdx.x * TS;
    load_rows(qs, TS, q, b, T, H, h, i0, scale);
    load_rows(dos, TS, dout, b, T, H, h, i0, 1.0f);
    float li[RA], dot[RA], acc[RA][CE];
#pragma unroll
    for (int a = 0; a < RA; a++) {
        int i = i0 + ty + 16 * a;
        long row = (((long)b * T + i) * H + h) * HD;
        float part = 0.0f;
#pragma unroll
        for (int d = 0; d < CE; d++) {
            int e = tx + 8 * d;
            if (i < T && e < HD) part += dout[row + e] * o[row + e];
            acc[a][d] = 0.0f;
        }
        dot[a] = group_sum(part);
        li[a] = i < T ? lse[(long)bh * T + i] : 0.0f;
    }
    int lo, hi;
    key_range(i0, min(T, i0 + TS) - 1, S, causal, window, &lo, &hi);
    for (int j0 = lo; j0 < hi; j0 += TS) {
        __syncthreads();
        load_rows(ks, TS, k, b, S, H, h, j0, 1.0f);
        load_rows(vs, TS, v, b, S, H, h, j0, 1.0f);
        __syncthreads();
        float s[RA][CS], dp[RA][CS];
        dot_rows<RA, CS>(s, qs, ks, ty, tx);
        dot_rows<RA, CS>(dp, dos, vs, ty, tx);
#pragma unroll
        for (int a = 0; a < RA; a++) {
            int i = i0 + ty + 16 * a;
#pragma unroll
            for (int c = 0; c < CS; c++) {
                int j = j0 + tx + 8 * c;
                bool on = i < T && j < S && sees(i, j, causal, window);
                ps[(ty + 16 * a) * (TS + 1) + tx + 8 * c] =
                    on ? expf(s[a][c] - li[a]) * (dp[a][c] - dot[a]) : 0.0f;
            }
        }
        __syncthreads();
        add_product<RA>(acc, ps, ks, ty, tx);
    }
#pragma unroll
    for (int a = 0; a < RA; a++) {
        int i = i0 + ty + 16 * a;
        if (i >= T) continue;
        long row = (((long)b * T + i) * H + h) * HD;
#pragma unroll
        for (int d = 0; d < CE; d++)
            if (tx + 8 * d < HD) dq[row + tx + 8 * d] = acc[a][d] * scale;
        if (tx == 0) dots[(long)bh * T + i] = dot[a];
    }
}

// dk and dv for a tile of TS key rows: the queries that see them stream by.
extern "C" __global__ void attn_dkv(const float* q, const float* k, const float* v,
                                    const float* dout, const float* lse, const float* dots,
                                    float* dk, float* dv, int B, int T, int S, int H, float scale,
                                    int causal, int window) {
    const int RA = TS / 16, CS = TS / 8;
    __shared__ float ks[TS * LD];
    __shared__ float vs[TS * LD];
    __shared__ float qs[TS * LD];
    __shared__ float dos[TS * LD];
    __shared__ float pt[TS * (TS + 1)];
    __shared__ float dst[TS * (TS + 1)];
    __shared__ float ls[TS];
    __shared__ float dts[TS];
    int tx = threadIdx.x & 7, ty = threadIdx.x >> 3;
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int j0 = blockIdx.x * TS;
    load_rows(ks, TS, k, b, S, H, h, j0, 1.0f);
    load_rows(vs, TS, v, b, S, H, h, j0, 1.0f);
    float ak[RA][CE], av[RA][CE];
#pragma unroll
    for (int a = 0; a < RA; a++)
#pragma unroll
        for (int d = 0; d < CE; d++) ak[a][d] = av[a][d] = 0.0f;
    int lo, hi;
    query_range(j0, min(S, j0 + TS) - 1, T, causal, window, &lo, &hi);
    for (int i0 = lo; i0 < hi; i0 += TS) {
        __syncthreads();
        // Queries pre-scaled: s = (q * scale) . k, and dk = sum ds (q * scale).
        load_rows(qs, TS, q, b, T, H, h, i0, scale);
        load_rows(dos, TS, dout, b, T, H, h, i0, 1.0f);
        for (int r = threadIdx.x; r < TS; r += THREADS) {
            int i = i0 + r;
            ls[r] = i < T ? lse[(long)bh * T + i] : 0.0f;
            dts[r] = i < T ? dots[(long)bh * T + i] : 0.0f;
        }
        __syncthreads();
        // Transposed tiles: key rows (this block's), query columns.
        float st[RA][CS], dpt[RA][CS];
        dot_rows<RA, CS>(st, ks, qs, ty, tx);
        dot_rows<RA, CS>(dpt, vs, dos, ty, tx);
#pragma unroll
        for (int a = 0; a < RA; a++) {
            int j = j0 + ty + 16 * a;
#pragma unroll
            for (int c = 0; c < CS; c++) {
                int r = tx + 8 * c, i = i0 + r;
                bool on = i < T && j < S && sees(i, j, causal, window);
                float p = on ? expf(st[a][c] - ls[r]) : 0.0f;
                pt[(ty + 16 * a) * (TS + 1) + r] = p;
                dst[(ty + 16 * a) * (TS + 1) + r] = p * (dpt[a][c] - dts[r]);
            }
        }
        __syncthreads();
        add_product<RA>(av, pt, dos, ty, tx);
        add_product<RA>(ak, dst, qs, ty, tx);
    }
#pragma unroll
    for (int a = 0; a < RA; a++) {
        int j = j0 + ty + 16 * a;
        if (j >= S) continue;
        long row = (((long)b * S + j) * H + h) * HD;
#pragma unroll
        for (int d = 0; d < CE; d++)
            if (tx + 8 * d < HD) {
                dk[row + tx + 8 * d] = ak[a][d];
                dv[row + tx + 8 * d] = av[a][d];
            }
    }
}
