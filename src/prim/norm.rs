//! `layer_norm(x, scale, bias)` and `rms_norm(x, scale)` over the last
//! dimension, `eps` 1e-5 unless given (flax and PyTorch). The normalized
//! dimension must be whole on every device (gathered, and reported, when
//! split); a split scale or bias is gathered too.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, rank_error, replicate_dim, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::diag::Problem;
use crate::types::TType;
use candle_core::{Tensor, D};

const RULE: &str = "over the last dim; input reduced; `scale`/`bias` are `[D]` and reduced; the last dim (and a split scale or bias) gathered if split; `eps:` a positive number (default 1e-5)";

pub const DEFS: &[Def] = &[
    Def {
        name: "layer_norm",
        kind: Kind::Function,
        signature: "layer_norm(x, scale, bias, eps: 1e-5)",
        rule: RULE,
        check: Some(check),
        examples: &[
            "layer_norm({x: f32[4, 6]}, {s: f32[6]}, {b: f32[6]})",
            "layer_norm({x: f32[2, 4, 6]}, {s: f32[6]}, {b: f32[6]}, eps: 0.1)",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "rms_norm",
        kind: Kind::Function,
        signature: "rms_norm(x, scale, eps: 1e-5)",
        rule: RULE,
        check: Some(check),
        examples: &["rms_norm({x: f32[4, 6]}, {s: f32[6]})"],
        differentiable: true,
        same_on_one_device: true,
    },
];

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormKind {
    Layer,
    Rms,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Norm {
    pub kind: NormKind,
    pub eps: f64,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let kind = if c.name == "layer_norm" {
        NormKind::Layer
    } else {
        NormKind::Rms
    };
    let n_params = if kind == NormKind::Layer { 3 } else { 2 };
    if !arity(cx, c, n_params, n_params) || !known_named(cx, c, &["eps"]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], &format!("`{}`", c.name))?;
    if !cx.need_reduced(&t, c.name, c.pos[0]) {
        return None;
    }
    if t.rank() == 0 {
        rank_error(cx, c.pos[0], 1, &t);
        return None;
    }
    let last = t.dims[t.rank() - 1].size.clone();
    for i in 1..n_params {
        let w = cx.tensor(c.pos[i], "a normalization scale or bias")?;
        if w.rank() != 1 || w.dims[0].size != last {
            cx.report(Problem::Mismatch {
                span: c.pos[i].span,
                expected: format!("{}[{last}]", t.dtype.name()),
                found: w.to_string(),
                decl: None,
                detail: format!("must match the normalized dimension, {last}"),
            });
            return None;
        }
        if !cx.need_reduced(&w, c.name, c.pos[i]) {
            return None;
        }
        replicate_dim(cx, &w, 0, c.pos[i].span);
    }
    let eps = match c.named_expr("eps") {
        None => 1e-5,
        Some(e) => match cx.number(e) {
            Some(v) if v > 0.0 => v,
            _ => {
                cx.report(Problem::BadValue {
                    span: e.span,
                    message: "`eps` must be a positive number".into(),
                    help: Some("write `eps: 1e-6`".into()),
                });
                return None;
            }
        },
    };
    let out = replicate_dim(cx, &t, t.rank() - 1, c.span());
    Typed::new(out, Norm { kind, eps })
}

/// `t` with its first dim whole (a scale or bias as the kernel uses it).
fn whole(t: &TType) -> TType {
    let mut w = t.clone();
    if let Some(d) = w.dims.first_mut() {
        d.axes.clear();
    }
    w
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> R<Tensor> {
    let (xhat, _) = rms_stats(x, eps)?;
    xhat.broadcast_mul(w).map_err(ce)
}

/// RMS norm's `x̂` and `1 / rms` (what its derivative needs, without the
/// output).
fn rms_stats(x: &Tensor, eps: f64) -> R<(Tensor, Tensor)> {
    let inv = x
        .sqr()
        .and_then(|s| s.mean_keepdim(D::Minus1))
        .and_then(|v| v.affine(1.0, eps))
        .and_then(|v| v.sqrt())
        .and_then(|s| s.recip())
        .map_err(ce)?;
    let xhat = x.broadcast_mul(&inv).map_err(ce)?;
    Ok((xhat, inv))
}

fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> R<Tensor> {
    let (xhat, _) = layer_stats(x, eps)?;
    xhat.broadcast_mul(w)
        .and_then(|t| t.broadcast_add(b))
        .map_err(ce)
}

/// Layer norm's `x̂` and `1 / σ` (what its derivative needs, without the
/// output: each half of a split backward computes them again).
fn layer_stats(x: &Tensor, eps: f64) -> R<(Tensor, Tensor)> {
    let mu = x.mean_keepdim(D::Minus1).map_err(ce)?;
    let xc = x.broadcast_sub(&mu).map_err(ce)?;
    let var = xc
        .sqr()
        .and_then(|s| s.mean_keepdim(D::Minus1))
        .map_err(ce)?;
    let inv = var
        .affine(1.0, eps)
        .and_then(|v| v.sqrt())
        .and_then(|s| s.recip())
        .map_err(ce)?;
    let xhat = xc.broadcast_mul(&inv).map_err(ce)?;
    Ok((xhat, inv))
}

impl Norm {
    /// The operands as the kernel uses them: `x` with its last dim whole, and
    /// whole scales and biases.
    fn operands(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Vec<Tensor>> {
        let mut v = vec![k.reshard(x[0], ts[0], out)?];
        for i in 1..x.len() {
            v.push(k.reshard(x[i], ts[i], &whole(ts[i]))?);
        }
        Ok(v)
    }
}

impl Primitive for Norm {
    fn name(&self) -> &'static str {
        match self.kind {
            NormKind::Layer => "layer_norm",
            NormKind::Rms => "rms_norm",
        }
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn attrs(&self) -> Vec<String> {
        vec![format!("eps: {:?}", self.eps)]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let v = self.operands(k, x, ts, out)?;
        #[cfg(feature = "cuda")]
        {
            let b = (self.kind == NormKind::Layer).then(|| &v[2]);
            if let Some(y) = super::norm_gpu::forward(&v[0], &v[1], b, self.eps) {
                return Forward::of(y.map_err(ce)?);
            }
        }
        let y = match self.kind {
            NormKind::Layer => layer_norm(&v[0], &v[1], &v[2], self.eps)?,
            NormKind::Rms => rms_norm(&v[0], &v[1], self.eps)?,
        };
        Forward::of(y)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let v = self.operands(k, g.x, g.ts, g.out)?;
        let ct = g.g;
        let lead = ct.rank() - 1;
        // A cotangent nobody wants (the other half of a split backward) is
        // not computed; the ones computed have the same bits either way.
        let wanted = |i: usize| g.want.get(i) != Some(&false);
        #[cfg(feature = "cuda")]
        let fused = {
            let b = (self.kind == NormKind::Layer).then(|| &v[2]);
            super::norm_gpu::vjp(&v[0], &v[1], b, ct, self.eps)
                .transpose()
                .map_err(ce)?
                .map(|(dx, dw, db)| {
                    let db = db.map(Some);
                    [Some(Some(dx)), Some(Some(dw)), db]
                        .into_iter()
                        .flatten()
                        .enumerate()
                        .map(|(i, t)| t.filter(|_| wanted(i)))
                        .collect()
                })
        };
        #[cfg(not(feature = "cuda"))]
        let fused: Option<Vec<Option<Tensor>>> = None;
        let mut grads = if let Some(g) = fused {
            g
        } else {
            match self.kind {
                NormKind::Rms => {
                    let (xhat, inv) = rms_stats(&v[0], self.eps)?;
                    let dx = if wanted(0) {
                        let dxhat = ct.broadcast_mul(&v[1]).map_err(ce)?;
                        let m = dxhat
                            .mul(&xhat)
                            .and_then(|t| t.mean_keepdim(D::Minus1))
                            .map_err(ce)?;
                        let dx = dxhat
                            .sub(&xhat.broadcast_mul(&m).map_err(ce)?)
                            .and_then(|t| t.broadcast_mul(&inv))
                            .map_err(ce)?;
                        Some(dx)
                    } else {
                        None
                    };
                    let dw = if wanted(1) {
                        let mut dw = ct.mul(&xhat).map_err(ce)?;
                        for _ in 0..lead {
                            dw = super::reduce_fast::sum(&dw, 0).map_err(ce)?;
                        }
                        Some(dw)
                    } else {
                        None
                    };
                    vec![dx, dw]
                }
                NormKind::Layer => {
                    let (xhat, inv) = layer_stats(&v[0], self.eps)?;
                    let dx = if wanted(0) {
                        let dxhat = ct.broadcast_mul(&v[1]).map_err(ce)?;
                        let m1 = dxhat.mean_keepdim(D::Minus1).map_err(ce)?;
                        let m2 = dxhat
                            .mul(&xhat)
                            .and_then(|t| t.mean_keepdim(D::Minus1))
                            .map_err(ce)?;
                        let dx = dxhat
                            .broadcast_sub(&m1)
                            .and_then(|t| t.broadcast_sub(&xhat.broadcast_mul(&m2)?))
                            .and_then(|t| t.broadcast_mul(&inv))
                            .map_err(ce)?;
                        Some(dx)
                    } else {
                        None
                    };
                    let summed = |t: Tensor| -> R<Tensor> {
                        let mut t = t;
                        for _ in 0..lead {
                            t = super::reduce_fast::sum(&t, 0).map_err(ce)?;
                        }
                        Ok(t)
                    };
                    let dw = match wanted(1) {
                        true => Some(summed(ct.mul(&xhat).map_err(ce)?)?),
                        false => None,
                    };
                    let db = match wanted(2) {
                        true => Some(summed(ct.clone())?),
                        false => None,
                    };
                    vec![dx, dw, db]
                }
            }
        };
        // Computed in the gathered layouts: transpose the gathers.
        if let Some(dx) = grads[0].as_mut().filter(|_| g.ts[0].dims != g.out.dims) {
            *dx = k.reshard_t(dx, g.ts[0], g.out)?;
        }
        for (gi, t) in grads.iter_mut().zip(g.ts).skip(1) {
            let w = whole(t);
            if let Some(gi) = gi.as_mut().filter(|_| t.dims != w.dims) {
                *gi = k.reshard_t(gi, t, &w)?;
            }
        }
        Ok(grads)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let mut comms = super::reshard::comms(c, ts[0], out);
        for t in &ts[1..] {
            comms.extend(super::reshard::comms(c, t, &whole(t)));
        }
        Some(Cost { flops: 0.0, comms })
    }
}
