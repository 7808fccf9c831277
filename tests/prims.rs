//! Generated tests of every primitive, from its registry entry alone: each
//! example call (`Def::examples`, operands written `{name: type}`) is checked
//! with every layout of its operands over a 2-device mesh and a 2×2 mesh (dims
//! split over one axis or both, pending reductions included). Each layout the
//! checker accepts is run, forward and backward, and must give the output and
//! the gradients of one device; on one device the gradients must match finite
//! differences in f64. A primitive gets these tests by being registered.

use shardc::prim::{self, Def};
use shardc::runtime::probe::{probe, Probe};
use shardc::spmd::Program;
use shardc::world::{self, Options};
use std::collections::HashMap;
use std::path::Path;

/// One operand of an example: its name, dtype, global dims, and the pending
/// reduction it may carry (`partial(max: a)` asks for max; sum otherwise).
#[derive(Clone, Debug)]
struct Operand {
    name: String,
    float: bool,
    dtype: String,
    dims: Vec<i64>,
    pending: &'static str,
}

/// The example with each placeholder replaced by its operand's name, and the
/// operands in order of first appearance.
fn parse(example: &str) -> (String, Vec<Operand>) {
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
enum Place {
    None,
    Dim(usize),
    Pending,
}

/// An operand's layout: the axes of each dim (in order), and its pending axes.
#[derive(Clone, Debug)]
struct Layout {
    dims: Vec<Vec<String>>,
    pending: Vec<String>,
}

/// Every layout of an operand over `axes` (each of size 2) with divisible dims.
fn layouts(op: &Operand, axes: &[&str]) -> Vec<Layout> {
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

fn dims_text(dims: &[i64], layout: &[Vec<String>]) -> String {
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
fn model(mesh: &str, expr: &str, ops: &[Operand], ls: &[&Layout]) -> String {
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

fn lowered(text: &str, one: bool) -> Option<Program> {
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
type Values = (HashMap<String, Vec<f64>>, Vec<Vec<f64>>, Vec<f64>);

/// Deterministic values: parameters spread over [-1, 1) with no two close
/// (a near-tie of a max or min would put a kink within a finite-difference
/// step), ids below 4, and a cotangent for the output.
fn values(prog: &Program) -> Values {
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

fn run(
    prog: &Program,
    params: &HashMap<String, Vec<f64>>,
    inputs: &[Vec<f64>],
    ct: &[f64],
    text: &str,
) -> Probe {
    probe(prog, params, inputs, ct, candle_core::DType::F64, Some(42))
        .unwrap_or_else(|e| panic!("checks, but does not run: {e}\n{text}"))
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Finite differences along one random direction against the gradients.
fn finite_differences(prog: &Program, text: &str) {
    let (params, inputs, ct) = values(prog);
    let base = run(prog, &params, &inputs, &ct, text);
    let dir: HashMap<String, Vec<f64>> = params
        .iter()
        .map(|(k, v)| {
            let h = shardc::init::hash_str(k);
            (
                k.clone(),
                (0..v.len())
                    .map(|i| shardc::init::normal(h, i as u64))
                    .collect(),
            )
        })
        .collect();
    let at = |s: f64| {
        let p: HashMap<String, Vec<f64>> = params
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.iter().zip(&dir[k]).map(|(x, d)| x + s * d).collect(),
                )
            })
            .collect();
        let out = run(prog, &p, &inputs, &ct, text).output;
        out.iter().zip(&ct).map(|(o, c)| o * c).sum::<f64>()
    };
    let h = 1e-5;
    let fd = (at(h) - at(-h)) / (2.0 * h);
    let an: f64 = base
        .grads
        .iter()
        .map(|(k, g)| g.iter().zip(&dir[k]).map(|(x, d)| x * d).sum::<f64>())
        .sum();
    let err = (fd - an).abs() / fd.abs().max(an.abs()).max(1e-3);
    assert!(
        err < 1e-6,
        "finite differences {fd:e} vs gradient {an:e} for\n{text}"
    );
}

/// Operand layouts to try: every combination when there are few, else each
/// operand's layouts with the others whole, and every operand in the same layout.
fn combos<'l>(all: &'l [Vec<Layout>], ops: &[Operand]) -> Vec<Vec<&'l Layout>> {
    let total: usize = all.iter().map(Vec::len).product();
    if total <= 400 {
        let mut out: Vec<Vec<&Layout>> = vec![vec![]];
        for ls in all {
            out = out
                .into_iter()
                .flat_map(|c| {
                    ls.iter().map(move |l| {
                        let mut c = c.clone();
                        c.push(l);
                        c
                    })
                })
                .collect();
        }
        return out;
    }
    let whole: Vec<&Layout> = all
        .iter()
        .map(|ls| ls.last().expect("the whole layout"))
        .collect();
    let mut out = Vec::new();
    for (i, ls) in all.iter().enumerate() {
        for l in ls {
            let mut c = whole.clone();
            c[i] = l;
            out.push(c);
        }
    }
    // Same-shaped operands in the same layout.
    for l in &all[0] {
        let mut c = whole.clone();
        for (i, ls) in all.iter().enumerate() {
            if ops[i].dims == ops[0].dims {
                if let Some(m) = ls
                    .iter()
                    .find(|x| x.dims == l.dims && x.pending == l.pending)
                {
                    c[i] = m;
                }
            }
        }
        out.push(c);
    }
    out
}

/// Check every example of `def`; returns (layouts tried, layouts run).
fn check_def(def: &Def) -> (usize, usize) {
    let (mut tried, mut ran) = (0, 0);
    for example in def.examples {
        let (expr, ops) = parse(example);
        for (mesh, axes) in [
            ("mesh m(a: 2)", vec!["a"]),
            ("mesh m(a: 2, b: 2)", vec!["a", "b"]),
        ] {
            let all: Vec<Vec<Layout>> = ops.iter().map(|o| layouts(o, &axes)).collect();
            let mut fd_done = false;
            for c in combos(&all, &ops) {
                tried += 1;
                let text = model(mesh, &expr, &ops, &c);
                let Some(sharded) = lowered(&text, false) else {
                    continue;
                };
                let out = &sharded.nodes[sharded.output.expect("output") as usize].ty;
                if !out.dtype.is_float() {
                    continue;
                }
                ran += 1;
                if !def.same_on_one_device {
                    // Its meaning depends on the mesh: only its derivative is checked.
                    if def.differentiable {
                        finite_differences(&sharded, &text);
                    }
                    continue;
                }
                let one = lowered(&text, true)
                    .unwrap_or_else(|| panic!("checks on its mesh but not on one device:\n{text}"));
                let (params, inputs, ct) = values(&sharded);
                let a = run(&sharded, &params, &inputs, &ct, &text);
                let b = run(&one, &params, &inputs, &ct, &text);
                let r = max_rel(&a.output, &b.output);
                assert!(
                    r < 1e-9,
                    "`{}`: output differs from one device by {r:e}:\n{text}",
                    def.name
                );
                for ((n, x), (_, y)) in a.grads.iter().zip(&b.grads) {
                    let r = max_rel(x, y);
                    assert!(
                        r < 1e-9,
                        "`{}`: gradient of `{n}` differs from one device by {r:e}:\n{text}",
                        def.name
                    );
                }
                if !fd_done && def.differentiable {
                    finite_differences(&one, &text);
                    finite_differences(&sharded, &text);
                    fd_done = true;
                }
            }
        }
    }
    (tried, ran)
}

#[test]
fn every_primitive_matches_one_device_and_finite_differences() {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for def in prim::defs() {
        if def.examples.is_empty() {
            continue;
        }
        match std::panic::catch_unwind(|| check_def(def)) {
            Ok((tried, ran)) => {
                report.push(format!(
                    "{}: {ran} of {tried} layouts checked and ran",
                    def.name
                ));
                if ran == 0 {
                    failures.push(format!("`{}`: no layout of its examples checks", def.name));
                }
            }
            Err(e) => failures.push(
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
