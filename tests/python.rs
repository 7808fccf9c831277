//! The Python package (python/): built into a venv with maturin (`maturin
//! develop`, the dev profile, so it reuses what `cargo test` built) and its
//! pytest suite run there (python/tests/). The venv is `SHARDC_PY_PYTHON`'s
//! (`.ci/run` makes it from scripts/requirements-python.txt), else one this
//! test makes under target/ when PyPI is reachable; without either the test
//! is skipped loudly (or fails, with `SHARDC_REQUIRE_PY`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A python with maturin, pytest and numpy.
fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SHARDC_PY_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = root().join("target/py-venv");
    let py = venv.join("bin/python");
    let made = py.exists()
        || (Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new(&py)
                .args(["-m", "pip", "install", "-q", "-r"])
                .arg(root().join("scripts/requirements-python.txt"))
                .status()
                .is_ok_and(|s| s.success()));
    if made {
        return Some(py);
    }
    if std::env::var_os("SHARDC_REQUIRE_PY").is_some() {
        panic!(
            "SHARDC_REQUIRE_PY is set, but no venv with maturin, pytest and numpy could be made"
        );
    }
    eprintln!("skipped: no python venv with maturin, pytest and numpy (set SHARDC_PY_PYTHON; .ci/run does)");
    None
}

#[test]
fn the_python_package_builds_and_its_pytest_suite_passes() {
    let Some(py) = python() else { return };
    let venv = py
        .parent()
        .and_then(Path::parent)
        .expect("a venv's python is VENV/bin/python");
    let bin = venv.join("bin");
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let built = Command::new(bin.join("maturin"))
        .args(["develop", "--quiet"])
        .current_dir(root().join("python"))
        .env("VIRTUAL_ENV", venv)
        .env("PATH", &path)
        .output()
        .expect("maturin");
    assert!(
        built.status.success(),
        "maturin develop failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let tested = Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
        .current_dir(root())
        .env("SHARDC_BIN", env!("CARGO_BIN_EXE_shardc"))
        .env("PATH", &path)
        .output()
        .expect("pytest");
    let out = String::from_utf8_lossy(&tested.stdout);
    assert!(
        tested.status.success(),
        "the Python package's tests failed:\n{out}\n{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    // Every test ran: none was skipped for want of the binary or the script.
    let tail = out.lines().last().unwrap_or_default();
    assert!(!tail.contains("skipped"), "{tail}");
    eprintln!("{tail}");
}
