//! `one_hot(ids, N)`: integer ids to `f32[..., N]`; the ids' layout is kept, and
//! the class dim may be split (`one_hot(ids, V@mp)`, as a vocabulary-parallel
//! head wants it): each device then holds its window of the classes.

use super::cost::{Cost, CostCx};
use super::kernel::Kernel;
use super::rules::{arity, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::DType;
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[Def {
    name: "one_hot",
    kind: Kind::Function,
    signature: "one_hot(ids, N)",
    rule: "integer ids → `f32[..., N]`; ids' layout kept; `N` may carry a sharding (`one_hot(ids, V@mp)`), divisible by its axes (E0203)",
    check: Some(check),
    examples: &["one_hot({ids: i32[4]}, 6) * {x: f32[4, 6]}"],
    differentiable: false,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct OneHot;

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !super::rules::known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`one_hot`")?;
    if t.dtype.is_float() {
        cx.report(Problem::DType {
            span: c.pos[0].span,
            expected: "i32".into(),
            found: t.dtype.name().into(),
            other: None,
        });
        return None;
    }
    let d = super::rules::sized(cx, c.pos[1], "the class dimension of `one_hot`")?;
    let mut out = t.clone();
    out.dtype = DType::F32;
    out.dims.push(d);
    Typed::new(out, OneHot)
}

impl Primitive for OneHot {
    fn name(&self) -> &'static str {
        "one_hot"
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], _ts: &[&TType], out: &TType) -> R<Forward> {
        let last = out.dims.last().ok_or("one_hot of a scalar")?;
        let local = k.local_shape(out)?;
        let n = *local.last().ok_or("one_hot of a scalar")?;
        let (idx, _) = k.topo().shard_index(k.rank, &last.axes);
        let off = (idx * n) as i64;
        let flat = Kernel::ints(x[0])?;
        let mut v = vec![0f64; flat.len() * n];
        for (r, id) in flat.iter().enumerate() {
            let l = id - off;
            if (0..n as i64).contains(&l) {
                v[r * n + l as usize] = 1.0;
            }
        }
        Forward::of(k.floats(v, &local)?)
    }

    fn vjp(&self, _k: &Kernel, _g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![None])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
