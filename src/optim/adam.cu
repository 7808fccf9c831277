// Adam/AdamW's step on a GPU, in place and in one pass (src/optim/adam.rs
// launches it for f32 parameters; its CPU pass computes the same). As there,
// the moments are updated and rounded to f32 before the step reads them back,
// the arithmetic is f64, and the bias corrections are folded into k and e:
// m = a m + b g; v = c v + d g^2; p -= lr (m k / (sqrt(v) + e) + wd p).

extern "C" __global__ void adam_step(float* p, float* m, float* v, const float* g, long long n,
                                     double a, double b, double c, double d, double k, double e,
                                     double wd, double lr) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double gi = g[i];
        float mi = (float)(a * (double)m[i] + b * gi);
        float vi = (float)(c * (double)v[i] + d * gi * gi);
        m[i] = mi;
        v[i] = vi;
        double pi = p[i];
        double dp = (double)mi * k / (sqrt((double)vi) + e) + wd * pi;
        p[i] = (float)(pi - lr * dp);
    }
}
