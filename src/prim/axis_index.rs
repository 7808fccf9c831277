//! `axis_index(ax)`: this device's position along a mesh axis. Each device holds
//! a different value, so it is typed as the vector `[0, 1, …, n−1]` split over
//! the axis (`i32[n@ax]`, one element per device), never as a replicated value.

use super::cost::{Cost, CostCx};
use super::kernel::Kernel;
use super::rules::{arity, axes_product, axis_arg, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::DType;
use crate::types::{Dim, Poly, TType};
use candle_core::Tensor;

pub const DEFS: &[Def] = &[Def {
    name: "axis_index",
    kind: Kind::Collective,
    signature: "axis_index(ax)",
    rule: "this device's position along `ax`: the vector `[0, 1, …, n−1]` of type `i32[n@ax]`, one element per device (typed split, not replicated, because it differs per device; `psum(sum(k), ax)` and similar bring it back to a replicated value)",
    check: Some(check),
    examples: &["{x: f32[4, 6]} * psum(sum(cast(axis_index(a), f32) + 1.0), a)"],
    differentiable: false,
    same_on_one_device: false,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct AxisIndex {
    pub axis: String,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 1) {
        return None;
    }
    let axis = axis_arg(cx, c.pos[0])?;
    let n = axes_product(cx, std::slice::from_ref(&axis));
    let ty = TType {
        dtype: DType::I32,
        dims: vec![Dim {
            size: Poly::constant(n),
            axes: vec![axis.clone()],
        }],
        pending: Default::default(),
    };
    Typed::new(ty, AxisIndex { axis })
}

impl Primitive for AxisIndex {
    fn name(&self) -> &'static str {
        "axis_index"
    }

    fn attrs(&self) -> Vec<String> {
        vec![self.axis.clone()]
    }

    fn forward(&self, k: &Kernel, _x: &[&Tensor], _ts: &[&TType], _out: &TType) -> R<Forward> {
        let i = k.topo().coord(k.rank, &self.axis) as f64;
        Forward::of(k.floats(vec![i], &[1])?)
    }

    fn vjp(&self, _k: &Kernel, _g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
