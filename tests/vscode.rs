//! The VS Code extension end to end, without VS Code: `npm ci` installs the
//! committed `editors/vscode/package-lock.json`, then `test/run.js` runs the
//! real `extension.js` (and the bundle `npm run build` makes of it, the
//! packaged entry point) with the real vscode-languageclient under node, a
//! small stand-in for the `vscode` module, and the `shardc` built here. The
//! client must reach the running state with the server's capabilities (the
//! client appends `--stdio` and `--clientProcessId`, the settings add the
//! documented `--strict`) and receive the model's diagnostics. `vsce package`
//! must pack it without a warning.
//!
//! Without node and npm, or when `npm ci` cannot reach the registry, the
//! tests say so loudly and pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};

/// `vsce package` rebuilds `dist/extension.js`, which the bundle's test loads.
static DIST: Mutex<()> = Mutex::new(());

fn ext_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("editors/vscode")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn npm(args: &[&str]) -> std::io::Result<Output> {
    Command::new("npm")
        .args(args)
        .current_dir(ext_dir())
        .stdin(Stdio::null())
        .output()
}

/// A hash of the lockfile, to run `npm ci` again only when it changed.
fn lock_stamp() -> String {
    use std::hash::{Hash, Hasher};
    let lock = std::fs::read(ext_dir().join("package-lock.json")).expect("package-lock.json");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lock.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// `npm ci` (once per lockfile) and `npm run build`; `None`, after saying why,
/// when node or the registry is not there.
fn installed() -> Option<()> {
    static DONE: OnceLock<Option<()>> = OnceLock::new();
    *DONE.get_or_init(|| {
        let node = Command::new("node").arg("--version").output();
        let npm_version = npm(&["--version"]);
        if !node.is_ok_and(|o| o.status.success()) || !npm_version.is_ok_and(|o| o.status.success())
        {
            eprintln!(
                "\n*** SKIPPED: node or npm is not installed: the VS Code extension was not run ***\n"
            );
            return None;
        }
        let stamp_file = ext_dir().join("node_modules/.shardc-npm-ci");
        let stamp = lock_stamp();
        if std::fs::read_to_string(&stamp_file).ok().as_deref() != Some(stamp.as_str()) {
            let out = npm(&["ci", "--no-audit", "--no-fund"]).expect("npm runs");
            if !out.status.success() {
                eprintln!(
                    "\n*** SKIPPED: `npm ci` in editors/vscode failed (no registry?): the VS Code extension was not run ***\n{}\n",
                    text(&out)
                );
                return None;
            }
            let _ = std::fs::write(&stamp_file, stamp);
        }
        let out = npm(&["run", "build"]).expect("npm runs");
        assert!(out.status.success(), "npm run build:\n{}", text(&out));
        Some(())
    })
}

fn run_extension(main: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("node")
        .arg(ext_dir().join("test/run.js"))
        .arg(env!("CARGO_BIN_EXE_shardc"))
        .arg(ext_dir().join(main))
        .arg(root.join("examples/broken_mlp.shard"))
        .stdin(Stdio::null())
        .output()
        .expect("node runs");
    let all = text(&out);
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("{main}: not one JSON line ({e}):\n{all}"));
    assert!(out.status.success(), "{main}:\n{all}");
    assert_eq!(v["state"], "Running", "{main}: {v:#}");
    let caps = &v["capabilities"];
    assert_eq!(caps["hoverProvider"], true, "{main}: {v:#}");
    assert_eq!(caps["documentFormattingProvider"], true, "{main}: {v:#}");
    assert!(!caps["textDocumentSync"].is_null(), "{main}: {v:#}");
    assert_eq!(v["serverInfo"]["name"], "shardc", "{main}: {v:#}");
    // The model's two errors reached the client's diagnostics collection.
    let diags = v["diagnostics"].as_array().cloned().unwrap_or_default();
    assert_eq!(diags.len(), 2, "{main}: {v:#}");
    assert!(
        diags
            .iter()
            .all(|d| d["code"] == "E0203" && d["severity"] == 0),
        "{main}: {v:#}"
    );
    assert_eq!(v["shown"], serde_json::json!([]), "{main}: {v:#}");
    assert_eq!(v["stopped"], "Stopped", "{main}: {v:#}");
}

#[test]
fn the_extension_starts_the_server_and_shows_its_diagnostics() {
    if installed().is_none() {
        return;
    }
    run_extension("extension.js");
}

#[test]
fn the_packaged_bundle_starts_the_server_too() {
    if installed().is_none() {
        return;
    }
    let _dist = DIST.lock().unwrap_or_else(|e| e.into_inner());
    run_extension("dist/extension.js");
}

#[test]
fn vsce_packs_the_extension_without_a_warning() {
    if installed().is_none() {
        return;
    }
    let _dist = DIST.lock().unwrap_or_else(|e| e.into_inner());
    let vsix = std::env::temp_dir().join(format!("shard-{}.vsix", std::process::id()));
    let vsce = ext_dir().join("node_modules/.bin/vsce");
    let out = Command::new(&vsce)
        .args(["package", "--out"])
        .arg(&vsix)
        .current_dir(ext_dir())
        .stdin(Stdio::null())
        .output()
        .expect("vsce runs");
    let all = text(&out);
    let _ = std::fs::remove_file(&vsix);
    assert!(out.status.success(), "vsce package:\n{all}");
    assert!(!all.contains("WARNING"), "vsce package warns:\n{all}");
    for f in [
        "LICENSE",
        "dist/extension.js",
        "syntaxes/shard.tmLanguage.json",
    ] {
        assert!(
            all.contains(f.rsplit('/').next().unwrap_or(f)),
            "{f} not packed:\n{all}"
        );
    }
    assert!(!all.contains("node_modules"), "node_modules packed:\n{all}");
}
