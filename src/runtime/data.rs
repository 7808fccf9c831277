//! Data sources. Batches are global and deterministic (a function of the seed and
//! the step); each device takes its piece according to the input's layout.

use crate::arrays::Array;

/// One global batch: the model's inputs (flattened, row-major) and the labels:
/// class ids for a classifier, target values for a regression (`loss: mse`).
pub struct Batch {
    pub inputs: Vec<Vec<f64>>,
    pub labels: Vec<f64>,
}

pub enum Source {
    /// Normal inputs (integer inputs uniform below `vocab`, by default the
    /// model's classes), uniform labels in [0, classes) (or, for a regression,
    /// normal targets): one fixed batch.
    Synthetic {
        classes: usize,
        vocab: Option<usize>,
        regression: bool,
    },
    /// Token windows: inputs `seq` ids, labels the next `seq` ids.
    Tokens { ids: Vec<u32>, seq: usize },
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
        .get(at * per_batch..(at + 1) * per_batch)
        .map(<[f64]>::to_vec)
        .unwrap_or_default()
}

impl Source {
    /// Whether every step's batch is the same (the synthetic source's one batch).
    pub fn same_every_step(&self) -> bool {
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
    ) -> Batch {
        match self {
            Source::Synthetic {
                classes,
                vocab: ids_below,
                regression,
            } => {
                let vocab = ids_below.unwrap_or(vocab);
                // One batch reused every step, as seeds 000 and 003 do.
                let _ = step;
                let s = seed ^ crate::init::hash_str(if held_out { "held-out" } else { "data" });
                let mut inputs = Vec::new();
                for (k, n) in input_sizes.iter().enumerate() {
                    let sk = s ^ (k as u64 + 1).wrapping_mul(0x9E37_79B9);
                    // Token-id inputs are drawn uniformly below the vocabulary size.
                    if int_inputs.get(k) == Some(&true) {
                        inputs.push(
                            (0..*n as u64)
                                .map(|i| (crate::init::uniform(sk, i) * vocab as f64).floor())
                                .collect(),
                        );
                    } else {
                        inputs.push((0..*n as u64).map(|i| crate::init::normal(sk, i)).collect());
                    }
                }
                let c = (*classes).max(1);
                let labels = (0..rows as u64)
                    .map(|i| match regression {
                        true => crate::init::normal(s ^ 0x1234_5678, i),
                        false => {
                            ((crate::init::uniform(s ^ 0x1234_5678, i) * c as f64) as i64
                                % c as i64) as f64
                        }
                    })
                    .collect();
                Batch { inputs, labels }
            }
            Source::Arrays(a) => {
                let (inputs, labels) = (&a.inputs, &a.labels);
                let (xs, y) = match (held_out, &a.eval) {
                    (true, Some((x, y))) => (x, y),
                    _ => (inputs, labels),
                };
                Batch {
                    inputs: xs
                        .iter()
                        .zip(input_sizes)
                        .map(|(a, n)| slice(a, step, *n))
                        .collect(),
                    labels: slice(y, step, rows),
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
                }
            }
        }
    }
}
