//! `shardc watch` end to end: spawn it, break the file, fix it, read what it says.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const GOOD: &str = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] { x @ w }\n}\n";
const BAD: &str = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 4] { x @ w }\n}\n";

/// Read lines until one contains `needle` (or give up after a generous wait).
fn wait_for(rx: &mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            let hit = line.contains(needle);
            seen.push(line);
            if hit {
                return true;
            }
        }
    }
    false
}

/// Editors save by writing a temporary file and renaming it over the original.
fn atomic_write(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).expect("write temp");
    std::fs::rename(&tmp, path).expect("rename");
}

#[test]
fn watch_reports_errors_and_recovery() {
    let dir = std::env::temp_dir().join(format!("shardc-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("model.shard");
    std::fs::write(&file, GOOD).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["watch", file.to_str().expect("utf-8 path")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn shardc watch");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let ok = wait_for(&rx, "watching", &mut seen)
        && {
            std::thread::sleep(Duration::from_millis(300));
            atomic_write(&file, BAD);
            wait_for(&rx, "E0208", &mut seen) && wait_for(&rx, "1 error", &mut seen)
        }
        && {
            atomic_write(&file, GOOD);
            wait_for(&rx, "clean again", &mut seen)
        };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "watch output was:\n{}", seen.join("\n"));
    assert!(
        seen.iter()
            .any(|l| l.contains("contraction dimensions do not match")),
        "{}",
        seen.join("\n")
    );
}
