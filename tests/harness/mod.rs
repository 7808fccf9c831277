//! The examples of the primitives' registry as runnable models: each
//! `{name: type}` operand becomes a weight (a partial one through a reduction
//! over a dim split over its pending axes) or, for ids, a model input, laid
//! out as asked; the program is checked, lowered and run on global values.
//! Shared by `tests/prims.rs` (numerics) and `tests/registry.rs` (completeness).
#![allow(dead_code)]

use shardc::runtime::probe::{probe, Probe};
use shardc::spmd::Program;
use shardc::world::{self, Options};
use std::collections::HashMap;
use std::path::Path;

/// One operand of an example: its name, dtype, global dims, and the pending
/// reduction it may carry (`partial(max: a)` asks for max; sum otherwise).
#[derive(Clone, Debug)]
pub struct Operand {
    pub name: String,
    pub float: bool,
    pub dtype: String,
    pub dims: Vec<i64>,
    pub pending: &'static str,
}

/// The example with each placeholder replaced by its operand's name, and the
/// operands in order of first appearance.
pub fn parse(example: &str) -> (String, Vec<Operand>) {
    let mut text = String::new();
    let mut ops: Vec<Operand> = Vec::new();
    let mut rest = example;
    while let Some(i) = rest.find('{') {
        text.push_str(&rest[..i]);
        let j = rest[i..].find('}').expect("closing brace") + i;
        let inner = &rest[i + 1..j];
        let (name, ty) = inner.split_once(':').expect("name: type");
        let (name, ty) = (name.trim().to_string(), ty.trim());
        let (dtype, tail) = ty.split_once('[').expect("dims");
        let (dims, after) = tail.split_once(']').expect("dims");
        let dims = dims
            .split(',')
            .map(|d| d.trim().parse::<i64>().expect("a constant dim"))
            .collect();
        let pending = if after.contains("max:") {
            "max"
        } else if after.contains("min:") {
            "min"
        } else {
            "sum"
        };
        if !ops.iter().any(|o| o.name == name) {
            ops.push(Operand {
                name: name.clone(),
                float: dtype.starts_with('f'),
                dtype: dtype.trim().to_string(),
                dims,
                pending,
            });
        }
        text.push_str(&name);
        rest = &rest[j + 1..];
    }
    text.push_str(rest);
    (text, ops)
}

/// Where each mesh axis goes for one operand: a dim, or a pending reduction.
#[derive(Clone, Debug, PartialEq)]
pub enum Place {
    None,
    Dim(usize),
    Pending,
}

/// An operand's layout: the axes of each dim (in order), and its pending axes.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dims: Vec<Vec<String>>,
    pub pending: Vec<String>,
}

/// Every layout of an operand over `axes` (each of size 2) with divisible dims.
pub fn layouts(op: &Operand, axes: &[&str]) -> Vec<Layout> {
    let mut places: Vec<Vec<Place>> = vec![vec![]];
    for _ in axes {
        let mut next = Vec::new();
        for p in &places {
            let mut choices = vec![Place::None];
            choices.extend((0..op.dims.len()).map(Place::Dim));
            if op.float {
                choices.push(Place::Pending);
            }
            for c in choices {
                let mut q = p.clone();
                q.push(c);
                next.push(q);
            }
        }
        places = next;
    }
    let mut out = Vec::new();
    for p in places {
        let mut base = Layout {
            dims: vec![vec![]; op.dims.len()],
            pending: vec![],
        };
        for (a, place) in axes.iter().zip(&p) {
            match place {
                Place::None => {}
                Place::Dim(k) => base.dims[*k].push(a.to_string()),
                Place::Pending => base.pending.push(a.to_string()),
            }
        }
        let ok = base
            .dims
            .iter()
            .zip(&op.dims)
            .all(|(ax, n)| n % (1i64 << ax.len()) == 0);
        if !ok {
            continue;
        }
        // Two axes on one dim: both orders.
        if let Some(k) = base.dims.iter().position(|d| d.len() == 2) {
            let mut swapped = base.clone();
            swapped.dims[k].reverse();
            out.push(swapped);
        }
        out.push(base);
    }
    out
}

