//! Helpers the process-level tests share.

use std::path::{Path, PathBuf};

/// A fresh directory `shardc-{suite}-{name}-{pid}` under the system's temp dir.
#[allow(dead_code)]
pub fn temp(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Every `.shard` file under these directories of the repository, sorted.
#[allow(dead_code)]
pub fn shard_files(dirs: &[&str]) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "shard") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The losses a run wrote with `--dump-losses`.
#[allow(dead_code)]
pub fn losses(path: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(path).expect("losses written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// `shardc run MODEL --out OUT --dump-losses ARGS`: the output, and the losses
/// when it succeeded (written beside `out`).
#[allow(dead_code)]
pub fn trained(model: &Path, out: &Path, args: &[&str]) -> (std::process::Output, Vec<f64>) {
    let dump = out.with_extension("losses.json");
    let o = shardc()
        .args(["run", "--out"])
        .arg(out)
        .arg("--dump-losses")
        .arg(&dump)
        .args(args)
        .arg(model)
        .output()
        .expect("spawn");
    let l = if o.status.success() {
        losses(&dump)
    } else {
        vec![]
    };
    (o, l)
}

/// What a finished child did: exit code, stderr, stdout, peak RSS in MiB.
#[allow(dead_code)]
pub struct Ran {
    pub code: Option<i32>,
    pub err: String,
    pub out: String,
    pub peak_mib: f64,
}

/// A thread reading one of a child's pipes to its end.
#[allow(dead_code)]
type Reader = std::thread::JoinHandle<String>;

/// Starts `cmd` with stdout and stderr piped, each read to its end on a
/// thread (so that a chatty child cannot block on a full pipe).
#[allow(dead_code)]
fn piped(cmd: &mut std::process::Command) -> (std::process::Child, Reader, Reader) {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    (child, out, err)
}

/// Runs `cmd` to its end (at most 10 minutes: a hang fails, it is not timed)
/// and measures its peak resident memory. The child is reaped by `wait4`,
/// which also gives its resource usage, not by `Child::wait`.
#[allow(clippy::zombie_processes, dead_code)]
pub fn measured(cmd: &mut std::process::Command) -> Ran {
    let (mut child, out, err) = piped(cmd);
    let pid = child.id() as libc::pid_t;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: our own child's pid and pointers to live locals.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4 failed");
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child did not finish in 10 minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ran {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        err: err.join().expect("stderr"),
        out: out.join().expect("stdout"),
        peak_mib: usage.ru_maxrss as f64 / 1024.0,
    }
}

/// Runs `cmd` (stdin closed, both pipes read on threads) until it ends or
/// `limit` passes, when it is killed: its status (`None` when killed),
/// stdout and stderr.
#[allow(dead_code)]
pub fn within(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String, String) {
    let (mut child, out, err) = piped(cmd.stdin(std::process::Stdio::null()));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    (status, out, err)
}

/// `shardc` run from the repository root, with the temporary directory and
/// the repository granted (tests write models there and name fixtures
/// absolutely; the access policy itself is tested in tests/access.rs).
#[allow(dead_code)]
pub fn shardc() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c.arg("--allow-path")
        .arg(std::env::temp_dir())
        .arg("--allow-path")
        .arg(env!("CARGO_MANIFEST_DIR"));
    c
}

/// A finished command's stderr as text.
#[allow(dead_code)]
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every `tests/ui/*.shard` file, sorted (the UI tests and the fixes test).
#[allow(dead_code)]
pub fn ui_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/ui exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "shard"))
        .collect();
    v.sort();
    v
}

/// The `--mesh a=N,b=M` and `--device NAME` of a first line
/// `// shardc shard --mesh .. --device ..` (after `// shardc shard `): what
/// the UI and explanation tests hand the auto-sharder.
#[allow(dead_code)]
pub fn shard_args(line: &str) -> (Vec<(String, i64)>, String) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let mesh = value("--mesh")
        .map(|m| {
            m.split(',')
                .filter_map(|p| p.split_once('='))
                .map(|(a, n)| (a.to_string(), n.parse().unwrap_or(1)))
                .collect()
        })
        .unwrap_or_default();
    (mesh, value("--device").unwrap_or("h100-80g").to_string())
}
