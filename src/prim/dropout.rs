//! `dropout(x, rate)`: during training each element is zeroed with probability
//! `rate` and the rest scaled by 1/(1 − rate); the mask is a hash of (seed,
//! step, microbatch, node, global element index), so it does not depend on the
//! mesh. Identity in eval. Layout and pending kept.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, number, Call, Rules, Typed};
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
        Some(e) => match number(e) {
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
        let idx = k.global_indices(t)?;
        let keep = 1.0 / (1.0 - self.rate);
        let v: Vec<f64> = idx
            .iter()
            .map(|g| {
                if crate::init::uniform(seed, *g) < self.rate {
                    0.0
                } else {
                    keep
                }
            })
            .collect();
        let shape = k.local_shape(t)?;
        k.floats(v, &shape)
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
                    saved: Some(mask),
                })
            }
            _ => Forward::of(x[0].clone()),
        }
    }

    fn vjp(&self, _k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![Some(match g.saved {
            Some(m) => g.g.broadcast_mul(m).map_err(ce)?,
            None => g.g.clone(),
        })])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
