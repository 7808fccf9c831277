//! SparseCore input processing of a run: every step's lookup ids go through
//! [`crate::embed::preprocess_stack`] (statistics, limits, the table's overflow
//! policy), and with `fdo` the statistics are published every N steps and the
//! limits raised from what was loaded. Batches are known before training
//! starts, so this runs ahead of the devices; its messages are shown at the
//! steps they belong to, and a step that exceeds a limit under `overflow:
//! error` ends the plan there, so the run trains the steps before it and then
//! stops with the diagnostic.

pub use crate::embed::Placement;
use crate::embed::{self, FdoClient, Layout, Limits, Overflow, Partitioner};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// One table as a run uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct TableRun {
    pub name: String,
    /// The stack it belongs to (the name its FDO statistics are filed under).
    pub stack: String,
    pub layout: Layout,
    pub part: Partitioner,
    pub limits: Limits,
    pub policy: Overflow,
    /// `stack_max_ids_per_partition` / `stack_max_unique_ids_per_partition`: the
    /// limits of the stack when this table shares it with others.
    pub stack_limits: (Option<i64>, Option<i64>),
}

pub use crate::embed::STACK_DEFAULT_LIMIT;

/// The limits a stack of `tables` starts with ([`crate::embed::stack_limits`]).
pub fn stack_limits(tables: &[&TableRun]) -> Limits {
    let t: Vec<_> = tables.iter().map(|t| (t.limits, t.stack_limits)).collect();
    embed::stack_limits(&t)
}

/// One `lookup` whose ids are a model input.
#[derive(Clone, Debug, PartialEq)]
pub struct LookupRun {
    pub node: usize,
    pub input: usize,
    pub valency: usize,
    pub table: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Fdo {
    pub every: usize,
    pub dir: PathBuf,
    pub headroom: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseConfig {
    pub tables: Vec<TableRun>,
    pub lookups: Vec<LookupRun>,
    pub fdo: Option<Fdo>,
    pub sparsecores: usize,
}

/// Every step's drop masks and messages, up to the step that stopped the run.
#[derive(Clone, Debug, Default)]
pub struct Planned {
    /// One per step before `stop`'s step (all the steps when it is `None`).
    pub steps: Vec<StepSparse>,
    /// A step that exceeded a limit under `overflow: error`: the run trains the
    /// steps before it, then stops with this.
    pub stop: Option<super::train::RunError>,
}

impl Planned {
    /// The steps to train: `steps` when nothing stops the run.
    pub fn end(&self, steps: usize) -> usize {
        match &self.stop {
            Some(e) => e.step.map_or(0, |s| s.saturating_sub(1)).min(steps),
            None => steps,
        }
    }
    pub fn get(&self, step: usize) -> Option<&StepSparse> {
        self.steps.get(step)
    }
}

/// What one step needs and says.
#[derive(Clone, Debug, Default)]
pub struct StepSparse {
    /// Per lookup node: 1/0 per id of the global batch (absent: keep all).
    pub keep: HashMap<usize, Vec<f64>>,
    pub notes: Vec<String>,
}

/// Process every step's ids. `inputs(s, k)` is model input `k` of step `s` (global,
/// row-major). Steps before `start` (a resumed run) are replayed without writing
/// FDO files, so the limits are what they were when the checkpoint was written.
/// Lookups of tables in one stack are processed together (feature stacking),
/// against the stack's limits ([`stack_limits`]).
/// The host side of a run's processes: this process's index (its FDO files are
/// `fdo_stats_<process>_*.npz`), how many there are (only their files are
/// loaded), and a barrier across all of them, so that every
/// process has published before any loads, and has loaded before any publishes
/// again (as JAX's multi-host FDO does).
pub struct Host<'a> {
    pub process: usize,
    pub processes: usize,
    pub barrier: &'a dyn Fn() -> Result<(), String>,
}

pub fn plan_steps(
    cfg: &SparseConfig,
    steps: usize,
    start: usize,
    host: &Host,
    inputs: &dyn Fn(usize, usize) -> Vec<f64>,
) -> Result<Planned, super::train::RunError> {
    if cfg.lookups.is_empty() {
        // Nothing per step (callers look steps up with `get`).
        return Ok(Planned::default());
    }
    let mut out = vec![StepSparse::default(); steps];
    let mut p = Planner::new(cfg, host);
    'steps: for (s, slot) in out.iter_mut().enumerate() {
        for k in 0..p.stacks.len() {
            if let Err(e) = p.stack_step(s, k, slot, start, inputs) {
                p.stop = Some(*e);
                break 'steps;
            }
        }
        p.fdo_step(s, slot, start)?;
    }
    if let Some(e) = &p.stop {
        out.truncate(e.step.unwrap_or(1).saturating_sub(1));
    }
    Ok(Planned {
        steps: out,
        stop: p.stop,
    })
}

