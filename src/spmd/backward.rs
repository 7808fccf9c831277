//! Reverse mode as part of the program: the backward pass is a list of
//! explicit actions derived once from the forward nodes and their primitives'
//! derivatives, which the runtime executes and the plan counts. Two rules
//! that used to be stated in both places live here only:
//!
//! - which nodes backward visits (those on the gradient path), and which of
//!   them take a zero cotangent when none reached them (every op but
//!   elementwise arithmetic, so that collectives run on every device in the
//!   same order);
//! - when a cotangent is alive: born when the first of its node's consumers
//!   (in reverse order) runs its derivative, or at its own visit when it is
//!   a zero; spent once its node's own action has run. [`alive`] walks that
//!   definition with a size per node: the plan gives sizes from the types,
//!   `run --mem` the bytes of the tensors the runtime made.

use super::{Op, Program};
use crate::prim::Prim;
use std::ops::Range;

/// What backward does at one node.
#[derive(Clone, Debug, PartialEq)]
pub enum Act {
    /// A parameter: its cotangent adds into the parameter's gradient.
    Grad(usize),
    /// An op: its derivative turns the node's cotangent into its operands'
    /// (`wants[k]`: operand `k` is on the gradient path and gets one).
    Vjp { wants: Vec<bool> },
}

/// One action of the backward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Bwd {
    pub node: usize,
    /// Whether the node takes a zero cotangent when none reached it.
    pub zero_if_absent: bool,
    pub act: Act,
}

/// The backward pass of a program: one action per node on the gradient path,
/// from the last node to the first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Backward {
    pub acts: Vec<Bwd>,
    /// Per node: on the weight side ([`weight_side`]), for a backward run
    /// in two halves.
    pub weights: Vec<bool>,
}

impl Backward {
    /// The backward pass of `prog`: the nodes on the path from a parameter
    /// to the root ([`Program::root`]).
    pub fn of(prog: &Program) -> Backward {
        let path = prog.on_gradient_path(false);
        let reach = reaches_root(prog);
        let live: Vec<bool> = path.iter().zip(&reach).map(|(p, r)| *p && *r).collect();
        let on = |k: usize| live.get(k) == Some(&true);
        let acts = (0..prog.nodes.len())
            .rev()
            .filter(|i| on(*i))
            .filter_map(|i| {
                let node = &prog.nodes[i];
                let act = match &node.op {
                    Op::Input(_) | Op::Targets | Op::Weights => return None,
                    Op::Param(p) => Act::Grad(*p),
                    Op::Prim(_) => Act::Vjp {
                        wants: node.args.iter().map(|a| on(*a as usize)).collect(),
                    },
                };
                Some(Bwd {
                    node: i,
                    zero_if_absent: matches!(&node.op, Op::Prim(p) if !matches!(p, Prim::Arith(_))),
                    act,
                })
            })
            .collect();
        Backward {
            acts,
            weights: weight_side(prog),
        }
    }

    /// The actions at nodes in `range`, in the order they run.
    pub fn within(&self, range: Range<usize>) -> impl Iterator<Item = &Bwd> {
        self.acts.iter().filter(move |b| range.contains(&b.node))
    }
}

/// Per node: whether its cotangent flows to parameters alone — a parameter,
/// or an op of parameters (and constants) with no data among its ancestors,
/// like a weight's gathered or cast copy. A backward split in two (the
/// zero-bubble pipeline schedules) leaves these, and each op's operands among
/// them, to its weight-gradient half: nothing upstream waits for them.
pub fn weight_side(prog: &Program) -> Vec<bool> {
    let n = prog.nodes.len();
    let (mut data, mut param) = (vec![false; n], vec![false; n]);
    for (i, node) in prog.nodes.iter().enumerate() {
        match node.op {
            Op::Param(_) => param[i] = true,
            Op::Input(_) | Op::Targets | Op::Weights => data[i] = true,
            _ => {
                for a in &node.args {
                    let a = *a as usize;
                    if a < i {
                        data[i] |= data[a];
                        param[i] |= param[a];
                    }
                }
            }
        }
    }
    (0..n).map(|i| param[i] && !data[i]).collect()
}

/// Per node: whether the root ([`Program::root`]) depends on it. What it
/// does not depend on (the metrics beside the loss, a value computed and
/// never used) gets no cotangent.
fn reaches_root(prog: &Program) -> Vec<bool> {
    let n = prog.nodes.len();
    let mut out = vec![false; n];
    let Some(root) = prog.root().map(|r| r as usize).filter(|r| *r < n) else {
        return vec![true; n];
    };
    out[root] = true;
    for i in (0..=root).rev() {
        if out[i] {
            for a in &prog.nodes[i].args {
                if let Some(x) = out.get_mut(*a as usize) {
                    *x = true;
                }
            }
        }
    }
    out
}

/// Cotangent bytes backward holds, from [`alive`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Alive {
    /// Per node: the bytes of counted cotangents alive while its action runs
    /// (0 where backward does not visit).
    pub at: Vec<f64>,
    /// The most bytes of counted cotangents alive at once (the plan's
    /// `cotangents`): every node's but parameters' (their gradients) and
    /// gathered parameters' ([`Program::cotangent_counted`]).
    pub peak: f64,
    /// The most bytes of gathered parameters' full-size gradients alive at
    /// once, before their reduce-scatter (the plan's `gathered grads`).
    pub unreduced: f64,
}

/// The cotangents alive while `bwd`'s actions in `range` run, starting from
/// cotangents at `seeds`; `size(i)` is the bytes of node `i`'s cotangent.
pub fn alive(
    prog: &Program,
    bwd: &Backward,
    range: Range<usize>,
    seeds: &[usize],
    size: &dyn Fn(usize) -> f64,
) -> Alive {
    let n = prog.nodes.len();
    let mut out = Alive {
        at: vec![0.0; n],
        ..Alive::default()
    };
    let counted = |i: usize| prog.cotangent_counted(i);
    let gathered = |i: usize| prog.gathers_copy(i);
    let mut has = vec![false; n];
    let (mut live, mut unreduced) = (0.0, 0.0);
    let born = |i: usize, has: &mut Vec<bool>, live: &mut f64, unreduced: &mut f64| {
        if i >= n || has[i] {
            return;
        }
        has[i] = true;
        if gathered(i) {
            *unreduced += size(i);
        } else if counted(i) {
            *live += size(i);
        }
    };
    for s in seeds {
        born(*s, &mut has, &mut live, &mut unreduced);
    }
    out.peak = live;
    out.unreduced = unreduced;
    for b in bwd.within(range) {
        let i = b.node;
        // What its reduce-scatter spends (a gathered zero was never counted).
        let held = if has[i] && gathered(i) { size(i) } else { 0.0 };
        if !has[i] {
            if !b.zero_if_absent {
                continue;
            }
            // A zero made here, spent here: never a gathered gradient.
            has[i] = true;
            if counted(i) {
                live += size(i);
            }
        }
        if let Act::Vjp { wants } = &b.act {
            let node = &prog.nodes[i];
            for (a, _) in node.args.iter().zip(wants).filter(|(_, w)| **w) {
                born(*a as usize, &mut has, &mut live, &mut unreduced);
                out.unreduced = out.unreduced.max(unreduced);
            }
        }
        out.at[i] = live;
        out.peak = out.peak.max(live);
        unreduced -= held;
        if counted(i) {
            live -= size(i);
        }
    }
    out
}
