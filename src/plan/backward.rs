//! The bytes of cotangents backward holds at once, predicted from the
//! program alone.
//!
//! Reverse mode (`runtime::exec`) walks the nodes from last to first. A
//! node's cotangent is born when the first of its consumers in that order
//! runs its transpose, and is spent when the node's own transpose has run.
//! Parameters' cotangents are the gradients (the plan's `grads`), and those
//! of gathered parameters the plan's `gathered_grads`, so neither counts
//! here. The runtime measures the same quantity while it runs, for `--mem`.

use crate::prim::cost::CostCx;
use crate::prim::Prim;
use crate::spmd::{Op, Program};

/// The most bytes of cotangents alive at once while backward runs over the
/// nodes of `prog` after its inputs, from the output's cotangent. `inputs`:
/// values that depend on inputs only carry cotangents too (a loss function,
/// whose input's cotangent is what it returns).
pub fn peak(prog: &Program, cx: &CostCx, inputs: bool) -> f64 {
    alive(prog, cx, inputs).into_iter().fold(0.0, f64::max)
}

/// Per node, the bytes of cotangents alive while its transpose runs (0 for
/// nodes backward does not visit). A pipeline stage runs backward over its
/// own nodes only, from the cotangent of the value the next stage read:
/// what it holds is this at its nodes (values of other stages' nodes have no
/// cotangent yet, or none any more, while it runs).
pub fn alive(prog: &Program, cx: &CostCx, inputs: bool) -> Vec<f64> {
    let n = prog.nodes.len();
    let mut at = vec![0.0; n];
    let Some(out) = prog.output.map(|o| o as usize) else {
        return at;
    };
    let live = prog.on_gradient_path(inputs);
    let size = |i: usize| -> f64 {
        let t = &prog.nodes[i].ty;
        cx.local_numel(t).unwrap_or(0.0) * t.dtype.bytes() as f64
    };
    let counted = |i: usize| prog.cotangent_counted(i);
    // Backward runs over the nodes after the last input (a loss function's
    // inputs come first; a model's are never on the gradient path).
    let start = if inputs {
        prog.nodes
            .iter()
            .rposition(|n| matches!(n.op, Op::Input(_)))
            .map_or(0, |i| i + 1)
    } else {
        0
    };
    let mut has = vec![false; n];
    let mut alive = 0.0;
    if out < n {
        has[out] = true;
        if counted(out) {
            alive += size(out);
        }
    }
    for i in (start..n).rev().filter(|i| live[*i]) {
        let node = &prog.nodes[i];
        if !has[i] {
            // The runtime gives every op but elementwise arithmetic a zero
            // cotangent when none reached it (collectives run everywhere).
            match &node.op {
                Op::Prim(p) if !matches!(p, Prim::Arith(_)) => {
                    has[i] = true;
                    if counted(i) {
                        alive += size(i);
                    }
                }
                _ => continue,
            }
        }
        if let Op::Prim(_) = &node.op {
            for a in node.args.iter().map(|a| *a as usize) {
                if live.get(a) == Some(&true) && !has[a] {
                    has[a] = true;
                    if counted(a) {
                        alive += size(a);
                    }
                }
            }
        }
        at[i] = alive;
        if counted(i) {
            alive -= size(i);
        }
    }
    at
}