/// The state [`plan_steps`] carries from step to step.
struct Planner<'a> {
    cfg: &'a SparseConfig,
    host: &'a Host<'a>,
    /// Stacks in table order, each with its tables.
    stacks: Vec<(String, Vec<usize>)>,
    limits: Vec<Limits>,
    /// The strictest policy of a stack's tables applies to it.
    policy: Vec<Overflow>,
    /// Where each stack's current limits come from, for the diagnostic.
    origin: Vec<String>,
    client: Option<FdoClient>,
    /// What was recorded so far, for replayed steps (no files then).
    recorded: BTreeMap<String, embed::Stats>,
    /// What statistics files can hold, per stack (their sanity checks).
    expect: BTreeMap<String, embed::Expected>,
    stop: Option<super::train::RunError>,
}

impl<'a> Planner<'a> {
    fn new(cfg: &'a SparseConfig, host: &'a Host<'a>) -> Planner<'a> {
        let mut stacks: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, t) in cfg.tables.iter().enumerate() {
            match stacks.iter_mut().find(|s| s.0 == t.stack) {
                Some(s) => s.1.push(i),
                None => stacks.push((t.stack.clone(), vec![i])),
            }
        }
        let limits = stacks
            .iter()
            .map(|(_, ts)| stack_limits(&ts.iter().map(|&i| &cfg.tables[i]).collect::<Vec<_>>()))
            .collect();
        let policy = stacks
            .iter()
            .map(|(_, ts)| {
                let ps: Vec<Overflow> = ts.iter().map(|&i| cfg.tables[i].policy).collect();
                if ps.contains(&Overflow::Error) {
                    Overflow::Error
                } else if ps.contains(&Overflow::Drop) {
                    Overflow::Drop
                } else {
                    Overflow::Grow
                }
            })
            .collect();
        Planner {
            cfg,
            host,
            origin: vec!["as declared".to_string(); stacks.len()],
            stacks,
            limits,
            policy,
            client: cfg
                .fdo
                .as_ref()
                .map(|f| FdoClient::new(&f.dir, host.process)),
            recorded: BTreeMap::new(),
            expect: BTreeMap::new(),
            stop: None,
        }
    }

    /// `table `a`` or `table `a` (stack `s` of 2 tables)`.
    fn label(&self, k: usize) -> String {
        let (cfg, (name, ts)) = (self.cfg, &self.stacks[k]);
        match ts.as_slice() {
            [one] => format!("table `{}`", cfg.tables[*one].name),
            _ => format!(
                "table `{}` (stack `{name}` of {} tables)",
                cfg.tables[ts[0]].name,
                ts.len()
            ),
        }
    }

