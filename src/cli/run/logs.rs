//! Where a run's records go: `--log` (the sinks), the TensorBoard log it
//! opens before step 1, and the run's configuration that log and
//! `metrics.jsonl` hold; the node times `--profile` measured.

use super::Ctx;

/// `--log jsonl,tensorboard`: the sinks, each once.
#[derive(Clone, Debug)]
pub struct LogArg(pub(super) Vec<crate::vocab::LogSink>);

pub(super) fn parse_log(s: &str) -> Result<LogArg, String> {
    let sinks = &crate::vocab::LOG_SINKS;
    if s.trim() == "none" {
        return Ok(LogArg(Vec::new()));
    }
    let mut out = Vec::new();
    for w in s.split(',').map(str::trim) {
        let Some(d) = sinks.find(w) else {
            let hint = crate::diag::did_you_mean(w, sinks.names())
                .map_or(String::new(), |n| format!(" (did you mean `{n}`?)"));
            return Err(format!(
                "`{w}` is not a log{hint}; logs are {}, or `none`",
                sinks.names().join(", ")
            ));
        };
        if !out.contains(&d.tag) {
            out.push(d.tag);
        }
    }
    Ok(LogArg(out))
}

impl Ctx<'_> {
    /// The TensorBoard log of this run (the first process writes it): the
    /// configuration as text, and a resumed run's earlier steps.
    pub(super) fn events(
        &self,
        cfg: &crate::runtime::train::Config,
    ) -> Result<crate::runtime::tensorboard::Events, crate::runtime::tensorboard::EventsError> {
        // Markdown: indented lines show as written.
        let indent = |t: &str| -> String { t.lines().map(|l| format!("    {l}\n")).collect() };
        let config = serde_json::to_string_pretty(&self.configuration(cfg)).unwrap_or_default();
        let mut texts = vec![(
            "config",
            format!("{}\n\n{}", self.headline(cfg), indent(&config)),
        )];
        if let Some(p) = self.plan() {
            texts.push(("plan", indent(&crate::plan::render(p, &self.c.sources))));
        }
        let earlier = crate::runtime::report::earlier(&self.over.dir, cfg.start_step);
        crate::runtime::tensorboard::Events::create(&self.over.dir, &texts, &earlier)
    }

    /// The run's configuration, as `metrics.jsonl`'s first line and the
    /// TensorBoard log's `config` text hold it: the file, model, mesh and
    /// settings, this shardc, and the plan's figures per device and step.
    pub(super) fn configuration(&self, cfg: &crate::runtime::train::Config) -> serde_json::Value {
        let axes: serde_json::Map<String, serde_json::Value> = self
            .prog
            .mesh
            .iter()
            .map(|(a, n)| (a.clone(), (*n).into()))
            .collect();
        let plan = self.plan().map(|p| {
            serde_json::json!({
                "bytes_per_device": p.total_memory(),
                "flops_per_step": p.step_flops(),
                "collectives_per_step": p.comms.iter().map(|c| c.count).sum::<u64>(),
                "comm_bytes_per_step": p.comm_per_step(),
            })
        });
        let log: Vec<&str> = cfg.log.iter().map(|l| l.name()).collect();
        serde_json::json!({
            "file": self.args.file.display().to_string(),
            "model": self.prog.model,
            "mesh": self.train.mesh,
            "axes": axes,
            "processes": self.processes,
            "device": self.args.device.to_string(),
            "steps": cfg.steps,
            "start_step": cfg.start_step,
            "batch": cfg.batch,
            "seed": cfg.seed,
            "optimizer": cfg.optimizer.name(),
            "precision": if self.args.f64 { "f64" } else { self.train.precision.name() },
            "loss": self.train.loss_name(),
            "ignore_index": self.train.loss_ignore,
            "log": log,
            "shardc": env!("CARGO_PKG_VERSION"),
            "plan": plan,
        })
    }
}

impl Ctx<'_> {
    /// `--profile`: each node's measured times, for `shardc plan --profile`
    /// (see [`crate::plan::measured`]); `Some` on the first process. Every
    /// process of the run calls it: each timed only its own devices, and
    /// their times are added up, step by step, before the medians are taken
    /// (as one process adds its devices').
    pub(super) fn profile(&self) -> Option<crate::plan::measured::Profile> {
        let n = self.prog.nodes.len();
        let mut per_step = crate::runtime::profile::pass_steps(n)?;
        if self.processes > 1 {
            if let Err(why) = self.sum_over_processes(&mut per_step) {
                if self.lead {
                    eprintln!("profile: not written to `profile.json`: {why}");
                }
                return None;
            }
        }
        self.lead.then(|| crate::plan::measured::Profile {
            format: crate::plan::measured::FORMAT.into(),
            model: self.prog.model.clone(),
            program: crate::plan::measured::fingerprint(self.prog),
            steps: per_step.len(),
            nodes: crate::runtime::profile::medians(&per_step, n),
        })
    }

    /// Writes [`Ctx::profile`]'s result to `profile.json` in the run directory.
    pub(super) fn write_profile(
        &self,
        dir: &std::path::Path,
        profile: Option<crate::plan::measured::Profile>,
    ) {
        let Some(profile) = profile else { return };
        let path = dir.join("profile.json");
        let json = serde_json::to_string(&profile).unwrap_or_default();
        match crate::files::write_replace(&path, json.as_bytes()) {
            Ok(()) => eprintln!(
                "profile: node times in `{}` (`shardc plan FILE --profile {}` times the pipeline's passes with them)",
                path.display(),
                path.display()
            ),
            Err(e) => eprintln!("warning: could not write `{}`: {e}", path.display()),
        }
    }

    /// Each process's per-step node times added up over the run's
    /// processes (a collective: every process calls it). The processes must
    /// have timed as many steps: the count is checked first (its sum and
    /// the sum of its square both say so only when every count is equal).
    fn sum_over_processes(&self, per_step: &mut [Vec<[f64; 3]>]) -> Result<(), String> {
        let cluster = self.procs.cluster();
        let len = per_step.len() as f64;
        let mut counts = [len, len * len];
        cluster.host_sum(&mut counts)?;
        let p = self.processes as f64;
        if counts[0] != len * p || counts[1] != len * len * p {
            return Err("the processes timed different numbers of steps".into());
        }
        let mut flat: Vec<f64> = per_step.iter().flatten().flatten().copied().collect();
        cluster.host_sum(&mut flat)?;
        for (x, v) in per_step.iter_mut().flatten().flatten().zip(flat) {
            *x = v;
        }
        Ok(())
    }

    /// A pipelined run's measured idle share per rank beside the plan's
    /// (see `shardc plan --profile` for a plan from measured pass times).
    pub(super) fn idle_line(&self, idle: Option<&[f64]>) -> Option<String> {
        let idle = idle?;
        let pct = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{:.1}%", x * 100.0))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let planned = self
            .plan()
            .and_then(|p| p.pipeline.as_ref())
            .map_or(String::new(), |p| {
                format!(" (planned from FLOPs: {})", pct(&p.idle))
            });
        Some(format!(
            "pipeline: each rank idle {} of the steps after the first{planned}",
            pct(idle)
        ))
    }
}
