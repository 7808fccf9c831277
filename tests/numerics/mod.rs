//! Numerical test helpers shared by the runtime and model tests: compile a
//! model for a mesh, train it a few steps (f32 or f64) for its first losses and
//! gradients, compare a sharded run with a mesh of 1, and check gradients
//! against central finite differences.
#![allow(dead_code)]

use shardc::runtime::train::{self, Config, Named};
use shardc::spmd::Program;
use shardc::world::{self, Options};
use std::path::Path;

pub fn setup_text(
    name: &str,
    text: &str,
    mesh: &[(&str, i64)],
    model: Option<&str>,
) -> (Program, Config, shardc::runtime::data::Source) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    let opts = Options {
        mesh: mesh.iter().map(|(a, n)| (a.to_string(), *n)).collect(),
        grants: vec![std::env::temp_dir()], // the tests' checkpoint directories
        ..Options::default()
    };
    let c = world::compile_source(&path, text.to_string(), &opts);
    assert!(
        !c.has_errors(),
        "{name}: {:?}",
        c.diagnostics
            .iter()
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
    );
    let (prog, _, cfg, src) = c.prepare(model).expect("runnable");
    (prog.clone(), cfg, src)
}

pub fn setup(
    file: &str,
    mesh: &[(&str, i64)],
    model: Option<&str>,
) -> (Program, Config, shardc::runtime::data::Source) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("model file");
    setup_text(file, &text, mesh, model)
}

pub fn grads_and_losses(
    file: &str,
    mesh: &[(&str, i64)],
    model: Option<&str>,
    steps: usize,
    f64: bool,
) -> (Named, Vec<f64>) {
    let (prog, mut cfg, src) = setup(file, mesh, model);
    cfg.steps = steps;
    if f64 {
        cfg.dtype = candle_core::DType::F64;
    }
    let out = train::run(&prog, &cfg, &src, true, &mut |_| {}).expect("run");
    (out.first_grads.expect("grads"), out.losses)
}

pub fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Per-tensor gradients and the first losses of a sharded run match the mesh-of-1 run.
pub fn compare(file: &str, sharded: &[(&str, i64)], single: &[(&str, i64)], model: Option<&str>) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("model file");
    compare_text(file, &text, sharded, single, model);
}

pub fn grads_and_losses_text(
    file: &str,
    text: &str,
    mesh: &[(&str, i64)],
    model: Option<&str>,
    steps: usize,
    f64: bool,
) -> (Named, Vec<f64>) {
    let (prog, mut cfg, src) = setup_text(file, text, mesh, model);
    cfg.steps = steps;
    if f64 {
        cfg.dtype = candle_core::DType::F64;
    }
    let out = train::run(&prog, &cfg, &src, true, &mut |_| {}).expect("run");
    (out.first_grads.expect("grads"), out.losses)
}

/// The names of a program's frozen parameters (buffers among them).
pub fn frozen_names(prog: &Program) -> Vec<&str> {
    prog.params
        .iter()
        .filter(|p| p.frozen)
        .map(|p| p.name.as_str())
        .collect()
}

pub fn compare_text(
    file: &str,
    text: &str,
    sharded: &[(&str, i64)],
    single: &[(&str, i64)],
    model: Option<&str>,
) {
    let grads_and_losses = |_: &str, mesh: &[(&str, i64)], model, steps, f64| {
        grads_and_losses_text(file, text, mesh, model, steps, f64)
    };
    let (g8, _) = grads_and_losses(file, sharded, model, 1, true);
    let (g1, _) = grads_and_losses(file, single, model, 1, true);
    // Frozen parameters (buffers) have no gradient.
    let (prog, _, _) = setup_text(file, text, single, model);
    let frozen = frozen_names(&prog);
    assert_eq!(g8.len(), g1.len());
    for ((n8, a), (n1, b)) in g8.iter().zip(&g1) {
        assert_eq!(n8, n1);
        let r = max_rel(a, b);
        assert!(
            r < 1e-5,
            "{file} {model:?}: gradient of `{n8}` differs by {r:e} (relative)"
        );
        if frozen.contains(&n1.as_str()) {
            assert!(
                b.iter().all(|x| *x == 0.0),
                "the frozen `{n1}` has a gradient"
            );
        } else {
            assert!(
                b.iter().any(|x| *x != 0.0),
                "`{n1}` has an all-zero gradient"
            );
        }
    }
    let (_, l8) = grads_and_losses(file, sharded, model, 10, false);
    let (_, l1) = grads_and_losses(file, single, model, 10, false);
    for (i, (x, y)) in l8.iter().zip(&l1).enumerate() {
        assert!(
            ((x - y) / y).abs() < 1e-4,
            "{file} {model:?}: loss {i} is {x} sharded vs {y} on one device"
        );
    }
}

pub fn loss_at(
    prog: &Program,
    cfg: &Config,
    src: &shardc::runtime::data::Source,
    params: &Named,
) -> f64 {
    let mut c = cfg.clone();
    c.steps = 1;
    c.dtype = candle_core::DType::F64;
    c.init = params.iter().cloned().collect();
    train::run(prog, &c, src, false, &mut |_| {})
        .expect("run")
        .losses[0]
}

pub fn global_params(prog: &Program, cfg: &Config) -> Named {
    // Initial values, computed as a one-device run would.
    let t = &prog.params;
    t.iter()
        .map(|p| {
            let v = shardc::runtime::buffers::initial(prog, p, cfg.seed).expect("initial value");
            (p.name.clone(), v)
        })
        .collect()
}

/// Central differences on every element of a small parameter (24 or fewer) and
/// a few of a larger one, on a sharded mesh.
/// Agreement is to 1e-5 relative, or within the rounding noise of the
/// difference itself (a few ulps of the loss over the step), which is what
/// bounds a small gradient of a large loss (a language model's).
pub fn finite_differences(name: &str, text: &str, mesh: &[(&str, i64)]) {
    let (prog, mut cfg, src) = setup_text(name, text, mesh, None);
    cfg.dtype = candle_core::DType::F64;
    cfg.steps = 1;
    let params = global_params(&prog, &cfg);
    cfg.init = params.iter().cloned().collect();
    let out = train::run(&prog, &cfg, &src, true, &mut |_| {}).expect("run");
    let grads = out.first_grads.expect("grads");
    let h = 1e-5;
    let noise = 8.0 * f64::EPSILON * out.losses[0].abs().max(1.0) / h;
    for (pi, (pname, values)) in params.iter().enumerate() {
        // A frozen parameter has no gradient (the run reports zeros for it).
        if prog.params[pi].frozen {
            assert!(
                grads[pi].1.iter().all(|g| *g == 0.0),
                "{name}: the frozen {pname} has a gradient"
            );
            continue;
        }
        let n = values.len();
        // Every element of a small parameter, a few of a large one.
        let picks: Vec<usize> = if n <= 24 {
            (0..n).collect()
        } else {
            vec![0, n / 3, n / 2, n - 1]
        };
        for k in picks {
            let mut plus = params.clone();
            plus[pi].1[k] += h;
            let mut minus = params.clone();
            minus[pi].1[k] -= h;
            let fd = (loss_at(&prog, &cfg, &src, &plus) - loss_at(&prog, &cfg, &src, &minus))
                / (2.0 * h);
            let an = grads[pi].1[k];
            let err = (fd - an).abs() / fd.abs().max(an.abs()).max(1e-6);
            assert!(
                err < 1e-5 || (fd - an).abs() < noise,
                "{name}: d loss / d {pname}[{k}]: analytic {an:e}, finite difference {fd:e}"
            );
        }
    }
}
