//! Live reload of a running training (`shardc run --watch`). An edit that keeps
//! every parameter (name, shape, layout), the inputs, the output and the tables
//! replaces the program from the next step on, with the parameters and the
//! optimizer's state as they are: a new forward (another activation, a dropout
//! rate, a residual), new optimizer hyperparameters (learning rate, schedule,
//! weight decay, betas) or a new clipping norm. Anything else is refused with the
//! reason, and the training goes on unchanged.
//!
//! A reload at step k trains exactly as stopping after step k and resuming from
//! that checkpoint with the edited file would (`tests/runtime.rs` checks this).

use super::config::Config;
use super::pipeline::Stages;
use crate::spec::Optimizer;
use crate::spmd::{Op, Program};
use std::sync::{Arc, Mutex};

/// One accepted edit.
pub struct Update {
    /// 1 for the first reload, then 2, ...
    pub generation: usize,
    pub prog: Program,
    /// Of this configuration, a reload applies the optimizers and the clipping.
    pub cfg: Config,
    /// Not before this step (0-based); the devices take it at the first step
    /// they all reach after it was published.
    pub from_step: usize,
    /// What changed, for the log.
    pub summary: String,
}

/// The accepted edits of a run, in order. Devices agree on a generation at the
/// start of each step (the highest any of them has seen), so they all switch at
/// the same step.
#[derive(Default)]
pub struct Reloads {
    updates: Mutex<Vec<Arc<Update>>>,
}

impl Reloads {
    /// Publish an accepted edit; returns its generation.
    pub fn publish(&self, prog: Program, cfg: Config, from_step: usize, summary: String) -> usize {
        let Ok(mut u) = self.updates.lock() else {
            return 0;
        };
        let generation = u.len() + 1;
        u.push(Arc::new(Update {
            generation,
            prog,
            cfg,
            from_step,
            summary,
        }));
        generation
    }

    /// The newest generation that may apply at `step` (0: none).
    pub fn visible(&self, step: usize) -> usize {
        self.updates.lock().map_or(0, |u| {
            u.iter()
                .filter(|x| x.from_step <= step)
                .map(|x| x.generation)
                .max()
                .unwrap_or(0)
        })
    }

    pub fn get(&self, generation: usize) -> Option<Arc<Update>> {
        let u = self.updates.lock().ok()?;
        u.get(generation.checked_sub(1)?).cloned()
    }
}

fn inputs(p: &Program) -> Vec<String> {
    p.nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Input(_)))
        .map(|n| n.ty.to_string())
        .collect()
}

fn output(p: &Program) -> Option<String> {
    p.output
        .and_then(|o| p.nodes.get(o as usize))
        .map(|n| n.ty.to_string())
}

/// The hyperparameters that differ, as `name old → new`.
fn optimizer_changes(a: &Optimizer, b: &Optimizer) -> Vec<String> {
    b.changes_from(a)
}

