//! Why a program stopped while it ran, as one typed value for every layer
//! that runs it: the primitives' kernels, the optimizers and the runtime all
//! return a [`Fault`], never a bare string, and candle's errors are sorted
//! into the same kinds where they arise. `shardc run` renders a fault with
//! the op's source line (the runtime's `RunError` adds the node, the step and
//! the table to it).

use std::fmt;

/// What went wrong, by kind, with what to tell the user.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Values whose shapes do not fit an op (a malformed program, an index
    /// the data put out of range).
    Shape(String),
    /// An element type an op cannot take.
    DType(String),
    /// The device: tensors on different devices, an op its backend lacks,
    /// memory.
    Device(String),
    /// The training data: a batch that does not fit, a table's limit a step
    /// exceeded.
    Data(String),
    /// A checkpoint that could not be written or read.
    Checkpoint(String),
    /// Non-finite values: the loss is NaN or infinite.
    Numerical(String),
    /// A collective: another device stopped, a process left the mesh.
    Collective(String),
    /// An op's kernel refused what it was given, for another reason.
    Kernel(String),
}

impl Fault {
    /// The kind, as `shardc run` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Shape(_) => "shape",
            Fault::DType(_) => "dtype",
            Fault::Device(_) => "device",
            Fault::Data(_) => "data",
            Fault::Checkpoint(_) => "checkpoint",
            Fault::Numerical(_) => "numerical",
            Fault::Collective(_) => "collective",
            Fault::Kernel(_) => "kernel",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Fault::Shape(m)
            | Fault::DType(m)
            | Fault::Device(m)
            | Fault::Data(m)
            | Fault::Checkpoint(m)
            | Fault::Numerical(m)
            | Fault::Collective(m)
            | Fault::Kernel(m) => m,
        }
    }

    /// The same fault with `context` before its message (`computing the
    /// initial value of `w`: ...`).
    pub fn context(self, context: &str) -> Fault {
        let with = |m: String| format!("{context}: {m}");
        match self {
            Fault::Shape(m) => Fault::Shape(with(m)),
            Fault::DType(m) => Fault::DType(with(m)),
            Fault::Device(m) => Fault::Device(with(m)),
            Fault::Data(m) => Fault::Data(with(m)),
            Fault::Checkpoint(m) => Fault::Checkpoint(with(m)),
            Fault::Numerical(m) => Fault::Numerical(with(m)),
            Fault::Collective(m) => Fault::Collective(with(m)),
            Fault::Kernel(m) => Fault::Kernel(with(m)),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Fault {}

/// candle's errors, sorted by what they say about the program.
impl From<candle_core::Error> for Fault {
    fn from(e: candle_core::Error) -> Fault {
        use candle_core::Error as E;
        // The error itself, not the backtrace candle keeps with it (printed
        // when RUST_BACKTRACE is set).
        let e = match e {
            E::WithBacktrace { inner, .. } => *inner,
            e => e,
        };
        let m = e.to_string();
        match e {
            E::UnexpectedDType { .. }
            | E::DTypeMismatchBinaryOp { .. }
            | E::UnsupportedDTypeForOp(..) => Fault::DType(m),
            E::DimOutOfRange { .. }
            | E::DuplicateDimIndex { .. }
            | E::UnexpectedNumberOfDims { .. }
            | E::UnexpectedShape { .. }
            | E::ShapeMismatch { .. }
            | E::ShapeMismatchBinaryOp { .. }
            | E::ShapeMismatchCat { .. }
            | E::ShapeMismatchSplit { .. }
            | E::OnlySingleDimension { .. }
            | E::EmptyTensor { .. }
            | E::NarrowInvalidArgs { .. }
            | E::InvalidIndex { .. }
            | E::BroadcastIncompatibleShapes { .. } => Fault::Shape(m),
            E::DeviceMismatchBinaryOp { .. } | E::Cuda(_) | E::Metal(_) => Fault::Device(m),
            // The mesh's collectives report through candle's `Msg`.
            E::Msg(_) if m.contains("another device stopped") => Fault::Collective(m),
            _ => Fault::Kernel(m),
        }
    }
}

/// A kernel's own message.
impl From<String> for Fault {
    fn from(m: String) -> Fault {
        Fault::Kernel(m)
    }
}

impl From<&str> for Fault {
    fn from(m: &str) -> Fault {
        Fault::Kernel(m.to_string())
    }
}
