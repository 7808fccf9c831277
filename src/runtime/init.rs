//! Deterministic, layout-independent randomness: every element's value is a hash
//! of (seed, its global index), so a parameter initialised on 8 devices is
//! bit-identical to the same parameter on 1.

use super::mesh::Topology;
use crate::types::{Poly, TType};
use std::collections::BTreeMap;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [0, 1).
pub fn uniform(seed: u64, i: u64) -> f64 {
    (splitmix(seed ^ splitmix(i)) >> 11) as f64 / (1u64 << 53) as f64
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
    let total: usize = local.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut pos = vec![0usize; local.len()];
    for _ in 0..total {
        let mut gi = 0u64;
        for k in 0..local.len() {
            gi = gi * global[k] as u64 + (offset[k] + pos[k]) as u64;
        }
        out.push(gi);
        for k in (0..local.len()).rev() {
            pos[k] += 1;
            if pos[k] < local[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    Ok(out)
}

/// Values of an initializer (`normal(0.02)`, `lecun`, `zeros`, ...) at global indices.
pub fn init_values(
    init: &str,
    t: &TType,
    seed: u64,
    idx: &[u64],
    bound: &BTreeMap<String, Poly>,
) -> Result<Vec<f64>, String> {
    let (name, arg) = match init.split_once('(') {
        Some((n, rest)) => (n.trim(), rest.trim_end_matches(')').trim()),
        None => (init.trim(), ""),
    };
    let num = |s: &str| {
        s.split(',')
            .next()
            .unwrap_or("")
            .split(':')
            .next_back()
            .unwrap_or("")
            .trim()
            .parse::<f64>()
            .ok()
    };
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
    // Truncated normal at ±2σ, as Haiku/Flax: redraw with the next counter.
    let trunc = |i: u64| -> f64 {
        for k in 0..16u64 {
            let z = normal(seed.wrapping_add(k.wrapping_mul(0x5851_F42D_4C95_7F2D)), i);
            if z.abs() <= 2.0 {
                return z;
            }
        }
        0.0
    };
    let v: Vec<f64> = match name {
        "zeros" => vec![0.0; idx.len()],
        "ones" => vec![1.0; idx.len()],
        "constant" => vec![num(arg).unwrap_or(0.0); idx.len()],
        "normal" => {
            let s = num(arg).unwrap_or(1.0);
            idx.iter().map(|i| s * normal(seed, *i)).collect()
        }
        "truncated_normal" => {
            let s = num(arg).unwrap_or(1.0);
            idx.iter().map(|i| s * trunc(*i)).collect()
        }
        "uniform" => {
            let a = num(arg).unwrap_or(1.0);
            idx.iter()
                .map(|i| a * (2.0 * uniform(seed, *i) - 1.0))
                .collect()
        }
        // Flax's lecun_normal: truncated normal, variance 1/fan_in.
        "lecun" => {
            let s = (1.0 / fan_in).sqrt() / 0.879_625_661_034_239_8;
            idx.iter().map(|i| s * trunc(*i)).collect()
        }
        "xavier" => {
            let a = (6.0 / (fan_in + fan_out)).sqrt();
            idx.iter()
                .map(|i| a * (2.0 * uniform(seed, *i) - 1.0))
                .collect()
        }
        other => return Err(format!("unknown initializer `{other}`")),
    };
    Ok(v)
}