/// Whether `new` (with `new_cfg`) can replace `old` in a running training. On
/// success, what changes (for the log); otherwise every reason it cannot.
pub fn compare(
    old: &Program,
    old_cfg: &Config,
    new: &Program,
    new_cfg: &Config,
) -> Result<String, Vec<String>> {
    let mut why = Vec::new();
    if old.model != new.model {
        why.push(format!("it trains `{}`, not `{}`", new.model, old.model));
    }
    if old.mesh != new.mesh {
        why.push("the mesh changed".into());
    }
    for p in &old.params {
        match new.params.iter().find(|q| q.name == p.name) {
            None => why.push(format!("parameter `{}` is gone", p.name)),
            Some(q) if q.stored != p.stored => why.push(format!(
                "parameter `{}` changed from {} to {}",
                p.name, p.stored, q.stored
            )),
            Some(_) => {}
        }
    }
    for q in &new.params {
        if !old.params.iter().any(|p| p.name == q.name) {
            why.push(format!("parameter `{}` is new", q.name));
        }
    }
    if why.is_empty()
        && old
            .params
            .iter()
            .map(|p| &p.name)
            .ne(new.params.iter().map(|p| &p.name))
    {
        why.push("the parameters are in another order".into());
    }
    if inputs(old) != inputs(new) {
        why.push(format!(
            "the inputs changed from [{}] to [{}]",
            inputs(old).join(", "),
            inputs(new).join(", ")
        ));
    }
    if output(old) != output(new) {
        why.push(format!(
            "the output changed from {} to {}",
            output(old).unwrap_or_default(),
            output(new).unwrap_or_default()
        ));
    }
    match (&old.pipeline, &new.pipeline) {
        (None, None) => {}
        (Some(a), Some(b))
            if (
                &a.axis,
                a.stages,
                a.microbatches,
                &a.schedule,
                a.blocks.len(),
            ) == (
                &b.axis,
                b.stages,
                b.microbatches,
                &b.schedule,
                b.blocks.len(),
            ) =>
        {
            // A stage holds only its own layers' parameters: they must stay put.
            let held = |p: &Program| Stages::of(p).ok().flatten().map(|s| s.param_stage);
            if held(old).is_none() || held(old) != held(new) {
                why.push("the parameters' pipeline stages changed".into());
            }
        }
        _ => why.push("the pipeline (axis, stages, microbatches or schedule) changed".into()),
    }
    if old_cfg.batch != new_cfg.batch || old_cfg.accumulate != new_cfg.accumulate {
        why.push("the batch or its accumulation changed".into());
    }
    if format!("{:?}", old_cfg.sparse) != format!("{:?}", new_cfg.sparse) {
        why.push("the tables' settings changed".into());
    }
    for p in &old.params {
        let Some(q) = new.params.iter().find(|q| q.name == p.name) else {
            continue;
        };
        if p.frozen != q.frozen {
            why.push(format!(
                "`{}` was {} (its optimizer state would change)",
                p.name,
                if q.frozen { "frozen" } else { "unfrozen" }
            ));
            continue;
        }
        let (a, b) = (old_cfg.optimizer_of(p), new_cfg.optimizer_of(q));
        if a.slots() != b.slots() {
            why.push(format!(
                "the optimizer of `{}` changed from {} to {}, which keeps other state",
                p.name,
                a.describe(),
                b.describe()
            ));
        }
    }
    if !why.is_empty() {
        return Err(why);
    }
    let mut changes = Vec::new();
    let (ops_old, ops_new) = (old.nodes.len(), new.nodes.len());
    let forward_same = ops_old == ops_new
        && old
            .nodes
            .iter()
            .zip(&new.nodes)
            .all(|(a, b)| a.op == b.op && a.args == b.args);
    if !forward_same {
        changes.push(format!("a changed forward ({ops_old} → {ops_new} ops)"));
    }
    if old_cfg.optimizer.name() != new_cfg.optimizer.name() {
        changes.push(format!(
            "optimizer {} → {}",
            old_cfg.optimizer.name(),
            new_cfg.optimizer.name()
        ));
    }
    changes.extend(optimizer_changes(&old_cfg.optimizer, &new_cfg.optimizer));
    for p in &old.params {
        if let (Some(a), Some(b)) = (
            old_cfg.per_param.get(&p.name),
            new_cfg.per_param.get(&p.name),
        ) {
            changes.extend(
                optimizer_changes(a, b)
                    .into_iter()
                    .map(|c| format!("`{}`: {c}", p.name)),
            );
        }
    }
    if old_cfg.clip != new_cfg.clip {
        let t = |c: Option<f64>| c.map_or("none".to_string(), |v| v.to_string());
        changes.push(format!(
            "clip_grad_norm {} → {}",
            t(old_cfg.clip),
            t(new_cfg.clip)
        ));
    }
    // Settings a reload does not apply: say so rather than ignore them.
    let mut later = Vec::new();
    if old_cfg.steps != new_cfg.steps {
        later.push("steps");
    }
    if old_cfg.seed != new_cfg.seed {
        later.push("seed");
    }
    if old_cfg.eval != new_cfg.eval {
        later.push("eval");
    }
    if old_cfg.checkpoint != new_cfg.checkpoint {
        later.push("checkpoint");
    }
    if old_cfg.dtype != new_cfg.dtype {
        later.push("dtype");
    }
    if old_cfg.compute != new_cfg.compute {
        later.push("precision");
    }
    let mut s = if changes.is_empty() {
        "nothing that changes the training".to_string()
    } else {
        changes.join("; ")
    };
    if !later.is_empty() {
        s += &format!(" ({} apply when the run restarts)", later.join(", "));
    }
    Ok(s)
}