    /// Stack `k`'s lookups at step `s`: their statistics against the
    /// limits, what the policy does with the excess, and the step's notes
    /// and drop masks. A step over a limit under `overflow: error` is the
    /// run's stop.
    fn stack_step(
        &mut self,
        s: usize,
        k: usize,
        slot: &mut StepSparse,
        start: usize,
        inputs: &dyn Fn(usize, usize) -> Vec<f64>,
    ) -> Result<(), Box<super::train::RunError>> {
        let cfg = self.cfg;
        let (stack, ts) = (&self.stacks[k].0, &self.stacks[k].1);
        let ls: Vec<&LookupRun> = cfg
            .lookups
            .iter()
            .filter(|l| ts.contains(&l.table))
            .collect();
        if ls.is_empty() {
            return Ok(());
        }
        let ids: Vec<Vec<i64>> = ls
            .iter()
            .map(|l| inputs(s, l.input).iter().map(|x| *x as i64).collect())
            .collect();
        let features: Vec<embed::Feature> = ls
            .iter()
            .zip(&ids)
            .map(|(l, ids)| embed::Feature {
                ids,
                valency: l.valency,
                part: cfg.tables[l.table].part,
                table: l.table,
            })
            .collect();
        let layout = cfg.tables[ts[0]].layout;
        let most: usize = features
            .iter()
            .map(|f| (f.ids.len() / f.valency.max(1)).div_ceil(layout.sources()) * f.valency.max(1))
            .sum();
        let e = self.expect.entry(stack.clone()).or_insert(embed::Expected {
            partitions: features[0].part.n.max(1),
            devices: layout.devices.max(1),
            max_ids: Some(0),
        });
        e.max_ids = e.max_ids.max(Some(most as i64));
        let (stats, keep, exceeded) = match embed::preprocess_stack(
            &features,
            layout,
            &mut self.limits[k],
            self.policy[k],
        ) {
            Ok(x) => x,
            Err(e) => {
                let what = if e.limit_name == "max_ids_per_partition" {
                    "ids"
                } else {
                    "distinct ids"
                };
                return Err(Box::new(super::train::RunError {
                    step: Some(s + 1),
                    table: Some(cfg.tables[ts[0]].name.clone()),
                    node: None,
                    fault: crate::fault::Fault::Data(format!(
                        "step {}: {}: SparseCore {} of device {} sends {} {what} to partition {}, over `{}: {}` ({})",
                        s + 1, self.label(k), e.sparsecore, e.device, e.observed, e.partition, e.limit_name, e.limit, self.origin[k]
                    ) + &format!(
                        "\n  help: `overflow: grow` in the table raises the limit when a step needs it (logged) and `overflow: drop` drops the excess ids (counted); `fdo` raises limits from observed statistics; or set `{}: {}`",
                        e.limit_name, e.observed
                    )),
                }));
            }
        };
        if self.policy[k] == Overflow::Grow && !exceeded.is_empty() {
            self.origin[k] = format!("grown at step {}", s + 1);
        }
        if s >= start {
            slot.notes.extend(self.exceeded_notes(k, &exceeded));
        }
        if self.policy[k] == Overflow::Drop {
            for (l, m) in ls.iter().zip(keep) {
                slot.keep
                    .insert(l.node, m.iter().map(|k| f64::from(u8::from(*k))).collect());
            }
        }
        self.recorded
            .entry(stack.clone())
            .or_default()
            .merge_max(&stats);
        if let Some(c) = self.client.as_mut() {
            c.record(stack, &stats);
        }
        Ok(())
    }

    /// One line per SparseCore and partition, however many limits it
    /// exceeded (a drop is counted once).
    fn exceeded_notes(&self, k: usize, exceeded: &[embed::Exceeded]) -> Vec<String> {
        let mut notes = Vec::new();
        let mut i = 0;
        while i < exceeded.len() {
            let e = &exceeded[i];
            let same: Vec<&embed::Exceeded> = exceeded[i..]
                .iter()
                .take_while(|x| {
                    (x.device, x.sparsecore, x.partition) == (e.device, e.sparsecore, e.partition)
                })
                .collect();
            i += same.len();
            let over: Vec<String> = same
                .iter()
                .map(|x| {
                    let what = if x.limit_name == "max_ids_per_partition" {
                        "ids"
                    } else {
                        "distinct ids"
                    };
                    format!("{} {what} (`{}: {}`)", x.observed, x.limit_name, x.limit)
                })
                .collect();
            let what = match self.policy[k] {
                Overflow::Grow => same
                    .iter()
                    .map(|x| format!("raised `{}` to {}", x.limit_name, x.observed))
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => format!(
                    "dropped {} ids",
                    same.iter().map(|x| x.dropped).sum::<i64>()
                ),
            };
            notes.push(format!(
                "{}: SparseCore {} of device {} needs {} in partition {}: {what}",
                self.label(k),
                e.sparsecore,
                e.device,
                over.join(" and "),
                e.partition
            ));
        }
        notes
    }

