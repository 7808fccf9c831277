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
    // Stacks in table order, each with its tables.
    let mut stacks: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, t) in cfg.tables.iter().enumerate() {
        match stacks.iter_mut().find(|s| s.0 == t.stack) {
            Some(s) => s.1.push(i),
            None => stacks.push((t.stack.clone(), vec![i])),
        }
    }
    let mut limits: Vec<Limits> = stacks
        .iter()
        .map(|(_, ts)| stack_limits(&ts.iter().map(|&i| &cfg.tables[i]).collect::<Vec<_>>()))
        .collect();
    // The strictest policy of a stack's tables applies to it.
    let policy: Vec<Overflow> = stacks
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
    let label = |k: usize| -> String {
        let (name, ts) = &stacks[k];
        match ts.as_slice() {
            [one] => format!("table `{}`", cfg.tables[*one].name),
            _ => format!(
                "table `{}` (stack `{name}` of {} tables)",
                cfg.tables[ts[0]].name,
                ts.len()
            ),
        }
    };
    // Where each stack's current limits come from, for the diagnostic.
    let mut origin: Vec<String> = vec!["as declared".to_string(); stacks.len()];
    let mut client = cfg
        .fdo
        .as_ref()
        .map(|f| FdoClient::new(&f.dir, host.process));
    // What was recorded so far, for replayed steps (no files then).
    let mut recorded: BTreeMap<String, embed::Stats> = BTreeMap::new();
    // What statistics files can hold, per stack (their sanity checks).
    let mut expect: BTreeMap<String, embed::Expected> = BTreeMap::new();
    let mut stop = None;
    'steps: for (s, slot) in out.iter_mut().enumerate() {
        for (k, (stack, ts)) in stacks.iter().enumerate() {
            let ls: Vec<&LookupRun> = cfg
                .lookups
                .iter()
                .filter(|l| ts.contains(&l.table))
                .collect();
            if ls.is_empty() {
                continue;
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
                .map(|f| {
                    (f.ids.len() / f.valency.max(1)).div_ceil(layout.sources()) * f.valency.max(1)
                })
                .sum();
            let e = expect.entry(stack.clone()).or_insert(embed::Expected {
                partitions: features[0].part.n.max(1),
                devices: layout.devices.max(1),
                max_ids: Some(0),
            });
            e.max_ids = e.max_ids.max(Some(most as i64));
            let (stats, keep, exceeded) = match embed::preprocess_stack(
                &features,
                layout,
                &mut limits[k],
                policy[k],
            ) {
                Ok(x) => x,
                Err(e) => {
                    let what = if e.limit_name == "max_ids_per_partition" {
                        "ids"
                    } else {
                        "distinct ids"
                    };
                    let stopped = super::train::RunError {
                            step: Some(s + 1),
                            table: Some(cfg.tables[ts[0]].name.clone()),
                            node: None,
                            message: format!(
                                "step {}: {}: SparseCore {} of device {} sends {} {what} to partition {}, over `{}: {}` ({})",
                                s + 1, label(k), e.sparsecore, e.device, e.observed, e.partition, e.limit_name, e.limit, origin[k]
                            ) + &format!(
                                "\n  help: `overflow: grow` in the table raises the limit when a step needs it (logged) and `overflow: drop` drops the excess ids (counted); `fdo` raises limits from observed statistics; or set `{}: {}`",
                                e.limit_name, e.observed
                            ),
                        };
                    stop = Some(stopped);
                    break 'steps;
                }
            };
            if policy[k] == Overflow::Grow && !exceeded.is_empty() {
                origin[k] = format!("grown at step {}", s + 1);
            }
            if s >= start {
                // One line per SparseCore and partition, however many limits it
                // exceeded (a drop is counted once).
                let mut i = 0;
                while i < exceeded.len() {
                    let e = &exceeded[i];
                    let same: Vec<&embed::Exceeded> = exceeded[i..]
                        .iter()
                        .take_while(|x| {
                            (x.device, x.sparsecore, x.partition)
                                == (e.device, e.sparsecore, e.partition)
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
                    let what = match policy[k] {
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
                    slot.notes.push(format!(
                        "{}: SparseCore {} of device {} needs {} in partition {}: {what}",
                        label(k),
                        e.sparsecore,
                        e.device,
                        over.join(" and "),
                        e.partition
                    ));
                }
            }
            if policy[k] == Overflow::Drop {
                for (l, m) in ls.iter().zip(keep) {
                    slot.keep
                        .insert(l.node, m.iter().map(|k| f64::from(u8::from(*k))).collect());
                }
            }
            recorded.entry(stack.clone()).or_default().merge_max(&stats);
            if let Some(c) = client.as_mut() {
                c.record(stack, &stats);
            }
        }
        let Some(f) = &cfg.fdo else { continue };
        if (s + 1) % f.every.max(1) != 0 {
            continue;
        }
        let (merged, published) = match (s >= start, client.as_mut()) {
            (true, Some(c)) => {
                let path = c.publish()?;
                (host.barrier)()?;
                let loaded = embed::load_expecting(&f.dir, &expect);
                (host.barrier)()?;
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
            _ => (recorded.clone(), String::new()),
        };
        let mut changes = Vec::new();
        for (k, (stack, _)) in stacks.iter().enumerate() {
            let Some(st) = merged.get(stack) else {
                continue;
            };
            let (new, buffer) = embed::limits_from(st, f.headroom, cfg.sparsecores);
            if new != limits[k] {
                changes.push(format!(
                    "{}: max_ids_per_partition {} → {}, max_unique_ids_per_partition {} → {}, buffer {buffer} per device",
                    label(k), limits[k].max_ids, new.max_ids, limits[k].max_unique_ids, new.max_unique_ids
                ));
            }
            limits[k] = new;
            origin[k] = format!("set by FDO after step {}", s + 1);
        }
        if s >= start {
            slot.notes.push(if changes.is_empty() {
                format!("{published}; limits unchanged")
            } else {
                format!("{published}; {}", changes.join("; "))
            });
        }
    }
    if let Some(e) = &stop {
        out.truncate(e.step.unwrap_or(1).saturating_sub(1));
    }
    Ok(Planned { steps: out, stop })
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