pub fn dims_text(dims: &[i64], layout: &[Vec<String>]) -> String {
    dims.iter()
        .zip(layout)
        .map(|(n, ax)| match ax.len() {
            0 => n.to_string(),
            1 => format!("{n}@{}", ax[0]),
            _ => format!("{n}@({})", ax.join(", ")),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The model that runs `expr` on operands with these layouts.
pub fn model(mesh: &str, expr: &str, ops: &[Operand], ls: &[&Layout]) -> String {
    let mut weights = String::new();
    let mut inputs = Vec::new();
    let mut lets = String::new();
    for (o, l) in ops.iter().zip(ls) {
        let dims = dims_text(&o.dims, &l.dims);
        if !o.float {
            inputs.push(format!("{}: {}[{dims}]", o.name, o.dtype));
            continue;
        }
        if l.pending.is_empty() {
            weights.push_str(&format!(
                "  {}: {}[{dims}] init normal(0.5)\n",
                o.name, o.dtype
            ));
            continue;
        }
        // A partial value: a reduction over a dim split over the pending axes.
        let k = 1i64 << l.pending.len();
        let lead = match l.pending.len() {
            1 => format!("{k}@{}", l.pending[0]),
            _ => format!("{k}@({})", l.pending.join(", ")),
        };
        weights.push_str(&format!(
            "  w_{}: {}[{lead}, {dims}] init normal(0.5)\n",
            o.name, o.dtype
        ));
        lets.push_str(&format!(
            "    let {} = {}(w_{}, dim: 0)\n",
            o.name, o.pending, o.name
        ));
    }
    format!(
        "{mesh}\nmodel T {{\n{weights}  fn forward({}) {{\n{lets}    reduce({expr})\n  }}\n}}\ntrain T on m {{ batch: 1, steps: 1, optimizer: sgd(lr: 0.1) }}\n",
        inputs.join(", ")
    )
}

pub fn lowered(text: &str, one: bool) -> Option<Program> {
    let opts = Options {
        mesh: if one {
            vec![("a".into(), 1), ("b".into(), 1)]
                .into_iter()
                .filter(|(a, _)| text.contains(&format!("{a}: 2")))
                .collect()
        } else {
            vec![]
        },
        ..Options::default()
    };
    let c = world::compile_source(Path::new("prim.shard"), text.to_string(), &opts);
    if c.has_errors() {
        return None;
    }
    c.programs.into_iter().next()
}

/// Parameters by name, inputs, and the output's cotangent.
pub type Values = (HashMap<String, Vec<f64>>, Vec<Vec<f64>>, Vec<f64>);

/// Deterministic values: parameters spread over [-1, 1) with no two close
/// (a near-tie of a max or min would put a kink within a finite-difference
/// step), ids below 4, and a cotangent for the output.
pub fn values(prog: &Program) -> Values {
    let mut params = HashMap::new();
    for p in &prog.params {
        let n: usize = p.stored.known_shape().iter().product();
        let off = (shardc::init::hash_str(&p.name) % 1000) as f64;
        let v = (0..n)
            .map(|i| ((i as f64 + off) * 0.618_033_988_749_895).fract() * 2.0 - 1.0)
            .collect();
        params.insert(p.name.clone(), v);
    }
    let inputs = prog
        .nodes
        .iter()
        .filter(|n| matches!(n.op, shardc::spmd::Op::Input(_)))
        .map(|n| {
            let k: usize = n.ty.known_shape().iter().product();
            (0..k).map(|i| ((i * 7 + 3) % 4) as f64).collect()
        })
        .collect();
    let out = prog.output.map(|o| &prog.nodes[o as usize].ty);
    let k: usize = out.map_or(0, |t| t.known_shape().iter().product());
    let ct = (0..k).map(|i| (i as f64 * 0.37 + 0.1).sin()).collect();
    (params, inputs, ct)
}

pub fn run(
    prog: &Program,
    params: &HashMap<String, Vec<f64>>,
    inputs: &[Vec<f64>],
    ct: &[f64],
    text: &str,
) -> Probe {
    probe(prog, params, inputs, ct, candle_core::DType::F64, Some(42))
        .unwrap_or_else(|e| panic!("checks, but does not run: {e}\n{text}"))
}

pub fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}
