//! Live reload of a running training (`shardc run --watch`). An edit that keeps
//! every parameter (name, shape, layout), the inputs, the output and the tables
//! replaces the program from the next step on, with the parameters and the
//! optimizer's state as they are: a new forward (another activation, a dropout
//! rate, a residual), new optimizer hyperparameters (learning rate, schedule,
//! weight decay, betas) or a new clipping norm. Anything else is refused with the
//! reason, and the training goes on unchanged.
//!
//! What an edit of each `train` and `table` option does is that option's
//! declaration in the registry ([`crate::vocab::Reload`]): applied live, kept
//! until the run restarts (and named), or refused. [`compare`] reads those
//! declarations; it compares by hand only what no option holds: the program
//! (parameters, inputs, output, pipeline) and each parameter's optimizer
//! state.
//!
//! A reload at step k trains exactly as stopping after step k and resuming from
//! that checkpoint with the edited file would (`tests/runtime.rs` checks this).

use super::config::{self, Change, Config};
use super::pipeline::Stages;
use crate::spmd::{Op, Program};
use crate::vocab::{Reload, TABLE_OPTIONS, TRAIN_OPTIONS};
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

/// Whether `new` (with `new_cfg`) can replace `old` in a running training. On
/// success, what changes (for the log); otherwise every reason it cannot.
pub fn compare(
    old: &Program,
    old_cfg: &Config,
    new: &Program,
    new_cfg: &Config,
) -> Result<String, Vec<String>> {
    let mut why = program_changes(old, new);
    why.extend(state_changes(old, old_cfg, new, new_cfg));
    let mut edits = Edits::default();
    for o in TRAIN_OPTIONS.defs {
        if let Some(c) = config::change(o.tag, old_cfg, new_cfg) {
            edits.record(o.name, o.reload, c);
        }
    }
    for a in &old_cfg.tables {
        let Some(b) = new_cfg.tables.iter().find(|b| b.name == a.name) else {
            continue;
        };
        for o in TABLE_OPTIONS.defs {
            if let Some(c) = config::table_change(o.tag, a, b) {
                edits.record_table(&a.name, o.name, o.reload, c);
            }
        }
    }
    // What the run derived from the tables and the program (stacks, the
    // lookups' places in the program) must stay too.
    let (a, b) = (&old_cfg.sparse, &new_cfg.sparse);
    let derived = (&a.tables, &a.lookups, a.sparsecores) != (&b.tables, &b.lookups, b.sparsecores);
    if derived && edits.refused.is_empty() {
        why.push("the tables' settings changed".into());
    }
    why.append(&mut edits.refused);
    if !why.is_empty() {
        return Err(why);
    }
    let (ops_old, ops_new) = (old.nodes.len(), new.nodes.len());
    let forward_same = ops_old == ops_new
        && old
            .nodes
            .iter()
            .zip(&new.nodes)
            .all(|(a, b)| a.op == b.op && a.args == b.args);
    if !forward_same {
        edits
            .live
            .insert(0, format!("a changed forward ({ops_old} → {ops_new} ops)"));
    }
    let mut s = if edits.live.is_empty() {
        "nothing that changes the training".to_string()
    } else {
        edits.live.join("; ")
    };
    if !edits.later.is_empty() {
        s += &format!(" ({} apply when the run restarts)", edits.later.join(", "));
    }
    Ok(s)
}

/// The options an edit changes, sorted by their reload declarations.
#[derive(Default)]
struct Edits {
    /// Applied from the next step: `name old → new` lines.
    live: Vec<String>,
    /// Applied when the run restarts: their names.
    later: Vec<String>,
    /// Reasons the edit is refused.
    refused: Vec<String>,
}

impl Edits {
    fn record(&mut self, name: &str, reload: Reload, c: Change) {
        match reload {
            Reload::Live => {
                if c.was != c.now {
                    self.live.push(format!("{name} {} → {}", c.was, c.now));
                }
                self.live.extend(c.more);
            }
            Reload::Restart => self.later.push(name.to_string()),
            Reload::Refused => self
                .refused
                .push(format!("the {name} changed from {} to {}", c.was, c.now)),
        }
    }

    fn record_table(&mut self, table: &str, name: &str, reload: Reload, c: Change) {
        match reload {
            Reload::Live => {
                let of = format!("`tables.{table}`: ");
                if c.was != c.now {
                    self.live.push(format!("{of}{name} {} → {}", c.was, c.now));
                }
                self.live.extend(c.more.iter().map(|m| format!("{of}{m}")));
            }
            Reload::Restart => self.later.push(format!("table `{table}`'s {name}")),
            Reload::Refused => self.refused.push(format!(
                "the {name} of table `{table}` changed from {} to {}",
                c.was, c.now
            )),
        }
    }
}

/// What makes the programs' parameters, inputs, output or pipeline differ.
fn program_changes(old: &Program, new: &Program) -> Vec<String> {
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
    let names = |p: &Program| p.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    if why.is_empty() && names(old) != names(new) {
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
    let shape = |p: &crate::spmd::Pipeline| {
        (
            p.axis.clone(),
            p.stages,
            p.microbatches,
            p.schedule.name(),
            p.placement(),
            p.blocks.len(),
        )
    };
    match (&old.pipeline, &new.pipeline) {
        (None, None) => {}
        (Some(a), Some(b)) if shape(a) == shape(b) => {
            // A stage holds only its own layers' parameters: they must stay put.
            let held = |p: &Program| Stages::of(p).ok().flatten().map(|s| s.param_stage);
            if held(old).is_none() || held(old) != held(new) {
                why.push("the parameters' pipeline stages changed".into());
            }
        }
        _ => why.push("the pipeline (axis, stages, microbatches or schedule) changed".into()),
    }
    why
}

/// Parameters whose optimizer state an edit would change: frozen or
/// unfrozen, or stepped by an optimizer that keeps other slots.
fn state_changes(old: &Program, old_cfg: &Config, new: &Program, new_cfg: &Config) -> Vec<String> {
    let mut why = Vec::new();
    let (a_step, b_step) = (
        super::train::step_of(old, old_cfg),
        super::train::step_of(new, new_cfg),
    );
    for (i, p) in old.params.iter().enumerate() {
        let Some(j) = new.params.iter().position(|q| q.name == p.name) else {
            continue;
        };
        let q = &new.params[j];
        if p.frozen != q.frozen {
            why.push(format!(
                "`{}` was {} (its optimizer state would change)",
                p.name,
                if q.frozen { "frozen" } else { "unfrozen" }
            ));
            continue;
        }
        let (a, b) = (&a_step.params[i].optimizer, &b_step.params[j].optimizer);
        if crate::optim::rule(a).slots() != crate::optim::rule(b).slots() {
            why.push(format!(
                "the optimizer of `{}` changed from {} to {}, which keeps other state",
                p.name,
                a.describe(),
                b.describe()
            ));
        }
    }
    why
}
