//! Why a run stopped, as data: the [`Fault`] (its kind and message) and
//! where it happened — the step every device stopped at together, the node of
//! the program in force (the command line points at its source line, in the
//! reload that program came from), or the table whose limit a step exceeded.

use super::exec::OpError;
use crate::fault::Fault;
use candle_core::{DType, Tensor};

/// Why a run stopped.
#[derive(Clone, Debug)]
pub struct RunError {
    pub fault: Fault,
    /// Every device stopped at this step (1-based) together, from a check they
    /// all make on the same values (a non-finite loss, a table's limit): no
    /// device waits for another, and one report says it all.
    pub step: Option<usize>,
    /// The node of the first non-finite value, or of the op whose kernel
    /// failed, and the reload whose program it belongs to (0: the program
    /// the run started with).
    pub node: Option<(usize, usize)>,
    /// The table whose limit the step exceeded.
    pub table: Option<String>,
}

impl From<Fault> for RunError {
    fn from(fault: Fault) -> RunError {
        RunError {
            fault,
            step: None,
            node: None,
            table: None,
        }
    }
}

impl From<String> for RunError {
    fn from(message: String) -> RunError {
        Fault::from(message).into()
    }
}

impl From<&str> for RunError {
    fn from(message: &str) -> RunError {
        Fault::from(message).into()
    }
}

impl RunError {
    /// A kernel's failure in the program of reload `generation`, pointing at its op.
    pub fn op(e: OpError, generation: usize) -> RunError {
        RunError {
            fault: e.fault,
            node: e.node.map(|i| (i, generation)),
            ..Fault::Kernel(String::new()).into()
        }
    }

    /// The message, as the command line prints it.
    pub fn message(&self) -> &str {
        self.fault.message()
    }

    /// A non-finite loss at `step` (0-based), which every device sees at
    /// once: the first non-finite value of the tape, if any, names the op to
    /// blame.
    pub fn non_finite(step: usize, loss: f64, vals: &[Tensor], generation: usize) -> RunError {
        let first = vals.iter().position(|v| !all_finite(v));
        let message = match first {
            Some(_) => format!("step {}: the loss is {loss}; the first non-finite value is computed by the op below", step + 1),
            None => format!("step {}: the loss is {loss} (the logits are finite; the labels may be out of range)", step + 1),
        };
        RunError {
            fault: Fault::Numerical(message),
            step: Some(step + 1),
            node: first.map(|i| (i, generation)),
            table: None,
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

fn all_finite(t: &Tensor) -> bool {
    t.flatten_all()
        .and_then(|x| x.to_dtype(DType::F64))
        .and_then(|x| x.to_vec1::<f64>())
        .map(|v| v.iter().all(|x| x.is_finite()))
        .unwrap_or(true)
}
