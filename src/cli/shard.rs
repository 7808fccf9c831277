//! `shardc shard`: the auto-sharder's command line. The annotated file goes
//! to `--out` (or stdout), `--explain` prints the search on stderr; a file
//! that does not check, or a model no layout fits, exits 1 with its
//! diagnostics; a request that cannot be served exits 2.

use crate::autoshard::{self, Failure, Request};
use crate::diag::render::{self, Style};
use crate::files::Disk;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ShardArgs {
    pub file: PathBuf,
    /// Axis sizes replacing the file's, e.g. `--mesh dp=4,tp=2` (written
    /// into the mesh declaration of the result).
    #[arg(long, value_parser = super::parse_mesh)]
    pub mesh: Option<super::MeshArg>,
    /// Instead of `--mesh`: this many devices, every way of sizing the
    /// mesh's axes to that product tried.
    #[arg(long, conflicts_with = "mesh")]
    pub devices: Option<u64>,
    /// The device each layout is planned on (h100-80g, a100-80g, a100-40g,
    /// tpu-v5p, tpu-v5e): its memory bounds the peak, its throughput and
    /// link time the step.
    #[arg(long, value_parser = crate::plan::device::parse, default_value = "h100-80g")]
    pub device: crate::plan::device::Device,
    /// Which model, when the file has several `train` declarations.
    #[arg(long)]
    pub model: Option<String>,
    /// Write the result here instead of stdout (`-`: stdout).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Let the search set `precision: bf16` (changes the numerics).
    #[arg(long)]
    pub allow_bf16: bool,
    /// Let the search cut each `repeat` into pipeline stages over a mesh axis
    /// (1F1B, interleaved, ZB-H1 or ZBV; microbatch counts from the batch
    /// and the mesh).
    #[arg(long)]
    pub pipeline: bool,
    /// Enumerate every layout, however many (slow on large models).
    #[arg(long)]
    pub exhaustive: bool,
    /// Print the search on stderr: decisions, candidates, what was pruned, time.
    #[arg(long)]
    pub explain: bool,
}

pub fn shard(grants: &[PathBuf], a: &ShardArgs) -> ExitCode {
    let req = Request {
        files: &Disk,
        path: &a.file,
        model: a.model.clone(),
        mesh: a.mesh.as_ref().map(|m| m.0.clone()).unwrap_or_default(),
        devices: a.devices,
        device: a.device.clone(),
        allow_bf16: a.allow_bf16,
        pipeline: a.pipeline,
        exact: if a.exhaustive {
            u64::MAX
        } else {
            autoshard::EXACT
        },
        grants: grants.to_vec(),
    };
    let style = if std::io::stderr().is_terminal() {
        Style::Color
    } else {
        Style::Plain
    };
    let started = std::time::Instant::now();
    let solved = autoshard::solve(&req);
    let took = started.elapsed().as_secs_f64();
    match solved {
        Ok(s) => {
            if a.explain {
                explain(&s.explain, took);
            }
            let written = match a.out.as_ref().filter(|o| o.as_os_str() != "-") {
                Some(o) => std::fs::write(o, &s.text).map_err(|e| (o.clone(), e)),
                None => {
                    let _ = std::io::stdout().lock().write_all(s.text.as_bytes());
                    Ok(())
                }
            };
            if let Err((o, e)) = written {
                eprintln!("error: cannot write `{}`: {e}", o.display());
                return ExitCode::from(2);
            }
            let mesh: Vec<String> = s.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
            eprintln!(
                "laid out on {} ({}): step ≈ {}, peak {} per device",
                mesh.join(","),
                a.device.name,
                autoshard::reasons::seconds(s.planned.step),
                crate::units::human_bytes(s.planned.peak)
            );
            ExitCode::SUCCESS
        }
        Err(Failure::Input(c)) | Err(Failure::Unsound(c)) => {
            for d in c.diagnostics.iter().filter(|d| d.is_error()) {
                eprint!("{}", render::human(d, &c.sources, style));
            }
            eprintln!("{}", c.summary(&a.file.display().to_string()));
            ExitCode::from(1)
        }
        Err(Failure::NoFit {
            diagnostic,
            compilation,
            explain: e,
        }) => {
            if a.explain {
                explain(&e, took);
            }
            eprint!(
                "{}",
                render::human(&diagnostic, &compilation.sources, style)
            );
            ExitCode::from(1)
        }
        Err(Failure::Usage(u)) => {
            eprintln!("error: {u}");
            ExitCode::from(2)
        }
    }
}

fn explain(e: &autoshard::Explain, took: f64) {
    for m in &e.meshes {
        let mesh: Vec<String> = m.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
        let how = if m.exhaustive {
            format!("every one of the {} candidates", m.space)
        } else {
            format!(
                "{} moves swept ({} single choices refused by the checker alone) of a space of {}",
                m.moves, m.refused, m.space
            )
        };
        let best = m.best.as_ref().map_or("nothing planned".to_string(), |p| {
            format!(
                "best step ≈ {}, peak {}{}",
                autoshard::reasons::seconds(p.step),
                crate::units::human_bytes(p.peak),
                if p.fits { "" } else { " (does not fit)" }
            )
        });
        eprintln!(
            "mesh {}: {} decisions, {how}; {} candidates compiled and planned in {:.2} s; {best}",
            mesh.join(","),
            m.decisions,
            m.compiled,
            m.seconds
        );
    }
    eprintln!("search: {took:.2} s in all");
}
