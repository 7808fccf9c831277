//! Generated tests of every primitive, from its registry entry alone: each
//! example call (`Def::examples`, operands written `{name: type}`) is checked
//! with every layout of its operands over a 2-device mesh and a 2×2 mesh (dims
//! split over one axis or both, pending reductions included). Each layout the
//! checker accepts is run, forward and backward, and must give the output and
//! the gradients of one device; on one device the gradients must match finite
//! differences in f64. A primitive gets these tests by being registered.
//!
//! They run twice: with shardc's own CPU kernels where they apply, and on the
//! candle-only path a GPU takes (`SHARDC_KERNELS=candle`, in a second process
//! of this test binary, since the choice is made once per process).

mod harness;

use harness::{layouts, lowered, max_rel, model, parse, run, values, Layout, Operand};
use shardc::prim::{self, Def};
use shardc::spmd::Program;
use std::collections::HashMap;

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
                let Some(o) = sharded.output else {
                    panic!("`{}`: the program has no output:\n{text}", def.name)
                };
                let out = &sharded.nodes[o as usize].ty;
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
    if std::env::var_os("SHARDC_KERNELS").is_none() {
        the_same_on_the_candle_only_path();
    }
}

/// This test again in a process that runs candle's kernels only.
fn the_same_on_the_candle_only_path() {
    let me = std::env::current_exe().expect("this test binary");
    let out = std::process::Command::new(me)
        .args([
            "--exact",
            "every_primitive_matches_one_device_and_finite_differences",
            "--test-threads",
            "1",
        ])
        .env("SHARDC_KERNELS", "candle")
        .output()
        .expect("the test binary runs");
    assert!(
        out.status.success(),
        "on the candle-only path (SHARDC_KERNELS=candle):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("the candle-only path (SHARDC_KERNELS=candle): passed too");
}
