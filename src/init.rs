//! Deterministic, layout-independent randomness and the weight initializers.
//!
//! Every element's value is a hash of (seed, its global index), so a parameter
//! initialised on 8 devices is bit-identical to the same parameter on 1, and a
//! dropout mask or a synthetic batch does not depend on the mesh either. An
//! initializer is a typed value ([`Init`]), read once from the source by the
//! checker.

use crate::ast::{Arg, Expr, ExprKind};
use crate::diag::Problem;
use crate::mesh::Topology;
use crate::types::{Poly, TType};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;

#[inline(always)]
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [0, 1): [`bits53`] / 2^53.
pub fn uniform(seed: u64, i: u64) -> f64 {
    bits53(seed, i) as f64 / (1u64 << 53) as f64
}

/// The 53 random bits behind [`uniform`] (integer arithmetic only, so a loop
/// over indices vectorises).
#[inline(always)]
pub fn bits53(seed: u64, i: u64) -> u64 {
    splitmix(seed ^ splitmix(i)) >> 11
}

/// The integer `n` with `uniform(seed, i) < p` exactly when
/// `bits53(seed, i) < n`, for `p` in [0, 1] (p · 2^53 is exact).
pub fn below(p: f64) -> u64 {
    (p.clamp(0.0, 1.0) * (1u64 << 53) as f64).ceil() as u64
}

