//! The backward of a pipeline stage split in two, as the zero-bubble
//! schedules run it: the input-gradient half ([`Exec::backward_input`]) turns
//! the stage's output cotangent into its input's — what the previous stage
//! waits for — and keeps, at each op that also reads a weight, the op's
//! cotangent; the weight-gradient half ([`Exec::backward_weight`]), run
//! later, turns those into the parameters' gradients. Which operands are the
//! weights' is the program's backward's
//! ([`crate::spmd::backward::weight_side`]). Each half runs the same
//! derivatives as the whole backward, in the same order, so the gradients
//! have the same bits.

use super::exec::{Exec, Tape, R};
use super::profile;
use crate::spmd::backward::Act;
use candle_core::Tensor;

/// What the input-gradient half leaves to the weight-gradient half: per op
/// with a weight-side operand, in backward order, its cotangent.
#[derive(Default)]
pub struct Deferred {
    at: Vec<(usize, Tensor)>,
}

/// The operands an op's derivative gives a cotangent (`wants`), split: those
/// the input-gradient half takes, and the weight side's.
fn split_wants(wants: &[bool], args: &[u32], weights: &[bool]) -> (Vec<bool>, Vec<bool>) {
    let side = |k: usize| args.get(k).is_some_and(|a| weights[*a as usize]);
    wants
        .iter()
        .enumerate()
        .map(|(k, w)| (*w && !side(k), *w && side(k)))
        .unzip()
}

fn add(slot: &mut Option<Tensor>, g: Tensor) -> R<()> {
    *slot = Some(match slot.take() {
        Some(s) => (s + g)?,
        None => g,
    });
    Ok(())
}

impl Exec<'_> {
    /// A cotangent `d` from node `i`'s derivative added into `slot`, timed
    /// for `--profile` as that node's, in the backward half `weight_share`.
    fn timed_add(
        &self,
        i: usize,
        weight_share: f64,
        slot: &mut Option<Tensor>,
        d: Tensor,
    ) -> R<()> {
        profile::time_node(&self.dev, "cotangent add", i, Some(weight_share), || {
            add(slot, d)
        })
    }

    /// The input-gradient half of the backward over `range` from `seeds`:
    /// every node's cotangent but the weight side's (a stage's input
    /// included), and what the weight-gradient half needs.
    pub fn backward_input(
        &self,
        tape: &Tape,
        seeds: &[(usize, Tensor)],
        range: std::ops::Range<usize>,
    ) -> R<(Vec<Option<Tensor>>, Deferred)> {
        let bwd = self.backward_of();
        let weights = &bwd.weights;
        let n = self.prog.nodes.len();
        let mut ct: Vec<Option<Tensor>> = vec![None; n];
        for (i, g) in seeds {
            ct[*i] = Some(g.clone());
        }
        let mut deferred = Deferred::default();
        for b in bwd.within(range) {
            let i = b.node;
            if weights[i] {
                continue;
            }
            let Act::Vjp { wants } = &b.act else { continue };
            let g = match ct[i].take() {
                Some(g) => g,
                None if b.zero_if_absent => tape.vals[i].zeros_like()?,
                None => continue,
            };
            let (inputs, later) = split_wants(wants, &self.prog.nodes[i].args, weights);
            if later.iter().any(|w| *w) {
                deferred.at.push((i, g.clone()));
            }
            if inputs.iter().any(|w| *w) {
                for (a, d) in self.vjp_at(tape, i, &g, &inputs)? {
                    self.timed_add(i, 0.0, &mut ct[a], d)?;
                }
            }
        }
        Ok((ct, deferred))
    }

    /// The weight-gradient half: the deferred cotangents through the weight
    /// side into the parameters' gradients (`grads`).
    pub fn backward_weight(
        &self,
        tape: &Tape,
        deferred: Deferred,
        range: std::ops::Range<usize>,
        grads: &mut [Option<Tensor>],
    ) -> R<()> {
        let bwd = self.backward_of();
        let weights = &bwd.weights;
        let n = self.prog.nodes.len();
        let mut ct: Vec<Option<Tensor>> = vec![None; n];
        let mut kept = deferred.at.into_iter().peekable();
        for b in bwd.within(range) {
            let i = b.node;
            if kept.peek().is_some_and(|(k, _)| *k == i) {
                let Some((_, g)) = kept.next() else { continue };
                let Act::Vjp { wants } = &b.act else { continue };
                let (_, side) = split_wants(wants, &self.prog.nodes[i].args, weights);
                for (a, d) in self.vjp_at(tape, i, &g, &side)? {
                    self.timed_add(i, 1.0, &mut ct[a], d)?;
                }
                continue;
            }
            if !weights[i] {
                continue;
            }
            let g = match ct[i].take() {
                Some(g) => g,
                None if b.zero_if_absent => tape.vals[i].zeros_like()?,
                None => continue,
            };
            match &b.act {
                Act::Grad(p) => {
                    profile::time_node(&self.dev, "gradient add", i, Some(1.0), || {
                        add(&mut grads[*p], g)
                    })?
                }
                Act::Vjp { wants } => {
                    for (a, d) in self.vjp_at(tape, i, &g, wants)? {
                        self.timed_add(i, 1.0, &mut ct[a], d)?;
                    }
                }
            }
        }
        Ok(())
    }
}
