//! Why a run stopped, as data: the command line renders it, pointing at the
//! op's source line (the node of the program in force), or at the table
//! whose limit a step exceeded.

use super::exec::OpError;
use candle_core::{DType, Tensor};

/// Why a run stopped.
#[derive(Clone, Debug, Default)]
pub struct RunError {
    pub message: String,
    /// Every device stopped at this step (1-based) together, from a check they
    /// all make on the same values (a non-finite loss, a table's limit): no
    /// device waits for another, and one report says it all.
    pub step: Option<usize>,
    /// The node of the first non-finite value, and the reload whose program it
    /// belongs to (0: the program the run started with).
    pub node: Option<(usize, usize)>,
    /// The table whose limit the step exceeded.
    pub table: Option<String>,
}

impl From<String> for RunError {
    fn from(message: String) -> RunError {
        RunError {
            message,
            ..RunError::default()
        }
    }
}

impl RunError {
    /// A kernel's failure in the program of reload `generation`, pointing at its op.
    pub fn op(e: OpError, generation: usize) -> RunError {
        RunError {
            message: e.message,
            node: e.node.map(|i| (i, generation)),
            ..RunError::default()
        }
    }

    /// A non-finite loss at `step` (0-based), which every device sees at
    /// once: the first non-finite value of the tape, if any, names the op to
    /// blame.
    pub fn non_finite(step: usize, loss: f64, vals: &[Tensor], generation: usize) -> RunError {
        let first = vals.iter().position(|v| !all_finite(v));
        RunError {
            message: match first {
                Some(_) => format!("step {}: the loss is {loss}; the first non-finite value is computed by the op below", step + 1),
                None => format!("step {}: the loss is {loss} (the logits are finite; the labels may be out of range)", step + 1),
            },
            step: Some(step + 1),
            node: first.map(|i| (i, generation)),
            table: None,
        }
    }
}

impl From<&str> for RunError {
    fn from(message: &str) -> RunError {
        message.to_string().into()
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn all_finite(t: &Tensor) -> bool {
    t.flatten_all()
        .and_then(|x| x.to_dtype(DType::F64))
        .and_then(|x| x.to_vec1::<f64>())
        .map(|v| v.iter().all(|x| x.is_finite()))
        .unwrap_or(true)
}
