//! `check` accepts nothing `run` cannot execute: every UI test, example and
//! seed model that checks clean trains for one step of each of its `train`
//! declarations (without writing checkpoints or FDO files). Runs too big for a
//! test are skipped by their plan, each named.

use shardc::runtime::train;
use shardc::world::{self, Options};
use std::path::{Path, PathBuf};

/// The most memory (over all devices) a run here may plan.
const BUDGET: f64 = 2.0 * (1u64 << 30) as f64;

fn files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v = Vec::new();
    for dir in ["tests/ui", "examples", "models", "tests/models"] {
        for e in std::fs::read_dir(root.join(dir)).expect("directory") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "shard") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

#[test]
fn everything_that_checks_clean_runs_one_step() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut ran, mut skipped, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for path in files() {
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        // (A file that is not UTF-8 is a UI test of E0004.)
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let c = world::compile_source(&rel, text, &Options::default());
        if c.has_errors() {
            continue;
        }
        for t in &c.spec.trains {
            let name = format!("{} ({})", rel.display(), t.model);
            let devices: i64 = c
                .programs
                .iter()
                .find(|p| p.model == t.model)
                .map_or(1, |p| p.mesh.iter().map(|m| m.1).product());
            let plan = c.plans.iter().find(|p| p.model == t.model);
            if let Some(p) = plan {
                if p.total_memory() * devices as f64 > BUDGET {
                    skipped.push(name);
                    continue;
                }
            }
            let (prog, _, mut cfg, src) = match c.prepare(Some(&t.model)) {
                Ok(x) => x,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            cfg.steps = 1;
            cfg.checkpoint = None;
            cfg.eval = None;
            cfg.sparse.fdo = None;
            // A parquet, Arrow or tokenized source is converted first, as `run` does.
            let scratch = std::env::temp_dir().join(format!("shardc-runs-{}", std::process::id()));
            let src = match src.prepare(&scratch, &mut |_| {}) {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{name}: checks clean but its data fails: {e}"));
                    continue;
                }
            };
            let r = train::run(prog, &cfg, &src, false, &mut |_| {});
            let _ = std::fs::remove_dir_all(&scratch);
            match r {
                Ok(_) => ran.push(name),
                Err(e) => failures.push(format!("{name}: checks clean but stops: {e}")),
            }
        }
    }
    eprintln!(
        "ran one step of {} trainings; skipped by their plan: {}",
        ran.len(),
        skipped.join(", ")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran.len() > 20, "only {} trainings ran", ran.len());
    // Only the full-size models check and plan here: GPT-J, GPT-3 175B, Llama
    // 3 8B (with and without its layout), and E0700's model that fits nowhere.
    let full_size = [
        "examples/gpt3_175b.shard (GPT3)",
        "models/gptj.shard (GPTJ)",
        "models/llama3_8b.shard (Llama3_8B)",
        "models/llama3_8b_bare.shard (Llama3_8B)",
        "tests/ui/no_layout_fits.shard (Wide)",
    ];
    let unexpected: Vec<&String> = skipped
        .iter()
        .filter(|s| !full_size.contains(&s.as_str()))
        .collect();
    assert!(unexpected.is_empty(), "skipped: {unexpected:?}");
}
