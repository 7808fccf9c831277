//! Each optimizer against its published update formula, in f64 on plain
//! numbers (Lion: `optax.lion`; Muon: Jordan et al.'s Newton–Schulz with
//! Moonlight's scale), and Adam's fused kernels against their composed ops.

use super::*;
use candle_core::{DType, Device, Tensor};

fn t(v: &[f64], dims: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims, &Device::Cpu).expect("tensor")
}

fn vals(x: &Tensor) -> Vec<f64> {
    x.flatten_all()
        .and_then(|x| x.to_dtype(DType::F64))
        .and_then(|x| x.to_vec1::<f64>())
        .expect("values")
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// Lion over three steps, against `c = b1·m + (1 − b1)·g; p ← p − lr·(sign(c)
/// + wd·p); m ← b2·m + (1 − b2)·g` written out per element.
#[test]
fn lion_follows_its_formula() {
    let (b1, b2, wd, lr) = (0.9, 0.99, 0.01, 0.05);
    let lion = lion::Lion {
        b1,
        b2,
        weight_decay: wd,
    };
    let mut p: Vec<f64> = vec![0.5, -0.25, 0.0, 1.5, -2.0, 0.125];
    let mut m = vec![0.0; 6];
    let (mut tp, mut tm) = (t(&p, &[2, 3]), t(&m, &[2, 3]));
    for step in 1..=3 {
        let g: Vec<f64> = (0..6)
            .map(|i| ((i * 7 + step) as f64 * 0.61).sin())
            .collect();
        let (d, nm, _) = lion
            .composed(lr, step, &tp, &t(&g, &[2, 3]), Some(&tm), None, &Local)
            .expect("step");
        tp = (&tp - d.affine(lr, 0.0).expect("lr·d")).expect("p");
        tm = nm.expect("m");
        for i in 0..6 {
            let c = b1 * m[i] + (1.0 - b1) * g[i];
            let sign = if c > 0.0 {
                1.0
            } else if c < 0.0 {
                -1.0
            } else {
                0.0
            };
            p[i] -= lr * (sign + wd * p[i]);
            m[i] = b2 * m[i] + (1.0 - b2) * g[i];
        }
        close(&vals(&tp), &p, 1e-15, "p");
        close(&vals(&tm), &m, 1e-15, "m");
    }
}

/// Plain matrices in f64, for the reference.
fn matmul(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            out[i * m + j] = (0..k).map(|l| a[i * k + l] * b[l * m + j]).sum();
        }
    }
    out
}

fn transpose(a: &[f64], n: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            out[j * n + i] = a[i * m + j];
        }
    }
    out
}

/// Newton–Schulz as Jordan et al. write it: X = G/(‖G‖ + 1e-7), transposed
/// when tall; `steps` times A = XXᵀ, B = bA + cA², X = aX + BX.
fn newton_schulz(g: &[f64], rows: usize, cols: usize, steps: usize) -> Vec<f64> {
    let (a, b, c) = muon::NS;
    let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
    let mut x: Vec<f64> = g.iter().map(|v| v / (norm + 1e-7)).collect();
    let tall = rows > cols;
    let (n, k) = if tall { (cols, rows) } else { (rows, cols) };
    if tall {
        x = transpose(&x, rows, cols);
    }
    for _ in 0..steps {
        let xt = transpose(&x, n, k);
        let am = matmul(&x, &xt, n, k, n);
        let aa = matmul(&am, &am, n, n, n);
        let bm: Vec<f64> = am.iter().zip(&aa).map(|(p, q)| b * p + c * q).collect();
        let bx = matmul(&bm, &x, n, n, k);
        x = x.iter().zip(&bx).map(|(p, q)| a * p + q).collect();
    }
    if tall {
        x = transpose(&x, n, k);
    }
    x
}

/// Muon over three steps on a tall and a wide matrix, against the momentum,
/// Nesterov, Newton–Schulz and Moonlight's 0.2·√max(A, B) scale written out.
#[test]
fn muon_follows_its_formula() {
    let (mu, wd, lr, steps) = (0.95, 0.01, 0.02, 5);
    let muon = muon::Muon {
        momentum: mu,
        nesterov: true,
        ns_steps: steps,
        weight_decay: wd,
    };
    for (rows, cols) in [(5usize, 3usize), (3, 4)] {
        let n = rows * cols;
        let mut p: Vec<f64> = (0..n).map(|i| (i as f64 * 0.3).cos()).collect();
        let mut m = vec![0.0; n];
        let (mut tp, mut tm) = (t(&p, &[rows, cols]), t(&m, &[rows, cols]));
        for step in 1..=3 {
            let g: Vec<f64> = (0..n)
                .map(|i| ((i * 5 + step) as f64 * 0.47).sin())
                .collect();
            let (d, nm, _) = muon
                .composed(
                    lr,
                    step as i32,
                    &tp,
                    &t(&g, &[rows, cols]),
                    Some(&tm),
                    None,
                    &Local,
                )
                .expect("step");
            tp = (&tp - d.affine(lr, 0.0).expect("lr·d")).expect("p");
            tm = nm.expect("m");
            for i in 0..n {
                m[i] = mu * m[i] + g[i];
            }
            let u: Vec<f64> = (0..n).map(|i| g[i] + mu * m[i]).collect();
            let o = newton_schulz(&u, rows, cols, steps);
            let scale = 0.2 * (rows.max(cols) as f64).sqrt();
            for i in 0..n {
                p[i] -= lr * (scale * o[i] + wd * p[i]);
            }
            close(&vals(&tm), &m, 1e-14, "m");
            close(
                &vals(&tp),
                &p,
                1e-12,
                &format!("p {rows}×{cols}, step {step}"),
            );
        }
    }
}

