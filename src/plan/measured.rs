//! Pass times measured by a run, for the plan's pipeline timing.
//!
//! Why: the plan times a pipeline's passes by their FLOPs, and on a real
//! machine a pass's time is not its FLOPs — attention and the derivatives of
//! norms and elementwise ops cost far more than their FLOPs say, and they all
//! fall in the input-gradient half of a split backward, so the zero-bubble
//! schedules idle well above what FLOPs predict. `shardc run --profile`
//! writes each program node's measured time (its forward, and its
//! derivatives toward data and toward weights) to `profile.json` in the run
//! directory; `shardc plan --profile FILE` times every schedule's passes with
//! them instead (as XLA's profile-guided latency estimator feeds measured op
//! times back into its scheduler). A profile taken under one schedule times
//! the others: the nodes are the same, only their order on the ranks
//! changes. It is refused for any other program (a different file, mesh,
//! batch or microbatch count), which its fingerprint identifies.

use super::pipeline::{idle, PassCost, Pieces};
use super::Plan;
use crate::spmd::Program;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};

/// The `format` field of a profile file.
pub const FORMAT: &str = "shardc-profile/1";

/// What `shardc run --profile` writes: per program node, milliseconds per
/// step.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    pub format: String,
    pub model: String,
    /// [`fingerprint`] of the program the times belong to.
    pub program: String,
    /// Steps timed (the first is left out when there are more).
    pub steps: usize,
    /// Per node: its forward, and its derivatives toward data (the input
    /// half of a split backward) and toward weights (the weight half); a
    /// derivative toward both is split in proportion to its operands.
    pub nodes: Vec<[f64; 3]>,
}

/// Why a profile cannot time a plan.
#[derive(Debug)]
pub enum ProfileError {
    Read(PathBuf, std::io::Error),
    Parse(PathBuf, serde_json::Error),
    Format(PathBuf, String),
    /// Taken of another program (file, mesh, batch or microbatches).
    Program {
        path: PathBuf,
        model: String,
    },
    /// No model of the file is the profile's.
    Model {
        path: PathBuf,
        model: String,
    },
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileError::Read(p, e) => write!(f, "cannot read `{}`: {e}", p.display()),
            ProfileError::Parse(p, e) => write!(
                f,
                "`{}` is not a profile `shardc run --profile` wrote: {e}",
                p.display()
            ),
            ProfileError::Format(p, got) => write!(
                f,
                "`{}` is a profile in format `{got}`; this shardc reads `{FORMAT}` (run again with --profile)",
                p.display()
            ),
            ProfileError::Program { path, model } => write!(
                f,
                "`{}` times another program than `{model}`'s here (the file, the mesh, the batch or the microbatches changed since it was taken); run it again with --profile",
                path.display()
            ),
            ProfileError::Model { path, model } => write!(
                f,
                "`{}` times model `{model}`, which this file does not train",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ProfileError {}

/// A digest of what a program computes: the mesh, the bound sizes and the
/// microbatches, and each node's op, type and operands (not the pipeline's
/// schedule: a profile times every schedule of the same program).
pub fn fingerprint(prog: &Program) -> String {
    let mut h = Sha256::new();
    let microbatches = prog.pipeline.as_ref().map(|p| (p.stages, p.microbatches));
    h.update(
        format!(
            "{:?}|{:?}|{:?}|{microbatches:?}\n",
            prog.mesh, prog.bound, prog.batch
        )
        .as_bytes(),
    );
    for n in &prog.nodes {
        h.update(format!("{:?}|{}|{:?}\n", n.op, n.ty, n.args).as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a profile file.
pub fn load(path: &Path) -> Result<Profile, ProfileError> {
    // A profile holds three numbers per node: 256 MiB is far beyond any.
    let bytes = crate::files::read_regular(path, 256 << 20)
        .map_err(|e| ProfileError::Read(path.into(), e))?;
    let p: Profile =
        serde_json::from_slice(&bytes).map_err(|e| ProfileError::Parse(path.into(), e))?;
    if p.format != FORMAT {
        return Err(ProfileError::Format(path.into(), p.format));
    }
    Ok(p)
}

/// Times `plan`'s pipeline (of `prog`, run with `schedule` when given, else
/// its own) with `profile`'s node times: each rank's idle share and the
/// bubble. A plan without a pipeline is left as it is.
pub fn retime(
    plan: &mut Plan,
    (prog, schedule): (&Program, Option<&crate::schedule::Source>),
    profile: &Profile,
    path: &Path,
) -> Result<(), ProfileError> {
    if profile.program != fingerprint(prog) || profile.nodes.len() != prog.nodes.len() {
        return Err(ProfileError::Program {
            path: path.into(),
            model: prog.model.clone(),
        });
    }
    let (Some(own), Some(pl)) = (&prog.pipeline, plan.pipeline.as_mut()) else {
        return Ok(());
    };
    let mut pp = own.clone();
    if let Some(s) = schedule {
        pp.schedule = s.clone();
    }
    let cost = PassCost::measured(&profile.nodes, &Pieces::of(&pp));
    if let Some(idle) = idle(&pp, &cost) {
        pl.bubble = idle.iter().sum::<f64>() / idle.len().max(1) as f64;
        pl.idle = idle;
        pl.timed_by = Some(path.display().to_string());
    }
    Ok(())
}
