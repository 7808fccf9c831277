// A CPU stand-in for the CUDA features shardc's kernels (src/prim/*.cu) use,
// so that tests/gpu_kernels.rs can run their logic in CI, where no GPU is:
// every thread of a block is a std::thread, __syncthreads a barrier of the
// block, __shfl_down_sync and __shfl_xor_sync an exchange through a barrier of
// the warp, and __shared__ arrays are statics (blocks run one after another). It checks
// indexing, masking and reductions, not speed nor CUDA's own rounding.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

using std::max;
using std::min;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

inline std::barrier<>* emu_block;
inline std::vector<std::unique_ptr<std::barrier<>>> emu_warps;
inline float emu_lanes[64][32];

inline void __syncthreads() { emu_block->arrive_and_wait(); }

inline float __shfl_down_sync(unsigned, float v, int o) {
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    emu_lanes[w][lane] = v;
    emu_warps[w]->arrive_and_wait();
    float r = lane + o < 32 ? emu_lanes[w][lane + o] : v;
    emu_warps[w]->arrive_and_wait();
    return r;
}

inline float __shfl_xor_sync(unsigned, float v, int o) {
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    emu_lanes[w][lane] = v;
    emu_warps[w]->arrive_and_wait();
    float r = (lane ^ o) < 32 ? emu_lanes[w][lane ^ o] : v;
    emu_warps[w]->arrive_and_wait();
    return r;
}

inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, sizeof i);
    return i;
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

// Run `f` (a call of one kernel) over the grid, one block at a time.
template <class F> void launch(dim3 grid, dim3 block, F f) {
    gridDim = grid;
    blockDim = block;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            std::barrier<> bar(block.x);
            emu_block = &bar;
            emu_warps.clear();
            for (unsigned w = 0; w * 32 < block.x; w++)
                emu_warps.push_back(std::make_unique<std::barrier<>>(min(32u, block.x - w * 32)));
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < block.x; t++)
                ts.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    f();
                });
            for (auto& t : ts) t.join();
        }
}

inline int emu_failures = 0;

// Worst |got - want| over max |want| (1 when want is all zeros).
inline void expect_close(const char* what, const std::vector<float>& got,
                         const std::vector<double>& want, double tol) {
    double scale = 0, worst = 0;
    for (double w : want) scale = max(scale, std::fabs(w));
    if (scale == 0) scale = 1;
    for (size_t i = 0; i < want.size(); i++)
        worst = max(worst, std::fabs((double)got[i] - want[i]) / scale);
    bool ok = got.size() == want.size() && worst <= tol && std::isfinite(worst);
    std::printf("%s %s: worst %.2e of the largest (tol %.0e) over %zu values\n", ok ? "ok  " : "FAIL",
                what, worst, tol, want.size());
    if (!ok) emu_failures++;
}

// A fixed pseudo-random fill in [-1, 1).
inline std::vector<float> noise(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    for (auto& x : v) {
        seed = seed * 1664525u + 1013904223u;
        x = (float)((seed >> 8) * (1.0 / 8388608.0) - 1.0);
    }
    return v;
}
