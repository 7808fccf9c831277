// src/prim/{norm,rows,act,sums}.cu and src/optim/adam.cu against f64 references (built by
// tests/gpu_kernels.rs): layer_norm and rms_norm forward and backward with
// their weight gradients' column sums, softmax cross-entropy's two passes
// (labels inside and outside this device's classes), the activations and
// their derivatives (against finite differences; in bf16 too), the broadcast
// binary ops, the sums of squares, and
// AdamW's step against the textbook form (bias corrections not folded).
#include "emu.h"
#include "../../src/prim/norm.cu"
#include "../../src/prim/rows.cu"
#include "../../src/prim/act.cu"
#include "../../src/prim/sums.cu"
#include "../../src/optim/adam.cu"

static void norms(int layer) {
    const int n = 37, d = 100, per = 16;
    auto x = noise((size_t)n * d, 11), w = noise(d, 12), b = noise(d, 13), g = noise((size_t)n * d, 14);
    const double eps = 1e-5;
    std::vector<double> y_ref(x.size()), dx_ref(x.size()), dw_ref(d), db_ref(d);
    for (int r = 0; r < n; r++) {
        const float* xr = &x[(size_t)r * d];
        double mu = 0, var = 0;
        if (layer) {
            for (int c = 0; c < d; c++) mu += xr[c];
            mu /= d;
        }
        for (int c = 0; c < d; c++) var += (xr[c] - mu) * (xr[c] - mu);
        double inv = 1 / std::sqrt(var / d + eps);
        double m1 = 0, m2 = 0;
        for (int c = 0; c < d; c++) {
            double xh = (xr[c] - mu) * inv, dxh = g[(size_t)r * d + c] * w[c];
            y_ref[(size_t)r * d + c] = xh * w[c] + (layer ? b[c] : 0);
            m1 += dxh / d;
            m2 += dxh * xh / d;
            dw_ref[c] += g[(size_t)r * d + c] * xh;
            db_ref[c] += g[(size_t)r * d + c];
        }
        for (int c = 0; c < d; c++) {
            double xh = (xr[c] - mu) * inv, dxh = g[(size_t)r * d + c] * w[c];
            dx_ref[(size_t)r * d + c] = (dxh - (layer ? m1 : 0) - xh * m2) * inv;
        }
    }
    std::vector<float> y(x.size()), dx(x.size()), gx(x.size());
    int chunks = (n + per - 1) / per;
    std::vector<float> pw((size_t)chunks * d), pb((size_t)chunks * d), dw(d, 0), db(d, 0);
    launch({(unsigned)n, 1, 1}, {256, 1, 1}, [&] { norm_fwd(x.data(), w.data(), b.data(), y.data(), d, eps, layer); });
    launch({(unsigned)n, 1, 1}, {256, 1, 1}, [&] { norm_bwd(x.data(), w.data(), g.data(), dx.data(), gx.data(), d, eps, layer); });
    dim3 cg{(unsigned)((d + 127) / 128), (unsigned)chunks, 1};
    launch(cg, {128, 1, 1}, [&] { col_sums(gx.data(), pw.data(), n, d, per); });
    launch(cg, {128, 1, 1}, [&] { col_sums(g.data(), pb.data(), n, d, per); });
    for (int k = 0; k < chunks; k++)
        for (int c = 0; c < d; c++) {
            dw[c] += pw[(size_t)k * d + c];
            db[c] += pb[(size_t)k * d + c];
        }
    const char* name = layer ? "layer_norm" : "rms_norm";
    char what[96];
    std::snprintf(what, sizeof what, "%s forward", name);
    expect_close(what, y, y_ref, 1e-5);
    std::snprintf(what, sizeof what, "%s dx", name);
    expect_close(what, dx, dx_ref, 1e-5);
    std::snprintf(what, sizeof what, "%s dw (column sums)", name);
    expect_close(what, dw, dw_ref, 1e-5);
    if (layer) expect_close("layer_norm db (column sums)", db, db_ref, 1e-5);
}

