//! `sum`, `mean`, `max` and `min` over dimensions (all when none is given). A
//! removed dimension split over an axis leaves a pending reduction over it
//! (`partial(ax)`, `partial(max: ax)`): each device reduces its local piece, and
//! the type says what remains to be reduced across devices.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, dim_list, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::ReduceOp;
use crate::types::TType;
use candle_core::Tensor;

const RULE: &str = "removes the dims (`dim` an index or a list; all dims if omitted); a removed dim split over `ax` leaves `partial(ax)` (sum, mean) or `partial(max: ax)` / `partial(min: ax)`; `max`/`min` need a reduced input";

macro_rules! reduce_defs {
    ($($name:literal $ex1:literal $ex2:literal,)*) => {
        pub const DEFS: &[Def] = &[$(Def {
            name: $name,
            kind: Kind::Function,
            signature: concat!($name, "(x, dim)"),
            rule: RULE,
            check: Some(check),
            examples: &[$ex1, $ex2],
            differentiable: true,
            same_on_one_device: true,
        },)*];
    };
}

reduce_defs! {
    "sum" "sum({x: f32[4, 6]}, dim: 1)" "sum({x: f32[2, 4, 6]}, [0, 2])",
    "mean" "mean({x: f32[4, 6]}, dim: 0)" "mean({x: f32[4, 6]})",
    "max" "max({x: f32[4, 6]}, dim: 1)" "max({x: f32[2, 4, 6]}, dim: [1, 2])",
    "min" "min({x: f32[4, 6]}, dim: -1)" "min({x: f32[4, 6]})",
}

#[derive(Clone, Debug, PartialEq)]
pub struct Reduce {
    pub op: ReduceOp,
    /// `mean`: a sum divided by the reduced dims' global sizes.
    pub mean: bool,
    /// The reduced dims, ascending.
    pub dims: Vec<usize>,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 2) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], &format!("`{}`", c.name))?;
    let op = match c.name {
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        _ => ReduceOp::Sum,
    };
    if op != ReduceOp::Sum && !cx.need_reduced(&t, c.name, c.pos[0]) {
        return None;
    }
    let mut dims: Vec<usize> = match c.pos.get(1).copied().or(c.named_expr("dim")) {
        None => (0..t.rank()).collect(),
        Some(d) => dim_list(cx, d, t.rank())?,
    };
    let mut out = TType {
        dtype: t.dtype,
        dims: vec![],
        pending: t.pending.clone(),
    };
    for (i, d) in t.dims.iter().enumerate() {
        if dims.contains(&i) {
            for a in &d.axes {
                out.pending.insert(a.clone(), op);
            }
        } else {
            out.dims.push(d.clone());
        }
    }
    dims.sort_unstable();
    dims.dedup();
    Typed::new(
        out,
        Reduce {
            op,
            mean: c.name == "mean",
            dims,
        },
    )
}

impl Primitive for Reduce {
    fn name(&self) -> &'static str {
        match (self.op, self.mean) {
            (ReduceOp::Max, _) => "max",
            (ReduceOp::Min, _) => "min",
            (_, true) => "mean",
            _ => "sum",
        }
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn attrs(&self) -> Vec<String> {
        let d: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        vec![format!("dim: [{}]", d.join(", "))]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        // Over a split dim this is the local part; the type says what reduction
        // is still pending across devices.
        let mut t = x[0].clone();
        for &d in self.dims.iter().rev() {
            t = match self.op {
                ReduceOp::Max => t.max(d),
                ReduceOp::Min => t.min(d),
                ReduceOp::Sum => super::reduce_fast::sum(&t, d),
            }
            .map_err(ce)?;
        }
        if self.mean {
            t = (t / k.global_count(ts[0], &self.dims)?).map_err(ce)?;
        }
        Forward::of(t)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (mut gb, mut yb) = (g.g.clone(), g.y.clone());
        for &d in &self.dims {
            gb = gb.unsqueeze(d).map_err(ce)?;
            yb = yb.unsqueeze(d).map_err(ce)?;
        }
        let x = g.x[0];
        let gb = gb.broadcast_as(x.dims()).map_err(ce)?;
        let d = match (self.op, self.mean) {
            (ReduceOp::Sum, false) => gb,
            (ReduceOp::Sum, true) => (gb / k.global_count(g.ts[0], &self.dims)?).map_err(ce)?,
            // To the elements equal to the extremum, split evenly between ties.
            _ => {
                let mask = x
                    .broadcast_eq(&yb)
                    .and_then(|m| m.to_dtype(g.g.dtype()))
                    .map_err(ce)?;
                let mut count = mask.clone();
                for &d in self.dims.iter().rev() {
                    count = super::reduce_fast::sum_keepdim(&count, d).map_err(ce)?;
                }
                gb.mul(&mask)
                    .and_then(|t| t.broadcast_div(&count))
                    .map_err(ce)?
            }
        };
        Ok(vec![Some(d)])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
