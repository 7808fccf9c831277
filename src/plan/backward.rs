//! The bytes of cotangents backward holds at once, predicted from the
//! program's types: the definition of when a cotangent is alive is
//! [`crate::spmd::backward::alive`], which `run --mem` measures with too.

use crate::prim::cost::CostCx;
use crate::spmd::backward::{self, Backward};
use crate::spmd::Program;

/// The cotangent bytes alive at each node while backward runs over `prog`
/// from the loss's cotangent (a program of the model alone: the output's).
pub fn alive(prog: &Program, cx: &CostCx) -> backward::Alive {
    let n = prog.nodes.len();
    let Some(root) = prog.root().map(|r| r as usize).filter(|r| *r < n) else {
        return backward::Alive {
            at: vec![0.0; n],
            ..Default::default()
        };
    };
    let size = |i: usize| -> f64 {
        let t = &prog.nodes[i].ty;
        cx.local_numel(t).unwrap_or(0.0) * t.dtype.bytes() as f64
    };
    let bwd = Backward::of(prog);
    backward::alive(prog, &bwd, 0..n, &[root], &size)
}