static void cross_entropy() {
    const int rows = 5, v = 1000;
    const long long off = 100;
    auto x = noise((size_t)rows * v, 21);
    for (auto& z : x) z *= 4;
    std::vector<long long> lab = {150, 99, 1099, 1100, 100};  // in, below, last, above, first
    std::vector<float> m(rows), e(x.size()), se(rows), tgt(rows), d(x.size());
    std::vector<double> e_ref(x.size()), se_ref(rows), tgt_ref(rows), d_ref(x.size());
    const float scale = 0.5f, mul = 2.0f;
    for (int r = 0; r < rows; r++) {
        m[r] = *std::max_element(&x[(size_t)r * v], &x[(size_t)r * v] + v);
        for (int c = 0; c < v; c++) {
            e_ref[(size_t)r * v + c] = std::exp((double)x[(size_t)r * v + c] - m[r]);
            se_ref[r] += e_ref[(size_t)r * v + c];
        }
        long long c = lab[r] - off;
        tgt_ref[r] = (c >= 0 && c < v) ? x[(size_t)r * v + c] : 0.0;
        for (int k = 0; k < v; k++)
            d_ref[(size_t)r * v + k] = (e_ref[(size_t)r * v + k] / se_ref[r] - (k == c)) * scale * mul;
    }
    launch({rows, 1, 1}, {256, 1, 1}, [&] { ce_first(x.data(), m.data(), lab.data(), e.data(), se.data(), tgt.data(), v, off); });
    long long n = (long long)rows * v;
    launch({4, 1, 1}, {256, 1, 1}, [&] { ce_grad(e.data(), se.data(), lab.data(), d.data(), n, v, off, scale, mul); });
    expect_close("cross-entropy exp(x - max)", e, e_ref, 1e-6);
    expect_close("cross-entropy row sums", se, se_ref, 1e-6);
    expect_close("cross-entropy target logits", tgt, tgt_ref, 1e-7);
    expect_close("cross-entropy gradient", d, d_ref, 1e-6);
}

static double act_ref(int a, double x) {
    switch (a) {
    case 0: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case 1: return x / (1 + std::exp(-x));
    case 2: return std::tanh(x);
    case 3: return 1 / (1 + std::exp(-x));
    default: return std::exp(x);
    }
}

static void activations() {
    const char* names[] = {"gelu", "silu", "tanh", "sigmoid", "exp"};
    auto x = noise(4096, 31);
    for (auto& z : x) z *= 6;
    auto ct = noise(x.size(), 32);
    long long n = (long long)x.size();
    for (int a = 0; a < 5; a++) {
        std::vector<float> y(x.size()), g(x.size());
        std::vector<double> y_ref(x.size()), g_ref(x.size());
        for (size_t i = 0; i < x.size(); i++) {
            const double h = 1e-5;
            y_ref[i] = act_ref(a, x[i]);
            g_ref[i] = ct[i] * (act_ref(a, x[i] + h) - act_ref(a, x[i] - h)) / (2 * h);
        }
        launch({4, 1, 1}, {256, 1, 1}, [&] { act_fwd(x.data(), y.data(), n, a); });
        // gelu and silu take the input, the others their output.
        const std::vector<float>& at = a < 2 ? x : y;
        launch({4, 1, 1}, {256, 1, 1}, [&] { act_bwd(at.data(), ct.data(), g.data(), n, a); });
        char what[64];
        std::snprintf(what, sizeof what, "%s forward", names[a]);
        expect_close(what, y, y_ref, 1e-6);
        std::snprintf(what, sizeof what, "%s derivative (finite differences)", names[a]);
        expect_close(what, g, g_ref, 1e-5);
        // bf16: the same functions, widened and rounded once (8 bits: 4e-3).
        std::vector<unsigned short> xb(x.size()), cb(x.size()), yb(x.size()), gb(x.size());
        for (size_t i = 0; i < x.size(); i++) xb[i] = bf16_out(x[i]), cb[i] = bf16_out(ct[i]);
        launch({4, 1, 1}, {256, 1, 1}, [&] { act_fwd_bf16(xb.data(), yb.data(), n, a); });
        const std::vector<unsigned short>& atb = a < 2 ? xb : yb;
        launch({4, 1, 1}, {256, 1, 1}, [&] { act_bwd_bf16(atb.data(), cb.data(), gb.data(), n, a); });
        std::vector<float> yw(x.size()), gw(x.size());
        std::vector<double> yr(x.size()), gr(x.size());
        for (size_t i = 0; i < x.size(); i++) {
            float xi = bf16_in(xb[i]), yi = bf16_in(yb[i]);
            yw[i] = yi, gw[i] = bf16_in(gb[i]);
            yr[i] = act_ref(a, xi);
            gr[i] = (double)bf16_in(cb[i]) * act_df(a, a < 2 ? xi : yi);
        }
        std::snprintf(what, sizeof what, "%s forward (bf16)", names[a]);
        expect_close(what, yw, yr, 8e-3);
        std::snprintf(what, sizeof what, "%s derivative (bf16)", names[a]);
        expect_close(what, gw, gr, 8e-3);
    }
    // Rounding to bfloat16: ties to even, NaN stays NaN, overflow to inf.
    unsigned short r[] = {bf16_out(1.0f), bf16_out(__int_as_float(0x3f808000)),
                          bf16_out(__int_as_float(0x3f818000)), bf16_out(__int_as_float(0x7f7fffff)),
                          bf16_out(__int_as_float(0x7fc00001))};
    bool ok = r[0] == 0x3f80 && r[1] == 0x3f80 && r[2] == 0x3f82 && r[3] == 0x7f80 &&
              (r[4] & 0x7f80) == 0x7f80 && (r[4] & 0x7f) != 0;
    std::printf("%s bf16 rounding: ties to even, NaN, overflow\n", ok ? "ok  " : "FAIL");
    if (!ok) emu_failures++;
}

