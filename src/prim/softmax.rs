//! `softmax(x, dim)` and `log_softmax(x, dim)`: the normalized dimension must be
//! whole on every device (it is gathered, and the gather reported, when split);
//! the other dimensions keep their layout.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, dim_index, known_named, rank_error, replicate_dim, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::types::TType;
use candle_core::Tensor;

const RULE: &str = "input reduced; `dim` (default last) gathered if split; other dims kept";

pub const DEFS: &[Def] = &[
    Def {
        name: "softmax",
        kind: Kind::Function,
        signature: "softmax(x, dim: -1)",
        rule: RULE,
        check: Some(check),
        examples: &["softmax({x: f32[4, 6]})", "softmax({x: f32[4, 6]}, dim: 0)"],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "log_softmax",
        kind: Kind::Function,
        signature: "log_softmax(x, dim: -1)",
        rule: RULE,
        check: Some(check),
        examples: &[
            "log_softmax({x: f32[4, 6]})",
            "log_softmax({x: f32[4, 6]}, 0)",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
];

#[derive(Clone, Debug, PartialEq)]
pub struct Softmax {
    pub dim: usize,
    /// `log_softmax`.
    pub log: bool,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 2) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], &format!("`{}`", c.name))?;
    if !cx.need_reduced(&t, c.name, c.pos[0]) {
        return None;
    }
    let dim = match c.pos.get(1).copied().or(c.named_expr("dim")) {
        Some(d) => dim_index(cx, d, t.rank())?,
        None if t.rank() > 0 => t.rank() - 1,
        None => {
            rank_error(cx, c.pos[0], 1, &t);
            return None;
        }
    };
    let out = replicate_dim(cx, &t, dim, c.span());
    Typed::new(
        out,
        Softmax {
            dim,
            log: c.name == "log_softmax",
        },
    )
}

pub fn softmax(x: &Tensor, d: usize) -> candle_core::Result<Tensor> {
    let e = x
        .broadcast_sub(&super::reduce_fast::max_keepdim(x, d)?)?
        .exp()?;
    e.broadcast_div(&super::reduce_fast::sum_keepdim(&e, d)?)
}

pub fn log_softmax(x: &Tensor, d: usize) -> candle_core::Result<Tensor> {
    let m = super::reduce_fast::max_keepdim(x, d)?;
    let lse = super::reduce_fast::sum_keepdim(&x.broadcast_sub(&m)?.exp()?, d)?
        .log()?
        .add(&m)?;
    x.broadcast_sub(&lse)
}

impl Primitive for Softmax {
    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn attrs(&self) -> Vec<String> {
        vec![format!("dim: {}", self.dim)]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        // A split normalized dim is gathered first (the checker reported it).
        let x = k.reshard(x[0], ts[0], out)?;
        let y = if self.log {
            log_softmax(&x, self.dim)
        } else {
            softmax(&x, self.dim)
        };
        Forward::of(y.map_err(ce)?)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (y, ct, d) = (g.y, g.g, self.dim);
        let dx = if self.log {
            super::reduce_fast::sum_keepdim(ct, d)
                .and_then(|s| y.exp()?.broadcast_mul(&s))
                .and_then(|t| ct.sub(&t))
        } else {
            ct.mul(y)
                .and_then(|t| super::reduce_fast::sum_keepdim(&t, d))
                .and_then(|s| ct.broadcast_sub(&s))
                .and_then(|t| t.mul(y))
        }
        .map_err(ce)?;
        // Computed in the gathered layout: transpose the gather.
        let dx = if g.ts[0].dims != g.out.dims {
            k.reshard_t(&dx, g.ts[0], g.out)?
        } else {
            dx
        };
        Ok(vec![Some(dx)])
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        Some(Cost {
            flops: 0.0,
            comms: super::reshard::comms(c, ts[0], out),
        })
    }
}
