//! Data sources. Batches are global and deterministic (a function of the seed and
//! the step); each device takes its piece according to the input's layout.

use crate::arrays::Array;

/// One global batch: the model's inputs (flattened, row-major) and the labels:
/// class ids for a classifier, target values for a regression (`loss: mse`).
pub struct Batch {
    pub inputs: Vec<Vec<f64>>,
    pub labels: Vec<f64>,
    /// The loss function's weights, when it takes them ([`Source::weights`]);
    /// empty otherwise.
    pub weights: Vec<f64>,
}

/// What a synthetic source's labels are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Targets {
    /// Class ids, uniform in [0, classes).
    Classes,
    /// Normal values shaped like the output (a regression).
    Normal,
    /// 0 or 1 shaped like the output (binary cross-entropy).
    Binary,
}

pub enum Source {
    /// Normal inputs (integer inputs uniform below `vocab`, by default the
    /// model's classes) and random labels (see [`Targets`]): one fixed batch.
    Synthetic {
        classes: usize,
        vocab: Option<usize>,
        targets: Targets,
    },
    /// Synthetic clicks: inputs as `Synthetic` draws them but new every step,
    /// and per example a 0/1 label from a fixed rule of the seed (see [`click`]):
    /// a class id, or a target for each of the example's output elements.
    Clicks { vocab: Option<usize> },
    /// Token windows: inputs `seq` ids, labels the next `seq` ids.
    Tokens { ids: Vec<u32>, seq: usize },
    /// Windows of a token stream read by position (`data: tokens(...)`).
    Stream(std::sync::Arc<crate::data::stream::Stream>),
    /// A token source not yet converted (see [`Source::prepare`]): it gives
    /// no batches.
    Pending(std::sync::Arc<crate::data::convert::Pending>),
    /// Batches from an array file, checked by the data stage: inputs, labels and
    /// the held-out pair, each `[batch, ...]` (reused) or `[steps, batch, ...]`.
    Arrays(Box<crate::data::ArrayData>),
}

/// Batch `step` of an array shaped `[batch, ...]` (every step) or
/// `[steps, batch, ...]` (step `s` takes index `s mod steps`).
fn slice(a: &Array, step: usize, per_batch: usize) -> Vec<f64> {
    let n = a.values.len() / per_batch.max(1);
    let at = if n > 1 { step % n } else { 0 };
    a.values
        .to_f64(at * per_batch..(at + 1) * per_batch)
        .unwrap_or_default()
}