static void sums() {
    auto x = noise(100003, 41);
    double want = 0;
    for (float v : x) want += (double)v * v;
    std::vector<double> part(256), out(2, -1);
    unsigned blocks = min(256u, (unsigned)((x.size() + 255) / 256));
    long long n = (long long)x.size();
    launch({blocks, 1, 1}, {256, 1, 1}, [&] { sq_part(x.data(), n, part.data()); });
    launch({1, 1, 1}, {1, 1, 1}, [&] { sq_total(part.data(), (int)blocks, out.data(), 1); });
    expect_close("sum of squares", {(float)out[1]}, {want}, 1e-7);
    expect_close("sum of squares leaves other slots", {(float)out[0]}, {-1}, 0);
}

static void adam() {
    const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, lr = 0.1, s = 0.5;
    const int t = 3;
    auto p = noise(5000, 51), g = noise(p.size(), 52), m = noise(p.size(), 53), v = noise(p.size(), 54);
    for (auto& x : v) x = x * x;  // second moments are not negative
    std::vector<double> p_ref(p.size()), m_ref(p.size()), v_ref(p.size());
    double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < p.size(); i++) {
        double gi = s * g[i];
        m_ref[i] = b1 * m[i] + (1 - b1) * gi;
        v_ref[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = m_ref[i] / c1, vh = v_ref[i] / c2;
        p_ref[i] = p[i] - lr * (mh / (std::sqrt(vh) + eps) + wd * p[i]);
    }
    // As OnePass (src/optim/adam.rs): the gradient's scale folded into b and d.
    double r2 = std::sqrt(c2), k = r2 / c1, e = eps * r2;
    long long n = (long long)p.size();
    launch({4, 1, 1}, {256, 1, 1}, [&] {
        adam_step(p.data(), m.data(), v.data(), g.data(), n, b1, (1 - b1) * s, b2, (1 - b2) * s * s, k, e, wd, lr);
    });
    expect_close("adamw first moments", m, m_ref, 1e-6);
    expect_close("adamw second moments", v, v_ref, 1e-6);
    // The step itself (not the parameters, which it moves by a tenth).
    std::vector<float> step(p.size());
    std::vector<double> step_ref(p.size());
    auto p0 = noise(p.size(), 51);
    for (size_t i = 0; i < p.size(); i++) {
        step[i] = p[i] - p0[i];
        step_ref[i] = p_ref[i] - p0[i];
    }
    expect_close("adamw step", step, step_ref, 1e-5);
}

// The broadcast ops: a row of nb repeated over n / nb rows, each way round;
// every value equals the one f32 op (rounded once to bf16 in bf16).
static void broadcasts() {
    const char* names[] = {"add", "sub", "mul", "div"};
    const long long nb = 300, n = 37 * nb;
    auto a = noise(n, 41), b = noise(nb, 42);
    for (auto& y : b) y += 2.5f; // no division by zero
    for (int op = 0; op < 4; op++)
        for (int flip = 0; flip < 2; flip++) {
            std::vector<float> out(n), want(n);
            std::vector<unsigned short> ab(n), bb(nb), ob(n);
            for (long long i = 0; i < n; i++) ab[i] = bf16_out(a[i]);
            for (long long j = 0; j < nb; j++) bb[j] = bf16_out(b[j]);
            launch({8, 1, 1}, {256, 1, 1}, [&] { bcast_f32(a.data(), b.data(), out.data(), n, nb, op, flip); });
            launch({8, 1, 1}, {256, 1, 1}, [&] { bcast_bf16(ab.data(), bb.data(), ob.data(), n, nb, op, flip); });
            bool ok = true;
            for (long long i = 0; i < n; i++) {
                float x = a[i], y = b[i % nb];
                float w = flip ? bin(op, y, x) : bin(op, x, y);
                float xb = bf16_in(ab[i]), yb = bf16_in(bb[i % nb]);
                unsigned short wb = bf16_out(flip ? bin(op, yb, xb) : bin(op, xb, yb));
                ok = ok && out[i] == w && ob[i] == wb;
            }
            // And against the plain arithmetic, so that `bin` itself is checked.
            float x = a[nb + 7], y = b[7];
            float plain[] = {x + y, x - y, x * y, x / y}, flipped[] = {y + x, y - x, y * x, y / x};
            ok = ok && out[nb + 7] == (flip ? flipped : plain)[op];
            std::printf("%s broadcast %s%s: f32 and bf16 over %lld values\n", ok ? "ok  " : "FAIL",
                        names[op], flip ? " (row first)" : "", n);
            if (!ok) emu_failures++;
        }
}

int main() {
    adam();
    norms(1);
    norms(0);
    cross_entropy();
    activations();
    sums();
    broadcasts();
    return emu_failures == 0 ? 0 : 1;
}
