//! Why a checkpoint is not trusted, as data; all wording lives in the `Display`
//! impl. A checkpoint is refused when its files disagree with each other (a
//! tensor missing, a checksum that does not match) or with the program resuming
//! from it (another model, optimizer, dtype, seed or batch).

use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointError {
    /// The `train` declaration has no `checkpoint` block.
    NoBlock,
    NoCheckpoint {
        dir: PathBuf,
    },
    Io {
        path: PathBuf,
        error: String,
    },
    NotManifest {
        path: PathBuf,
        error: String,
    },
    Format {
        path: PathBuf,
        found: String,
    },
    /// The manifest's step is not the one its directory is named for.
    StepMismatch {
        path: PathBuf,
        named: usize,
        manifest: usize,
    },
    Corrupt {
        path: PathBuf,
        error: String,
    },
    Missing {
        path: PathBuf,
        tensor: String,
    },
    Unlisted {
        path: PathBuf,
        tensor: String,
    },
    Shape {
        path: PathBuf,
        tensor: String,
        file: Vec<usize>,
        manifest: Vec<usize>,
    },
    Checksum {
        path: PathBuf,
        tensor: String,
    },
    /// A field of the manifest differs from the run resuming from it.
    Differs {
        path: PathBuf,
        field: &'static str,
        saved: String,
        run: String,
        help: &'static str,
    },
    /// A parameter of the model has no tensor, or one of another shape; or the
    /// checkpoint has a parameter the model does not.
    Param {
        path: PathBuf,
        param: String,
        problem: ParamProblem,
    },
    /// A fresh run into a directory that holds another run's checkpoints.
    Foreign {
        dir: PathBuf,
        steps: Vec<usize>,
    },
    /// The checkpoint directory leads outside the run directory (a symlink).
    Escapes {
        dir: PathBuf,
    },
    Write {
        path: PathBuf,
        error: String,
    },
    /// Named like a checkpoint, but not one shardc wrote as such.
    Untrusted {
        path: PathBuf,
        why: Untrusted,
    },
    /// A checkpoint past the last step of the run resuming from it.
    BeyondRun {
        path: PathBuf,
        step: usize,
        steps: usize,
    },
    /// Every checkpoint failed verification (with `--resume-fallback`).
    NoneValid {
        dir: PathBuf,
        newest: Box<CheckpointError>,
    },
}

/// Why an entry named like a checkpoint is not trusted as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Untrusted {
    /// A symbolic link (to a directory or file that may be anywhere, or a loop).
    Link,
    /// Not a name shardc writes (`step-` and the step's digits, at least 8).
    Name,
    /// A file or other non-directory where a checkpoint directory would be.
    NotDirectory,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ParamProblem {
    Absent,
    Shape {
        saved: Vec<usize>,
        model: Vec<usize>,
    },
    NotInModel,
    /// An optimizer slot this run's optimizer keeps, missing from the checkpoint.
    SlotMissing {
        slot: &'static str,
        optimizer: String,
    },
    /// A slot this run's optimizer does not keep.
    SlotExtra {
        slot: &'static str,
        optimizer: String,
    },
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use CheckpointError::*;
        match self {
            NoBlock => write!(f, "the `train` declaration has no `checkpoint` block"),
            NoCheckpoint { dir } => write!(f, "no checkpoint in `{}`", dir.display()),
            Io { path, error } => write!(f, "cannot read `{}`: {error}", path.display()),
            NotManifest { path, error } => {
                write!(f, "`{}` is not a shardc manifest: {error}", path.display())
            }
            Format { path, found } => write!(
                f,
                "`{}` has format `{found}`, expected `{}`",
                path.display(),
                super::FORMAT
            ),
            StepMismatch { path, named, manifest } => write!(
                f,
                "`{}` is named for step {named}, but its manifest says step {manifest}",
                path.display()
            ),
            Corrupt { path, error } => write!(f, "`{}` is corrupt: {error}", path.display()),
            Missing { path, tensor } => write!(
                f,
                "`{}` lacks the tensor `{tensor}` its manifest lists",
                path.display()
            ),
            Unlisted { path, tensor } => write!(
                f,
                "`{}` holds a tensor `{tensor}` its manifest does not list",
                path.display()
            ),
            Shape { path, tensor, file, manifest } => write!(
                f,
                "tensor `{tensor}` has shape {file:?} in `{}` but {manifest:?} in the manifest",
                path.display()
            ),
            Checksum { path, tensor } => write!(
                f,
                "tensor `{tensor}` in `{}` does not match its checksum: the file was changed or damaged after it was saved",
                path.display()
            ),
            Differs { path, field, saved, run, help } => write!(
                f,
                "`{}` was saved with {field} {saved}, but this run has {field} {run} ({help})",
                path.display()
            ),
            Param { path, param, problem } => match problem {
                ParamProblem::Absent => write!(
                    f,
                    "`{}` has no tensor for parameter `{param}`",
                    path.display()
                ),
                ParamProblem::Shape { saved, model } => write!(
                    f,
                    "parameter `{param}` is {saved:?} in `{}` but {model:?} in the model",
                    path.display()
                ),
                ParamProblem::NotInModel => write!(
                    f,
                    "`{}` holds parameter `{param}`, which the model does not have",
                    path.display()
                ),
                ParamProblem::SlotMissing { slot, optimizer } => write!(
                    f,
                    "`{}` has no `{slot}` state for `{param}`, which {optimizer} keeps",
                    path.display()
                ),
                ParamProblem::SlotExtra { slot, optimizer } => write!(
                    f,
                    "`{}` has `{slot}` state for `{param}`, which {optimizer} does not keep",
                    path.display()
                ),
            },
            Foreign { dir, steps } => write!(
                f,
                "`{}` already holds checkpoints of another run (steps {}); pass `--resume` to continue it, or `--overwrite` to delete them and start afresh",
                dir.display(),
                steps
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Escapes { dir } => write!(
                f,
                "the checkpoint directory `{}` leads outside the run directory (through a symbolic link); grant it with `--allow-path DIR` if that is intended",
                dir.display()
            ),
            Write { path, error } => write!(f, "cannot write `{}`: {error}", path.display()),
            Untrusted { path, why } => {
                let what = match why {
                    self::Untrusted::Link => "is a symbolic link",
                    self::Untrusted::Name => {
                        "is not named as shardc names checkpoints (`step-` and the step as 8 or more digits)"
                    }
                    self::Untrusted::NotDirectory => "is not a directory",
                };
                write!(
                    f,
                    "`{}` {what}; shardc resumes only from checkpoints it wrote, so it cannot promise a bit-identical resume from this; move it out of the checkpoint directory (or pass `--resume-fallback` to skip it)",
                    path.display()
                )
            }
            BeyondRun { path, step, steps } => write!(
                f,
                "`{}` is at step {step}, past this run's last step {steps}; raise `steps` (or `--steps`) to continue it",
                path.display()
            ),
            NoneValid { dir, newest } => write!(
                f,
                "no checkpoint in `{}` passes verification; the newest: {newest}",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for CheckpointError {}
