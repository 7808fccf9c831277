//! The scripted editor session of scripts/lsp_session.py, driven by the real
//! LSP client library pygls, against this build's `shardc lsp`: it opens
//! models/gptj.shard, breaks and fixes it, hovers, jumps to a stdlib
//! definition and formats, and fails (non-zero exit) at the first answer an
//! editor would not expect; so does this test.
//!
//! It needs a Python with pygls (`pip install -r scripts/requirements-lsp.txt`):
//! the one `SHARDC_PYGLS_PYTHON` names, else `python3` when it can import
//! pygls. Without one the test says it was skipped and why, or fails when
//! `SHARDC_REQUIRE_PYGLS` is set (as tests/mpi.rs does for Open MPI).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

/// The whole session's time limit (each answer in it has its own, shorter one).
const LIMIT: Duration = Duration::from_secs(300);

fn unavailable(why: &str) {
    if std::env::var_os("SHARDC_REQUIRE_PYGLS").is_some() {
        panic!("SHARDC_REQUIRE_PYGLS is set, but {why}");
    }
    eprintln!("skipped: the pygls session needs a Python with pygls ({why})");
}

/// The Python to run the session with, or why there is none.
fn python() -> Result<String, String> {
    let (python, named) = match std::env::var("SHARDC_PYGLS_PYTHON") {
        // A relative path (`target/lsp-venv/bin/python`) is the repository's.
        Ok(p) if p.contains('/') && !Path::new(&p).is_absolute() => (
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(p)
                .display()
                .to_string(),
            true,
        ),
        Ok(p) if !p.is_empty() => (p, true),
        _ => ("python3".to_string(), false),
    };
    let probe = Command::new(&python)
        .args(["-c", "import pygls, lsprotocol"])
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(o) if o.status.success() => Ok(python),
        Ok(o) if named => Err(format!(
            "SHARDC_PYGLS_PYTHON={python} cannot import pygls: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => Err(
            "`python3` cannot import pygls; set SHARDC_PYGLS_PYTHON to a Python that can \
             (pip install -r scripts/requirements-lsp.txt)"
                .into(),
        ),
        Err(e) => Err(format!("cannot run `{python}`: {e}")),
    }
}

#[test]
fn the_pygls_session_passes() {
    let python = match python() {
        Ok(p) => p,
        Err(why) => return unavailable(&why),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (status, out, err) = common::within(
        Command::new(&python)
            .arg(root.join("scripts/lsp_session.py"))
            .arg(env!("CARGO_BIN_EXE_shardc"))
            .current_dir(root),
        LIMIT,
    );
    println!("{out}");
    let Some(status) = status else {
        panic!("the pygls session took more than {LIMIT:?}\n{out}\n{err}");
    };
    assert!(
        status.success(),
        "the pygls session failed ({status}):\n{out}\n{err}"
    );
    for step in [
        "ok  open models/gptj.shard",
        "ok  break it",
        "ok  fix it",
        "ok  hover a let",
        "ok  jump to a stdlib definition",
        "ok  format",
        "ok  shut down",
    ] {
        assert!(out.contains(step), "no `{step}` in:\n{out}\n{err}");
    }
}
