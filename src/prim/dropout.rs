//! `dropout(x, rate)`: during training each element is zeroed with probability
//! `rate` and the rest scaled by 1/(1 − rate); the mask is a hash of (seed,
//! step, microbatch, node, global element index), so it does not depend on the
//! mesh. Identity in eval. Layout and pending kept.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[Def {
    name: "dropout",
    kind: Kind::Function,
    signature: "dropout(x, rate)",
    rule: "layout and pending kept; `rate` a number in [0, 1) (E0302), positional or named",
    check: Some(check),
    examples: &[
        "dropout({x: f32[4, 6]}, 0.25)",
        "dropout({x: f32[4, 6]}, rate: 0.5)",
    ],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct Dropout {
    pub rate: f64,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 2) || !known_named(cx, c, &["rate"]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`dropout`")?;
    let rate = match c.pos.get(1).copied().or(c.named_expr("rate")) {
        None => 0.0,
        Some(e) => match cx.number(e) {
            Some(r) if (0.0..1.0).contains(&r) => r,
            _ => {
                cx.report(Problem::BadValue {
                    span: e.span,
                    message: "a dropout rate is a number in [0, 1)".into(),
                    help: Some("write `dropout(x, 0.1)`".into()),
                });
                return None;
            }
        },
    };
    Typed::new(t, Dropout { rate })
}

impl Dropout {
    fn mask(&self, k: &Kernel, t: &TType, seed: u64) -> R<Tensor> {
        let (starts, len) = k.global_runs(t)?;
        let keep = 1.0 / (1.0 - self.rate);
        let shape = k.local_shape(t)?;
        // Element by element `uniform(seed, index) < rate`, compared as the
        // integers behind it (init::below), written in the run's dtype (f32:
        // the same bits as converting afterwards, without the f64 copy).
        let cut = crate::init::below(self.rate);
        fn fill<T: Copy>(
            starts: &[u64],
            len: usize,
            seed: u64,
            cut: u64,
            zero: T,
            one: T,
        ) -> Vec<T> {
            let mut v = vec![zero; starts.len() * len];
            if len == 0 {
                return v;
            }
            for (s, out) in starts.iter().zip(v.chunks_exact_mut(len)) {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = if crate::init::bits53(seed, s + j as u64) < cut {
                        zero
                    } else {
                        one
                    };
                }
            }
            v
        }
        if k.dtype == candle_core::DType::F32 {
            let v = fill(&starts, len, seed, cut, 0f32, keep as f32);
            return Tensor::from_vec(v, shape, k.dev).map_err(ce);
        }
        k.floats(fill(&starts, len, seed, cut, 0.0, keep), &shape)
    }
}

impl Primitive for Dropout {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn attrs(&self) -> Vec<String> {
        vec![format!("rate: {:?}", self.rate)]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        match k.dropout_seed {
            Some(seed) if self.rate > 0.0 => {
                let seed = seed ^ (k.node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mask = self.mask(k, ts[0], seed)?;
                let y = x[0].broadcast_mul(&mask).map_err(ce)?;
                Ok(Forward {
                    y,
                    saved: vec![mask],
                })
            }
            _ => Forward::of(x[0].clone()),
        }
    }

    fn vjp(&self, _k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![Some(match g.saved.first() {
            Some(m) => g.g.broadcast_mul(m).map_err(ce)?,
            None => g.g.clone(),
        })])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
