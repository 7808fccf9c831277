//! What an op costs, for `shardc plan`: FLOPs beyond one per output element,
//! and the bytes each device moves for the collectives it performs or implies.
//! Computed from types alone (nothing is allocated), so plans work for meshes
//! far larger than this machine.

use crate::types::{Poly, TType};
use std::collections::BTreeMap;

/// The mesh and the bound sizes a cost is computed against.
pub struct CostCx<'a> {
    pub mesh: &'a [(String, i64)],
    pub bound: &'a BTreeMap<String, Poly>,
}

/// One collective an op performs (per forward pass; backward transposes add as
/// many).
#[derive(Clone, Debug, PartialEq)]
pub struct CommCost {
    /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`, `ppermute`, ...
    pub kind: String,
    pub axes: Vec<String>,
    /// Bytes each device moves.
    pub bytes: f64,
    /// Written in the source, or implied by the types (a reported reshard).
    pub explicit: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cost {
    pub flops: f64,
    pub comms: Vec<CommCost>,
}

impl Cost {
    pub fn free() -> Option<Cost> {
        Some(Cost::default())
    }
    pub fn flops(f: f64) -> Option<Cost> {
        Some(Cost {
            flops: f,
            comms: vec![],
        })
    }
}

/// Bytes moved, as text for people and as a number when the sizes are known.
#[derive(Clone, Debug)]
pub struct Bytes {
    pub text: String,
    pub num: Option<f64>,
}

impl CostCx<'_> {
    pub fn axis_size(&self, a: &str) -> i64 {
        axis_size(self.mesh, a)
    }
    pub fn axes_product(&self, axes: &[String]) -> i64 {
        axes.iter()
            .fold(1i64, |acc, a| acc.saturating_mul(self.axis_size(a)))
    }
    /// One device's piece of `t`, when all sizes are known.
    pub fn local_shape(&self, t: &TType) -> Option<Vec<usize>> {
        t.dims
            .iter()
            .map(|d| {
                let n = d.size.value(self.bound)?;
                let k = self.axes_product(&d.axes).max(1);
                Some((n / k).max(0) as usize)
            })
            .collect()
    }
    /// Elements of one device's piece of `t`, when all sizes are known.
    pub fn local_numel(&self, t: &TType) -> Option<f64> {
        local_numel(t, self.bound, &|a| self.axis_size(a))
    }
    /// `factor` × the local bytes of `t`.
    pub fn bytes(&self, t: &TType, factor: f64) -> Option<f64> {
        bytes(t, factor, self.bound, &|a| self.axis_size(a)).num
    }
    /// A collective over `axis` on a value of (per-device) type `t`: ring
    /// algorithms move `factor × (n-1)/n` of the local bytes.
    pub fn ring(&self, kind: &str, axis: &str, t: &TType, factor: f64) -> Option<CommCost> {
        let n = self.axis_size(axis) as f64;
        self.bytes(t, factor * (n - 1.0) / n).map(|b| CommCost {
            kind: kind.into(),
            axes: vec![axis.to_string()],
            bytes: b,
            explicit: true,
        })
    }
    /// The size of a dimension, when known.
    pub fn size(&self, p: &Poly) -> Option<i64> {
        p.value(self.bound)
    }
}

/// The axes a move of one dimension from layout `from` to layout `to` gathers
/// (`Kernel::relayout` gathers the minor axes of `from` until the rest is a
/// prefix of `to`), as all-gathers of a value of type `t`.
pub fn gathers(c: &CostCx, t: &TType, from: &[String], to: &[String]) -> Vec<CommCost> {
    let keep = (0..=from.len())
        .rev()
        .find(|&n| to.starts_with(&from[..n]))
        .unwrap_or(0);
    from[keep..]
        .iter()
        .rev()
        .filter_map(|ax| {
            let n = c.axis_size(ax) as f64;
            c.bytes(t, (n - 1.0) / n).map(|b| CommCost {
                kind: "all-gather".into(),
                axes: vec![ax.clone()],
                bytes: b,
                explicit: false,
            })
        })
        .collect()
}

pub fn axis_size(mesh: &[(String, i64)], a: &str) -> i64 {
    mesh.iter().find(|m| m.0 == a).map_or(1, |m| m.1)
}

/// Elements of one device's piece of `t`, when all sizes are known.
/// The elements of `t` with its sizes bound, as a float: a product of sizes
/// that would overflow an integer is still the right (huge) number, so a plan
/// reports it and the run's memory check refuses it.
pub fn global_numel(t: &TType, bound: &BTreeMap<String, Poly>) -> Option<f64> {
    t.dims
        .iter()
        .map(|d| Some(d.size.value(bound)?.max(0) as f64))
        .product()
}

pub fn local_numel(
    t: &TType,
    bound: &BTreeMap<String, Poly>,
    axis_size: &dyn Fn(&str) -> i64,
) -> Option<f64> {
    let n = global_numel(t, bound)?;
    let shards: f64 = t
        .dims
        .iter()
        .map(|d| {
            d.axes
                .iter()
                .fold(1i64, |acc, a| acc.saturating_mul(axis_size(a))) as f64
        })
        .product();
    Some(n / shards.max(1.0))
}

/// Bytes each device moves for a collective on a value whose per-device size is
/// the local size of `t`: `factor` × local bytes.
pub fn bytes(
    t: &TType,
    factor: f64,
    bound: &BTreeMap<String, Poly>,
    axis_size: &dyn Fn(&str) -> i64,
) -> Bytes {
    let shards: i64 = t.dims.iter().fold(1i64, |acc, d| {
        acc.saturating_mul(
            d.axes
                .iter()
                .fold(1i64, |acc, a| acc.saturating_mul(axis_size(a))),
        )
    });
    // Known sizes as a number; otherwise the symbolic product, when there is one.
    let known = global_numel(t, bound);
    let symbolic = || t.numel().and_then(|n| n.substitute(bound));
    match (known, known.is_none().then(symbolic).flatten()) {
        (None, None) => Bytes {
            text: "unknown bytes".into(),
            num: None,
        },
        (Some(n), _) => {
            let b = n * t.dtype.bytes() as f64 / shards.max(1) as f64 * factor;
            Bytes {
                text: crate::units::human_bytes(b),
                num: Some(b),
            }
        }
        (None, Some(numel)) => {
            let per = t.dtype.bytes() as f64 * factor / shards.max(1) as f64;
            let text = if per.fract() == 0.0 && per >= 1.0 {
                let scaled = numel.mul(&Poly::constant(per as i64)).unwrap_or(numel);
                format!("{scaled} bytes")
            } else {
                format!("{per:.3} × ({numel}) bytes")
            };
            Bytes { text, num: None }
        }
    }
}
