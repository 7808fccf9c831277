//! What a run shows and keeps while it trains: a progress bar or a line per
//! step, `--json` records, the TensorBoard log, and a caller's step hook
//! (the Python package's `on_step`, and its Ctrl-C).

use super::Ctx;
use std::io::Write;

/// Print a message above the progress bar, if there is one.
pub(super) fn progress_say(bar: &Option<indicatif::ProgressBar>, m: &str) {
    match bar {
        Some(b) => b.suspend(|| eprintln!("{m}")),
        None => eprintln!("{m}"),
    }
}

/// What a run shows while it trains, and the records it keeps: a progress
/// bar on a terminal, a line per step (thinned by `log_every`) otherwise, or
/// one JSON record per step with `--json`.
pub(super) struct Progress<'b> {
    bar: &'b Option<indicatif::ProgressBar>,
    quiet: bool,
    json: bool,
    log_every: usize,
    steps: usize,
    batch: usize,
    last: std::time::Instant,
    records: Vec<crate::runtime::report::Record>,
    /// The TensorBoard log, while it can be written.
    events: Option<crate::runtime::tensorboard::Events>,
    /// A caller's hook (the Python package's `on_step`): `false` ends the
    /// run after this step, through `stop`.
    hook: Option<&'b mut super::StepHook<'b>>,
    stop: Option<&'b crate::runtime::train::Stop>,
}

impl<'b> Progress<'b> {
    pub(super) fn new(
        cx: &Ctx,
        cfg: &crate::runtime::train::Config,
        bar: &'b Option<indicatif::ProgressBar>,
        events: Option<crate::runtime::tensorboard::Events>,
    ) -> Progress<'b> {
        Progress {
            bar,
            quiet: cx.quiet,
            json: cx.json,
            // `log_every: N` thins the plain per-step lines (metrics.jsonl keeps every step).
            log_every: cx.train.log_every.max(1),
            steps: cfg.steps,
            batch: cfg.batch,
            last: std::time::Instant::now(),
            // A resumed run continues its metrics: the records up to its checkpoint.
            records: crate::runtime::report::earlier(&cx.over.dir, cfg.start_step),
            events,
            hook: None,
            stop: None,
        }
    }

    /// A caller's hook on every step, and the request it makes to stop.
    pub(super) fn with_hook(
        mut self,
        hook: Option<&'b mut super::StepHook<'b>>,
        stop: Option<&'b crate::runtime::train::Stop>,
    ) -> Progress<'b> {
        self.hook = hook;
        self.stop = stop;
        self
    }

    /// Every step's record so far (a resumed run's earlier ones first).
    pub(super) fn into_records(self) -> Vec<crate::runtime::report::Record> {
        self.records
    }

    /// One step's report: its record, and what to show of it.
    pub(super) fn step(&mut self, r: &crate::runtime::train::StepReport) {
        let secs = r.done.saturating_duration_since(self.last).as_secs_f64();
        self.last = r.done;
        let rec = crate::runtime::report::Record {
            step: r.step + 1,
            loss: r.loss,
            lr: r.lr,
            grad_norm: r.grad_norm,
            step_ms: secs * 1e3,
            examples_per_s: self.batch as f64 / secs.max(1e-9),
            eval_loss: r.eval_loss,
            time: Some(crate::runtime::tensorboard::now()),
            events: r.notes.clone(),
            metrics: r
                .metrics
                .iter()
                .map(|(m, v)| (m.name().to_string(), serde_json::json!(v)))
                .chain(r.observed.iter().map(|(n, v)| {
                    let v = match v.as_slice() {
                        [x] => serde_json::json!(x),
                        xs => serde_json::json!(xs),
                    };
                    (n.clone(), v)
                }))
                .collect(),
        };
        self.show(&rec);
        if let Some(ev) = &mut self.events {
            if let Err(e) = ev.record(&rec) {
                // Training goes on; metrics.jsonl still has every step.
                eprintln!(
                    "warning: stopped writing the TensorBoard log `{}`: {e}",
                    ev.path().display()
                );
                self.events = None;
            }
        }
        if let Some(hook) = &mut self.hook {
            if !hook(&rec) {
                if let Some(stop) = self.stop {
                    stop.ask();
                }
            }
        }
        self.records.push(rec);
    }

    fn show(&self, rec: &crate::runtime::report::Record) {
        // Limits and FDO changes are worth a line even when steps are thinned.
        if !self.quiet && !self.json {
            for n in &rec.events {
                match &self.bar {
                    Some(b) => b.println(format!("step {}: {n}", rec.step)),
                    None => eprintln!("step {:>5}: {n}", rec.step),
                }
            }
        }
        if self.json {
            outln!("{}", serde_json::to_string(rec).unwrap_or_default());
        } else if let Some(b) = &self.bar {
            b.set_position(rec.step as u64);
            b.set_message(format!(
                "loss {:.4}{}  {:.0} examples/s",
                rec.loss,
                rec.metrics_line(),
                rec.examples_per_s
            ));
        } else if !self.quiet
            && (rec.step == 1
                || rec.step == self.steps
                || rec.step.is_multiple_of(self.log_every)
                || rec.eval_loss.is_some())
        {
            let eval = rec
                .eval_loss
                .map_or(String::new(), |e| format!("  eval {e:.6}"));
            eprintln!(
                "step {:>5}/{}  loss {:.6}{eval}{}  lr {:.3e}  |g| {:.4}  {:.0} ms  {:.0} examples/s",
                rec.step,
                self.steps,
                rec.loss,
                rec.metrics_line(),
                rec.lr,
                rec.grad_norm,
                rec.step_ms,
                rec.examples_per_s
            );
        }
    }
}
