//! A verified checkpoint against the run resuming from it: the same model and
//! parameter set with the same shapes, the optimizer slots this run's optimizers
//! keep, and the same optimizer (up to Adam ↔ AdamW), dtype, seed and data
//! position. Anything else
//! would resume silently into a different trajectory.

use super::{Arrays, CheckpointError, Manifest, ParamProblem};
use crate::runtime::config::Config;
use crate::spmd::Program;
use std::path::Path;

fn dtype_name(cfg: &Config) -> &'static str {
    if cfg.dtype == candle_core::DType::F64 {
        "f64"
    } else {
        "f32"
    }
}

pub(super) fn fits(
    path: &Path,
    m: &Manifest,
    arrays: &Arrays,
    prog: &Program,
    cfg: &Config,
) -> Result<(), CheckpointError> {
    let differs = |field, saved: String, run: String, help| CheckpointError::Differs {
        path: path.to_path_buf(),
        field,
        saved,
        run,
        help,
    };
    if m.model != prog.model {
        return Err(differs(
            "model",
            format!("`{}`", m.model),
            format!("`{}`", prog.model),
            "a checkpoint resumes the model that wrote it",
        ));
    }
    // Adam and AdamW keep the same moments (a live reload may switch between
    // them); any other change reads state as something it is not.
    let family = |n: &str| if n == "adamw" { "adam" } else { n }.to_string();
    if family(&m.optimizer) != family(cfg.optimizer.name()) {
        return Err(differs(
            "optimizer",
            format!("`{}`", m.optimizer),
            format!("`{}`", cfg.optimizer.name()),
            "its state would be reset or misread; start a fresh run to change optimizers",
        ));
    }
    if m.dtype != dtype_name(cfg) {
        return Err(differs(
            "dtype",
            m.dtype.clone(),
            dtype_name(cfg).to_string(),
            "resume with the same `--f64` setting",
        ));
    }
    if m.seed != cfg.seed {
        return Err(differs(
            "seed",
            m.seed.to_string(),
            cfg.seed.to_string(),
            "data order and dropout follow the seed; drop `--seed` to continue this run",
        ));
    }
    let expected = m.step.saturating_mul(cfg.batch);
    if m.data_position != expected {
        return Err(differs(
            "data position",
            m.data_position.to_string(),
            format!("{expected} (step {} × batch {})", m.step, cfg.batch),
            "the batch size changed, or the manifest was edited",
        ));
    }
    let param = |name: &str, problem| CheckpointError::Param {
        path: path.to_path_buf(),
        param: name.to_string(),
        problem,
    };
    // Each parameter's slots, as the run's step steps it.
    let step = crate::runtime::train::step_of(prog, cfg);
    for (p, st) in prog.params.iter().zip(&step.params) {
        let shape = p.stored.known_shape();
        let slots = crate::optim::rule(&st.optimizer).slots();
        let (has_m, has_v) = (slots.m, slots.v.is_some());
        for (slot, wanted) in [("param", true), ("opt_m", has_m), ("opt_v", has_v)] {
            let key = format!("{slot}/{}", p.name);
            match (arrays.iter().find(|a| a.0 == key), wanted) {
                (Some((_, s, _)), true) if *s != shape => {
                    return Err(param(
                        &p.name,
                        ParamProblem::Shape {
                            saved: s.clone(),
                            model: shape,
                        },
                    ))
                }
                (Some(_), true) | (None, false) => {}
                (None, true) if slot == "param" => {
                    return Err(param(&p.name, ParamProblem::Absent))
                }
                (None, true) => {
                    return Err(param(
                        &p.name,
                        ParamProblem::SlotMissing {
                            slot: if slot == "opt_m" { "m" } else { "v" },
                            optimizer: st.optimizer.describe(),
                        },
                    ))
                }
                (Some(_), false) => {
                    return Err(param(
                        &p.name,
                        ParamProblem::SlotExtra {
                            slot: if slot == "opt_m" { "m" } else { "v" },
                            optimizer: st.optimizer.describe(),
                        },
                    ))
                }
            }
        }
    }
    for (n, _, _) in arrays {
        let name = n.split_once('/').map_or(n.as_str(), |(_, rest)| rest);
        if !prog.params.iter().any(|p| p.name == name) {
            return Err(param(name, ParamProblem::NotInModel));
        }
    }
    Ok(())
}

/// Take a verified checkpoint's state into the run's configuration.
pub(super) fn apply(m: &Manifest, arrays: Arrays, cfg: &mut Config) {
    for (n, _, v) in arrays {
        if let Some(name) = n.strip_prefix("param/") {
            cfg.init.insert(name.to_string(), v);
        } else if n.starts_with("opt_") {
            cfg.init_opt.insert(n, v);
        }
    }
    cfg.start_step = m.step;
    cfg.run = m.run.clone();
}