/// Newton–Schulz brings a well-conditioned matrix's singular values into
/// the quintic's band around 1 (Jordan et al.: about 0.7 to 1.2), whatever
/// its scale: OOᵀ is near the identity.
#[test]
fn newton_schulz_nearly_orthogonalises() {
    let (n, k) = (4, 6);
    let g: Vec<f64> = (0..n * k)
        .map(|i| 30.0 * (f64::from(u8::from(i / k == i % k)) + 0.2 * ((i * 3) as f64 * 0.71).sin()))
        .collect();
    let o = vals(&muon::orthogonalize(&t(&g, &[n, k]), 5).expect("ns"));
    let oot = matmul(&o, &transpose(&o, n, k), n, k, n);
    for i in 0..n {
        for j in 0..n {
            let d = oot[i * n + j];
            if i == j {
                assert!((0.5..1.5).contains(&d), "diagonal {i}: {d}");
            } else {
                assert!(d.abs() < 0.3, "off the diagonal ({i}, {j}): {d}");
            }
        }
    }
}

/// optax's default Adam moments, with AdamW's decay when given.
fn adam_with(weight_decay: Option<f64>) -> adam::Adam {
    adam::Adam {
        b1: 0.9,
        b2: 0.999,
        eps: 1e-8,
        weight_decay,
    }
}

/// Adam's one-pass step has the bits of its three passes, for f32 and f64,
/// on views that start inside their storage, over steps with clipping, and
/// shared over two threads of the worker pool (in 6 parts).
#[test]
fn adams_one_pass_has_the_bits_of_three() {
    crate::pool::set_threads(2);
    let dev = Device::Cpu;
    let adam = adam_with(Some(0.01));
    for dt in [DType::F32, DType::F64] {
        let n = 100_000;
        let wave = |k: f64| -> Tensor {
            let v: Vec<f64> = (0..n + 7).map(|i| ((i as f64 + k) * 0.37).sin()).collect();
            Tensor::from_vec(v, n + 7, &dev)
                .and_then(|t| t.to_dtype(dt))
                .and_then(|t| t.narrow(0, 7, n))
                .expect("tensor")
        };
        // Two copies of p, m, v (each a view 7 elements into its storage);
        // the moments start at zero, as they do in a run.
        let fresh = || -> Vec<Tensor> {
            [1.0, 0.0, 0.0]
                .iter()
                .map(|k| {
                    wave(0.0)
                        .affine(*k, 0.0)
                        .and_then(|t| t.pad_with_zeros(0, 7, 0))
                        .and_then(|t| t.narrow(0, 7, n))
                        .expect("state")
                })
                .collect()
        };
        let (one, three) = (fresh(), fresh());
        let bits = |t: &Tensor| -> Vec<u64> {
            let v = t.to_dtype(DType::F64).and_then(|t| t.to_vec1::<f64>());
            v.expect("values").iter().map(|x| x.to_bits()).collect()
        };
        for step in 1..=3 {
            let g = wave(step as f64 * 11.0);
            let s = if step == 2 { 0.5 } else { 1.0 };
            let k = adam.one_pass(0.05, step, s);
            k.run(&one[0], &g, &one[1], &one[2]).expect("one pass");
            k.three_passes(&three[0], &g, &three[1], &three[2])
                .expect("three passes");
            for (x, y) in one.iter().zip(&three) {
                assert_eq!(bits(x), bits(y), "{dt:?}, step {step}");
            }
        }
        assert_ne!(bits(&one[0]), bits(&wave(0.0)), "{dt:?}: p did not step");
    }
}

/// A gradient that shares the parameter's storage takes the three passes
/// (the one pass would wait on its own lock) and gives their bits.
#[test]
fn adam_with_a_gradient_sharing_the_parameter_steps() {
    let dev = Device::Cpu;
    let adam = adam_with(None);
    let v: Vec<f32> = (0..64).map(|i| (i as f32 * 0.3).sin()).collect();
    let p = Tensor::from_vec(v, 64, &dev).expect("p");
    let (m, s) = (p.zeros_like().expect("m"), p.zeros_like().expect("v"));
    let (p2, m2, s2) = (
        p.copy().expect("p2"),
        m.copy().expect("m2"),
        s.copy().expect("v2"),
    );
    let g2 = p.copy().expect("g2");
    adam.fused(0.1, 1, &p, &p.clone(), 1.0, Some(&m), Some(&s))
        .expect("shared");
    adam.one_pass(0.1, 1, 1.0)
        .three_passes(&p2, &g2, &m2, &s2)
        .expect("three");
    for (x, y) in [(&p, &p2), (&m, &m2), (&s, &s2)] {
        assert_eq!(
            x.to_vec1::<f32>().expect("x"),
            y.to_vec1::<f32>().expect("y")
        );
    }
}
