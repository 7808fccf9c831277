// src/prim/flash.cu against naive attention in f64 (tests/gpu_kernels.rs
// builds this with -DHD=8, 64 and 72): outputs, log-sum-exps and all three
// gradients, for causal, windowed, bidirectional and cross attention, at
// lengths that are not multiples of the kernels' tiles.
#include "emu.h"
#include "../../src/prim/flash.cu"

struct Case {
    const char* name;
    int T, S, causal, window;
};

static bool sees_ref(int i, int j, int causal, int window) {
    return (!causal || j <= i) && (window <= 0 || std::abs(i - j) < window);
}

static void run(const Case& c) {
    const int B = 2, H = 3, E = HD, T = c.T, S = c.S;
    auto q = noise((size_t)B * T * H * E, 1), k = noise((size_t)B * S * H * E, 2),
         v = noise((size_t)B * S * H * E, 3), g = noise((size_t)B * T * H * E, 4);
    float scale = 1.0f / std::sqrt((float)E);
    auto at = [&](int b, int t, int n, int h) { return (((size_t)b * n + t) * H + h) * E; };
    std::vector<double> o_ref(q.size()), lse_ref((size_t)B * H * T), dq_ref(q.size()),
        dk_ref(k.size()), dv_ref(v.size());
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            std::vector<double> p((size_t)T * S), dp((size_t)T * S);
            for (int i = 0; i < T; i++) {
                double m = -INFINITY;
                for (int j = 0; j < S; j++) {
                    double s = 0;
                    for (int e = 0; e < E; e++) s += (double)q[at(b, i, T, h) + e] * k[at(b, j, S, h) + e];
                    p[(size_t)i * S + j] = sees_ref(i, j, c.causal, c.window) ? s * scale : -INFINITY;
                    m = max(m, p[(size_t)i * S + j]);
                }
                double z = 0;
                for (int j = 0; j < S; j++) z += std::exp(p[(size_t)i * S + j] - m);
                lse_ref[((size_t)b * H + h) * T + i] = m + std::log(z);
                for (int j = 0; j < S; j++) p[(size_t)i * S + j] = std::exp(p[(size_t)i * S + j] - m) / z;
                for (int e = 0; e < E; e++) {
                    double acc = 0;
                    for (int j = 0; j < S; j++) acc += p[(size_t)i * S + j] * v[at(b, j, S, h) + e];
                    o_ref[at(b, i, T, h) + e] = acc;
                }
                double dot = 0;
                for (int j = 0; j < S; j++) {
                    double d = 0;
                    for (int e = 0; e < E; e++) d += (double)g[at(b, i, T, h) + e] * v[at(b, j, S, h) + e];
                    dp[(size_t)i * S + j] = d;
                    dot += p[(size_t)i * S + j] * d;
                }
                for (int j = 0; j < S; j++) {
                    double ds = p[(size_t)i * S + j] * (dp[(size_t)i * S + j] - dot) * scale;
                    for (int e = 0; e < E; e++) {
                        dq_ref[at(b, i, T, h) + e] += ds * k[at(b, j, S, h) + e];
                        dk_ref[at(b, j, S, h) + e] += ds * q[at(b, i, T, h) + e];
                        dv_ref[at(b, j, S, h) + e] += p[(size_t)i * S + j] * g[at(b, i, T, h) + e];
                    }
                }
            }
        }
    std::vector<float> o(q.size()), lse((size_t)B * H * T), lse2(lse.size()), dq(q.size()),
        dots(lse.size()), dk(k.size()), dv(v.size()), none(1);
    dim3 fgrid{(unsigned)((T + FQ - 1) / FQ), (unsigned)(B * H), 1},
        qgrid{(unsigned)((T + TS - 1) / TS), (unsigned)(B * H), 1},
        kgrid{(unsigned)((S + TS - 1) / TS), (unsigned)(B * H), 1}, block{THREADS, 1, 1};
    launch(fgrid, block, [&] {
        attn_fwd(q.data(), k.data(), v.data(), o.data(), lse.data(), B, T, S, H, scale, c.causal,
                 c.window, 1);
    });
    launch(fgrid, block, [&] {
        attn_fwd(q.data(), k.data(), v.data(), none.data(), lse2.data(), B, T, S, H, scale,
                 c.causal, c.window, 0);
    });
    launch(qgrid, block, [&] {
        attn_dq(q.data(), k.data(), v.data(), o.data(), g.data(), lse2.data(), dq.data(),
                dots.data(), B, T, S, H, scale, c.causal, c.window);
    });
    launch(kgrid, block, [&] {
        attn_dkv(q.data(), k.data(), v.data(), g.data(), lse2.data(), dots.data(), dk.data(),
                 dv.data(), B, T, S, H, scale, c.causal, c.window);
    });
    char what[160];
    const char* parts[] = {"output", "log-sum-exp", "log-sum-exp (lse only)", "dq", "dk", "dv"};
    const std::vector<float>* got[] = {&o, &lse, &lse2, &dq, &dk, &dv};
    const std::vector<double>* want[] = {&o_ref, &lse_ref, &lse_ref, &dq_ref, &dk_ref, &dv_ref};
    for (int x = 0; x < 6; x++) {
        std::snprintf(what, sizeof what, "flash HD=%d %s: %s", HD, c.name, parts[x]);
        expect_close(what, *got[x], *want[x], 2e-5);
    }
}

int main() {
    Case cases[] = {
        {"causal T=200", 200, 200, 1, 0},
        {"causal window 48 T=200", 200, 200, 1, 48},
        {"bidirectional window 48 T=200", 200, 200, 0, 48},
        {"cross T=70 S=130", 70, 130, 0, 0},
        {"bidirectional T=33", 33, 33, 0, 0},
    };
    for (auto& c : cases) run(c);
    return emu_failures == 0 ? 0 : 1;
}