/// Standard normal (Box–Muller on two hashed uniforms).
pub fn normal(seed: u64, i: u64) -> f64 {
    let u1 = uniform(seed, i.wrapping_mul(2)).max(1e-300);
    let u2 = uniform(seed, i.wrapping_mul(2).wrapping_add(1));
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Global row-major index of each of this device's elements of a value of type `t`.
pub fn global_indices(
    topo: &Topology,
    rank: usize,
    t: &TType,
    bound: &BTreeMap<String, Poly>,
) -> Result<Vec<u64>, String> {
    let (starts, len) = global_runs(topo, rank, t, bound)?;
    let mut out = Vec::with_capacity(starts.len() * len);
    for s in starts {
        out.extend(s..s + len as u64);
    }
    Ok(out)
}

/// This device's elements of a value of type `t` as runs along the last
/// dimension, where global indices are consecutive: each run's first global
/// row-major index, in local order, and the runs' length (a scalar is one run
/// of one).
pub fn global_runs(
    topo: &Topology,
    rank: usize,
    t: &TType,
    bound: &BTreeMap<String, Poly>,
) -> Result<(Vec<u64>, usize), String> {
    let mut global = Vec::new();
    let mut local = Vec::new();
    let mut offset = Vec::new();
    for d in &t.dims {
        let g = d
            .size
            .substitute(bound)
            .and_then(|p| p.as_const())
            .ok_or("symbolic size")? as usize;
        let (idx, n) = topo.shard_index(rank, &d.axes);
        let l = g / n.max(1);
        global.push(g);
        local.push(l);
        offset.push(idx * l);
    }
    let Some(&len) = local.last() else {
        return Ok((vec![0], 1));
    };
    let lead = local.len() - 1;
    let runs: usize = local[..lead].iter().product();
    let mut out = Vec::with_capacity(if len == 0 { 0 } else { runs });
    if len == 0 {
        return Ok((out, 0));
    }
    let mut pos = vec![0usize; lead];
    for _ in 0..runs {
        let mut gi = 0u64;
        for k in 0..lead {
            gi = gi * global[k] as u64 + (offset[k] + pos[k]) as u64;
        }
        out.push(gi * global[lead] as u64 + offset[lead] as u64);
        for k in (0..lead).rev() {
            pos[k] += 1;
            if pos[k] < local[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    Ok((out, len))
}

/// A weight's initializer, as written (`normal(0.02)`, `lecun`, `zeros`, ...).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Zeros,
    Ones,
    Constant(f64),
    /// Standard deviation.
    Normal(f64),
    /// Standard deviation before truncation at ±2σ (as Haiku and Flax).
    TruncatedNormal(f64),
    /// Uniform in [-a, a).
    Uniform(f64),
    /// Flax's lecun_normal: truncated normal, variance 1/fan_in.
    Lecun,
    /// Glorot uniform.
    Xavier,
    /// Computed from an expression (`init cos(angles)`): the program's
    /// `inits[k]` computes it; the runtime evaluates it before training.
    Computed(usize),
}

/// The initializers' names, for messages and editors.
pub const NAMES: &[&str] = &[
    "normal",
    "truncated_normal",
    "uniform",
    "zeros",
    "ones",
    "xavier",
    "lecun",
    "constant",
];

impl std::fmt::Display for Init {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Init::Zeros => write!(f, "zeros"),
            Init::Ones => write!(f, "ones"),
            Init::Constant(v) => write!(f, "constant({v:?})"),
            Init::Normal(v) => write!(f, "normal({v:?})"),
            Init::TruncatedNormal(v) => write!(f, "truncated_normal({v:?})"),
            Init::Uniform(v) => write!(f, "uniform({v:?})"),
            Init::Lecun => write!(f, "lecun"),
            Init::Xavier => write!(f, "xavier"),
            Init::Computed(k) => write!(f, "computed #{k}"),
        }
    }
}

fn number(e: &Expr) -> Option<f64> {
    match &e.kind {
        ExprKind::Float(v) => Some(*v),
        ExprKind::Int(v) => Some(*v as f64),
        ExprKind::Neg(x) => number(x).map(|v| -v),
        _ => None,
    }
}

impl Init {
    /// Read an initializer expression: a name, or a name with one number.
    pub fn parse(e: &Expr) -> Result<Init, Box<Problem>> {
        let not_init = || {
            Box::new(Problem::WrongKind {
                span: e.span,
                expected: "an initializer like `normal(0.02)`".into(),
                found: "an expression".into(),
            })
        };
        let (name, nspan, args): (&str, _, &[Arg]) = match &e.kind {
            ExprKind::Name(n) => (n, e.span, &[]),
            ExprKind::Call(c, args) => match &c.kind {
                ExprKind::Name(n) => (n, c.span, args),
                _ => return Err(not_init()),
            },
            _ => return Err(not_init()),
        };
        if !NAMES.contains(&name) {
            return Err(Box::new(Problem::UnknownChoice {
                span: nspan,
                kind: "initializer",
                name: name.to_string(),
                known: NAMES.to_vec(),
            }));
        }
        let takes_number = matches!(name, "normal" | "truncated_normal" | "uniform" | "constant");
        let value = match (args, takes_number) {
            ([], _) => None,
            ([Arg::Pos(x)], true) => match number(x) {
                Some(v) => Some(v),
                None => {
                    return Err(Box::new(Problem::WrongKind {
                        span: x.span,
                        expected: format!("a number (the scale of `{name}`)"),
                        found: "an expression".into(),
                    }))
                }
            },
            _ => {
                return Err(Box::new(Problem::Arity {
                    span: e.span,
                    callee: name.to_string(),
                    expected: if takes_number {
                        "at most 1 number".into()
                    } else {
                        "no arguments".into()
                    },
                    found: args.len(),
                    decl: None,
                }))
            }
        };
        let scale = value.unwrap_or(1.0);
        Ok(match name {
            "zeros" => Init::Zeros,
            "ones" => Init::Ones,
            "constant" => Init::Constant(value.unwrap_or(0.0)),
            "normal" => Init::Normal(scale),
            "truncated_normal" => Init::TruncatedNormal(scale),
            "uniform" => Init::Uniform(scale),
            "lecun" => Init::Lecun,
            _ => Init::Xavier,
        })
    }

    /// Values at the given global indices of a value of type `t`.
    pub fn values(
        &self,
        t: &TType,
        seed: u64,
        idx: &[u64],
        bound: &BTreeMap<String, Poly>,
    ) -> Vec<f64> {
        let g = self.generator(t, seed, bound);
        idx.iter().map(|i| g.at(*i)).collect()
    }

    /// The value at each global index of a value of type `t` (its fans read
    /// once here, not per element).
    pub fn generator(&self, t: &TType, seed: u64, bound: &BTreeMap<String, Poly>) -> Gen {
        let dims: Vec<f64> = t
            .dims
            .iter()
            .map(|d| {
                d.size
                    .substitute(bound)
                    .and_then(|p| p.as_const())
                    .unwrap_or(1) as f64
            })
            .collect();
        let fan_out = dims.last().copied().unwrap_or(1.0);
        let fan_in = if dims.len() > 1 {
            dims[..dims.len() - 1].iter().product()
        } else {
            1.0
        };
        let (law, scale) = match *self {
            Init::Zeros => (Law::Constant, 0.0),
            Init::Ones => (Law::Constant, 1.0),
            Init::Constant(v) => (Law::Constant, v),
            Init::Normal(s) => (Law::Normal, s),
            Init::TruncatedNormal(s) => (Law::Truncated, s),
            Init::Uniform(a) => (Law::Uniform, a),
            Init::Lecun => (
                Law::Truncated,
                (1.0 / fan_in).sqrt() / 0.879_625_661_034_239_8,
            ),
            Init::Xavier => (Law::Uniform, (6.0 / (fan_in + fan_out)).sqrt()),
            // Evaluated by the runtime (`runtime::buffers`), never here.
            Init::Computed(_) => (Law::Constant, 0.0),
        };
        Gen { law, scale, seed }
    }
}

/// How an initializer draws an element, before its scale.
#[derive(Clone, Copy, Debug)]
enum Law {
    /// The scale itself.
    Constant,
    Normal,
    /// Normal, redrawn beyond ±2σ.
    Truncated,
    /// Uniform in [-1, 1).
    Uniform,
}

/// An initializer made ready for one value: [`Gen::at`] gives the element at
/// a global index, the same bits in any order and on any thread.
#[derive(Clone, Copy, Debug)]
pub struct Gen {
    law: Law,
    scale: f64,
    seed: u64,
}

impl Gen {
    /// The element at global index `i`.
    #[inline]
    pub fn at(&self, i: u64) -> f64 {
        let (s, seed) = (self.scale, self.seed);
        match self.law {
            Law::Constant => s,
            Law::Normal => s * normal(seed, i),
            Law::Truncated => s * truncated(seed, i),
            Law::Uniform => s * (2.0 * uniform(seed, i) - 1.0),
        }
    }
}

/// A value's elements by global index, drawn ([`Gen`]) or given (a global
/// array, row-major): what a device's piece of a parameter is made from.
pub trait Values: Sync {
    /// The element at global index `i`.
    fn at(&self, i: u64) -> f64;

    /// `at(first + k) as f32` into each `out[k]`.
    fn run_f32(&self, first: u64, out: &mut [MaybeUninit<f32>]) {
        one_at_a_time(self, first, out)
    }
}

/// [`Values::run_f32`] element by element.
fn one_at_a_time<V: Values + ?Sized>(v: &V, first: u64, out: &mut [MaybeUninit<f32>]) {
    for (k, o) in out.iter_mut().enumerate() {
        o.write(v.at(first.wrapping_add(k as u64)) as f32);
    }
}

impl Values for Gen {
    fn at(&self, i: u64) -> f64 {
        Gen::at(self, i)
    }

    /// Normals many at a time ([`crate::init_fast`]), the same bits.
    fn run_f32(&self, first: u64, out: &mut [MaybeUninit<f32>]) {
        let (s, seed) = (self.scale, self.seed);
        match self.law {
            Law::Normal => crate::init_fast::normals_f32(seed, s, false, first, out),
            Law::Truncated => crate::init_fast::normals_f32(seed, s, true, first, out),
            Law::Constant | Law::Uniform => one_at_a_time(self, first, out),
        }
    }
}

/// A global array, row-major (read as 0 past its end).
pub struct Given<'a>(pub &'a [f64]);

impl Values for Given<'_> {
    fn at(&self, i: u64) -> f64 {
        self.0.get(i as usize).copied().unwrap_or(0.0)
    }
}

/// Truncated normal at ±2σ, as Haiku/Flax: redraw with the next counter.
pub(crate) fn truncated(seed: u64, i: u64) -> f64 {
    for k in 0..16u64 {
        let z = normal(seed.wrapping_add(k.wrapping_mul(0x5851_F42D_4C95_7F2D)), i);
        if z.abs() <= 2.0 {
            return z;
        }
    }
    0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_compares_as_uniform_does() {
        for p in [0.0, 1e-17, 0.1, 0.25, 1.0 / 3.0, 0.5, 0.9, 0.999_999_999] {
            let cut = below(p);
            for i in 0..20_000u64 {
                assert_eq!(uniform(7, i) < p, bits53(7, i) < cut, "p {p}, i {i}");
            }
        }
        // Exactly at a representable value: uniform < p is false for u = p.
        let u = uniform(3, 11);
        assert!(bits53(3, 11) >= below(u));
        assert!(bits53(3, 11) < below(u + 1e-12));
    }
}