    /// FDO after step `s` when its cadence asks: publish this process's
    /// statistics, load every process's, and set the limits from them (a
    /// replayed step uses what was recorded, without files).
    fn fdo_step(
        &mut self,
        s: usize,
        slot: &mut StepSparse,
        start: usize,
    ) -> Result<(), super::train::RunError> {
        let Some(f) = &self.cfg.fdo else {
            return Ok(());
        };
        if !(s + 1).is_multiple_of(f.every.max(1)) {
            return Ok(());
        }
        let (merged, published) = match (s >= start, self.client.as_mut()) {
            (true, Some(c)) => {
                let path = c.publish()?;
                (self.host.barrier)()?;
                let loaded = embed::load_expecting(&f.dir, &self.expect);
                (self.host.barrier)()?;
                let l = loaded?;
                let mut note = format!(
                    "FDO: published {} ({} file(s) loaded)",
                    path.display(),
                    l.files.len()
                );
                for w in &l.warnings {
                    note += &format!("; warning: {w}");
                }
                // A refused file leaves every limit as it was.
                (
                    if l.refused.is_empty() {
                        l.stats
                    } else {
                        BTreeMap::new()
                    },
                    note,
                )
            }
            _ => (self.recorded.clone(), String::new()),
        };
        let mut changes = Vec::new();
        for k in 0..self.stacks.len() {
            let Some(st) = merged.get(&self.stacks[k].0) else {
                continue;
            };
            let (new, buffer) = embed::limits_from(st, f.headroom, self.cfg.sparsecores);
            if new != self.limits[k] {
                changes.push(format!(
                    "{}: max_ids_per_partition {} → {}, max_unique_ids_per_partition {} → {}, buffer {buffer} per device",
                    self.label(k), self.limits[k].max_ids, new.max_ids, self.limits[k].max_unique_ids, new.max_unique_ids
                ));
            }
            self.limits[k] = new;
            self.origin[k] = format!("set by FDO after step {}", s + 1);
        }
        if s >= start {
            slot.notes.push(if changes.is_empty() {
                format!("{published}; limits unchanged")
            } else {
                format!("{published}; {}", changes.join("; "))
            });
        }
        Ok(())
    }
}

/// Each table parameter's placement (`tables.NAME`), by parameter index.
pub fn placements(prog: &crate::spmd::Program, cfg: &SparseConfig) -> HashMap<usize, Placement> {
    let mut out = HashMap::new();
    for (i, p) in prog.params.iter().enumerate() {
        let Some(name) = p.name.strip_prefix("tables.") else {
            continue;
        };
        let Some(t) = cfg.tables.iter().find(|t| t.name == name) else {
            continue;
        };
        let Some(vocab) = p.stored.dims.first().and_then(|d| d.size.as_const()) else {
            continue;
        };
        let vocab = vocab.max(1) as usize;
        let split = p.stored.dims.first().is_some_and(|d| !d.axes.is_empty());
        let devices = if split { t.layout.devices.max(1) } else { 1 };
        out.insert(
            i,
            Placement {
                vocab,
                devices,
                sparsecores: t.layout.sparsecores,
                part: Partitioner {
                    n: devices * t.layout.sparsecores.max(1),
                    shift: t.part.shift,
                },
                mod_rows: vocab.is_multiple_of(devices * t.layout.sparsecores.max(1)),
            },
        );
    }
    out
}