impl Source {
    /// A pending token source converted under `dir` (the run directory) and
    /// opened; any other source as it is.
    pub fn prepare(
        self,
        dir: &std::path::Path,
        progress: &mut dyn FnMut(crate::data::convert::Progress<'_>),
    ) -> Result<Source, crate::data::stream::StreamError> {
        match self {
            Source::Pending(p) => Ok(Source::Stream(std::sync::Arc::new(
                p.prepare(dir, progress)?,
            ))),
            other => Ok(other),
        }
    }

    /// Before a run: every id of a token stream (and of its held-out stream)
    /// read once, stopping at the first outside the vocabulary with its
    /// position; process `share.0` of `share.1` reads its part of each file
    /// only. `progress` sees (ids done, ids in all). Other sources were read
    /// whole by the data stage already.
    pub fn validate(
        &self,
        share: (usize, usize),
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), String> {
        let Source::Stream(s) = self else {
            return Ok(());
        };
        let part = |len: u64| {
            let (p, n) = (share.0 as u128, share.1.max(1) as u128);
            let at = |i: u128| (u128::from(len) * i / n) as u64;
            (at(p), at(p + 1))
        };
        let files = s.files();
        let all: u64 = files.iter().map(|f| part(f.len)).map(|r| r.1 - r.0).sum();
        let mut before = 0;
        for f in files {
            let r = part(f.len);
            f.scan(r, s.vocab, &mut |done| progress(before + done, all))
                .map_err(|e| e.to_string())?;
            before += r.1 - r.0;
        }
        Ok(())
    }

    /// A token stream's files, with the bytes this process read of each.
    pub fn reads(&self) -> Vec<(std::path::PathBuf, u64, u64)> {
        let Source::Stream(s) = self else {
            return vec![];
        };
        s.files()
            .iter()
            .map(|f| (f.path.clone(), f.bytes_read(), f.bytes()))
            .collect()
    }

    /// Whether every step's batch is the same (the synthetic source's one batch).
    pub fn same_every_step(&self) -> bool {
        // (Clicks draw a new batch every step.)
        matches!(self, Source::Synthetic { .. })
    }

    /// Batch `step`: `input_sizes` are the element counts of each input; `rows` the
    /// number of labels (batch × positions, or every output element for a
    /// regression); `held_out` draws from the eval split.
    #[allow(clippy::too_many_arguments)]
    pub fn batch(
        &self,
        seed: u64,
        step: usize,
        batch: usize,
        input_sizes: &[usize],
        int_inputs: &[bool],
        vocab: usize,
        rows: usize,
        per_position: bool,
        held_out: bool,
        want: Option<&[bool]>,
    ) -> Result<Batch, String> {
        Ok(match self {
            Source::Synthetic {
                classes,
                vocab: ids_below,
                targets,
            } => {
                // One batch reused every step, as seeds 000 and 003 do.
                let s = seed ^ crate::init::hash_str(if held_out { "held-out" } else { "data" });
                let inputs = draw_inputs(s, input_sizes, int_inputs, ids_below.unwrap_or(vocab));
                let c = (*classes).max(1);
                let t = s ^ 0x1234_5678;
                let labels = (0..rows as u64)
                    .map(|i| match targets {
                        Targets::Normal => crate::init::normal(t, i),
                        Targets::Binary => f64::from(u8::from(crate::init::uniform(t, i) < 0.5)),
                        Targets::Classes => {
                            ((crate::init::uniform(t, i) * c as f64) as i64 % c as i64) as f64
                        }
                    })
                    .collect();
                Batch {
                    inputs,
                    labels,
                    weights: Vec::new(),
                }
            }
            Source::Clicks { vocab: ids_below } => {
                let split = if held_out {
                    "clicks held-out"
                } else {
                    "clicks"
                };
                let s = seed
                    ^ crate::init::hash_str(split)
                    ^ (step as u64 + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93);
                let inputs = draw_inputs(s, input_sizes, int_inputs, ids_below.unwrap_or(vocab));
                let rule = seed ^ crate::init::hash_str("clicks rule");
                let b = batch.max(1);
                let clicks: Vec<f64> = (0..b)
                    .map(|e| click(rule, s, e, b, &inputs, int_inputs))
                    .collect();
                // Each example's click for each of its label rows (a binary
                // target per output element, or a class id).
                let per = (rows / b).max(1);
                let labels = (0..rows).map(|i| clicks[(i / per).min(b - 1)]).collect();
                Batch {
                    inputs,
                    labels,
                    weights: Vec::new(),
                }
            }
            Source::Arrays(a) => {
                let (inputs, labels) = (&a.inputs, &a.labels);
                let (xs, y) = match (held_out, &a.eval) {
                    (true, Some((x, y, _))) => (x, y),
                    _ => (inputs, labels),
                };
                Batch {
                    inputs: xs
                        .iter()
                        .zip(input_sizes)
                        .map(|(a, n)| slice(a, step, *n))
                        .collect(),
                    labels: slice(y, step, rows),
                    weights: Vec::new(),
                }
            }
            Source::Pending(_) => {
                return Err("a token source must be converted before it gives batches".into())
            }
            Source::Stream(s) => {
                let (x, y) = s
                    .batch(seed, step, batch, per_position, held_out, want)
                    .map_err(|e| e.to_string())?;
                Batch {
                    inputs: vec![x],
                    labels: y,
                    weights: Vec::new(),
                }
            }
            Source::Tokens { ids, seq } => {
                // Consecutive windows, wrapping around the first 90% of the corpus;
                // the last 10% is held out for `eval`.
                let split = ids.len() * 9 / 10;
                let ids = if held_out {
                    &ids[split..]
                } else {
                    &ids[..split]
                };
                let n = ids.len().max(seq + 2);
                let mut x = Vec::with_capacity(batch * seq);
                let mut y = Vec::with_capacity(batch * seq);
                for b in 0..batch {
                    let start = ((step * batch + b) * seq) % (n - seq - 1);
                    let id = |i: usize| ids.get(i).copied().unwrap_or(0) as usize % vocab.max(1);
                    for t in 0..*seq {
                        x.push(id(start + t) as f64);
                        if per_position {
                            y.push(id(start + t + 1) as f64);
                        }
                    }
                    if !per_position {
                        y.push(id(start + seq) as f64);
                    }
                }
                Batch {
                    inputs: vec![x],
                    labels: y,
                    weights: Vec::new(),
                }
            }
        })
    }
}

impl Source {
    /// The `n` weights of batch `step` for a loss function that takes them:
    /// an array source's array named after its third parameter; a random
    /// 0/1 mask from `synthetic` (each weight 1 with probability ½, one fixed
    /// mask like its batch); 1 for every target from any other source.
    pub fn weights(&self, seed: u64, step: usize, n: usize, held_out: bool) -> Vec<f64> {
        match self {
            Source::Arrays(a) => {
                let w = match (held_out, &a.eval) {
                    (true, Some((_, _, w))) => w.as_ref(),
                    _ => a.weights.as_ref(),
                };
                w.map_or_else(|| vec![1.0; n], |w| slice(w, step, n))
            }
            Source::Synthetic { .. } => {
                let s = seed
                    ^ crate::init::hash_str(if held_out { "held-out" } else { "data" })
                    ^ crate::init::hash_str("weights");
                (0..n as u64)
                    .map(|i| f64::from(u8::from(crate::init::uniform(s, i) < 0.5)))
                    .collect()
            }
            _ => vec![1.0; n],
        }
    }
}

/// Inputs as the synthetic sources draw them from stream `s`: integer inputs
/// uniform below `vocab`, float inputs normal.
fn draw_inputs(s: u64, input_sizes: &[usize], int_inputs: &[bool], vocab: usize) -> Vec<Vec<f64>> {
    input_sizes
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let sk = s ^ (k as u64 + 1).wrapping_mul(0x9E37_79B9);
            if int_inputs.get(k) == Some(&true) {
                (0..*n as u64)
                    .map(|i| (crate::init::uniform(sk, i) * vocab as f64).floor())
                    .collect()
            } else {
                (0..*n as u64).map(|i| crate::init::normal(sk, i)).collect()
            }
        })
        .collect()
}

/// Example `e`'s click (0 or 1) out of `b` examples: a score that sums, per
/// input, a fixed linear function of its float features or a fixed value per
/// id (each scaled by 1/√features), plus noise of a quarter of a feature's
/// weight; clicked when the score is positive. The rule depends on `rule`
/// only, so every step's examples follow the same rule.
fn click(rule: u64, s: u64, e: usize, b: usize, inputs: &[Vec<f64>], int_inputs: &[bool]) -> f64 {
    let mut score = 0.0;
    for (k, x) in inputs.iter().enumerate() {
        let m = x.len() / b;
        let rk = rule ^ (k as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
        let scale = 1.0 / (m.max(1) as f64).sqrt();
        for (j, v) in x.iter().skip(e * m).take(m).enumerate() {
            score += scale
                * match int_inputs.get(k) == Some(&true) {
                    true => crate::init::normal(rk, *v as u64),
                    false => crate::init::normal(rk, j as u64) * v,
                };
        }
    }
    score += 0.25 * crate::init::normal(s ^ 0x5EED_C11C, e as u64);
    f64::from(u8::from(score > 0.0))
}
