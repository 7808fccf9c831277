//! The adversarial campaign's findings, kept as tests: huge inputs are refused
//! or streamed under a memory bound (never an abort), checkpoint directories are
//! trusted only as shardc wrote them, an unreadable FDO statistics file is
//! skipped, a run directory serves one run at a time, and the editor refuses to
//! analyse an enormous buffer. Memory is the child's peak resident set, from
//! `wait4`; nothing here is timed (long work is only guarded against hangs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::measured;
#[path = "common/lsp.rs"]
mod lsp;

const CLS: &str = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\n";

fn shardc() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardc"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c.arg("--allow-path").arg(std::env::temp_dir());
    c
}

fn temp(name: &str) -> PathBuf {
    common::temp("untrusted", name)
}

/// A file of `len` bytes that takes no disk (a hole).
fn sparse(path: &Path, len: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(len).expect("set_len");
}

const LM: &str = "import nn\nmesh host(data: 2)\nmodel Lm {\n  embed = Embed(10, 8)\n  head = Linear(8 -> 10)\n  fn forward(ids: i32[B@data, 5]) -> f32[B@data, 5, 10] { head(embed(ids)) }\n}\n";

fn lm_on(text: &Path) -> String {
    format!("{LM}train Lm on host {{\n  data: text(path: \"{}\", seq: 5, vocab: 10)\n  batch: 4, steps: 3, loss: softmax_cross_entropy, optimizer: sgd(lr: 0.1)\n}}\n", text.display())
}

/// Finding: `text(...)` on a 1 GB file aborted (exit 134) and a 40 GB sparse
/// file tried to allocate 40 GB. Now: a sparse (NUL) file is refused at its
/// first megabyte, one over 2 GiB before it is read, and one enormous line of
/// letters is streamed in bounded memory; so is a root source file over 16 MiB.
#[test]
fn huge_text_and_source_files_are_refused_or_streamed_in_bounded_memory() {
    let dir = temp("huge");
    let cases: [(&str, u64, &str); 2] = [
        ("gb.txt", 1_000_000_000, "not text: a NUL byte at byte 0"),
        (
            "forty.txt",
            40 << 30,
            "more than the 2 GiB `text(...)` reads",
        ),
    ];
    for (name, len, says) in cases {
        let text = dir.join(name);
        sparse(&text, len);
        let model = dir.join(format!("{name}.shard"));
        std::fs::write(&model, lm_on(&text)).expect("write");
        let r = measured(shardc().args(["check", "--format", "short"]).arg(&model));
        assert_eq!(r.code, Some(1), "{name}: {}", r.err);
        assert!(
            r.out.contains("E0304") && r.out.contains(says),
            "{name}: {}",
            r.out
        );
        assert!(r.peak_mib < 100.0, "{name}: {:.0} MiB", r.peak_mib);
        std::fs::remove_file(&text).expect("rm");
    }
    // 16 MB of letters on one line: one word, too long to be anything but unknown.
    let line = dir.join("line.txt");
    std::fs::write(&line, "abcdefghij".repeat(1_600_000)).expect("write");
    let model = dir.join("line.shard");
    std::fs::write(&model, lm_on(&line)).expect("write");
    let r = measured(shardc().args(["check", "--format", "short"]).arg(&model));
    assert_eq!(r.code, Some(1), "{}", r.err);
    assert!(r.out.contains("holds 1 words"), "{}", r.out);
    assert!(r.peak_mib < 100.0, "one line: {:.0} MiB", r.peak_mib);
    // A model file of 1 GB (sparse) is refused before it is read.
    let big = dir.join("big.shard");
    sparse(&big, 1 << 30);
    let r = measured(shardc().arg("check").arg(&big));
    assert_eq!(r.code, Some(2), "{}", r.err);
    assert!(r.err.contains("16777216-byte limit"), "{}", r.err);
    assert!(r.peak_mib < 100.0, "source: {:.0} MiB", r.peak_mib);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose mesh axis is `name`, used through `depth` chained layers.
fn deep_model(name: &str, depth: usize) -> String {
    let layers: String = (0..depth)
        .map(|i| format!("  l{i} = Dense(16 -> 16)\n"))
        .collect();
    let body = (0..depth).fold("x".to_string(), |e, i| format!("l{i}({e})"));
    format!("import nn\nmesh host({name}: 8)\nmodel M {{\n{layers}  fn forward(x: f32[B@{name}, 16]) -> f32[B@{name}, 16] {{ {body} }}\n}}\ntrain M on host {{ data: synthetic(classes: 16), batch: 8, steps: 2, optimizer: sgd(lr: 0.1) }}\n")
}

/// Finding: a mesh axis named with a 2,000,000-character identifier took 14.8 s
/// and 6.6 GB in `check` (every type holding the axis held a copy: 32 layers
/// took 637 MB). Names are at most 1,024 characters (E0005, found before
/// parsing); the longest allowed, used through 32 layers, stays small too.
#[test]
fn a_two_megabyte_identifier_is_refused_in_bounded_memory() {
    let dir = temp("ident");
    let model = dir.join("ident.shard");
    std::fs::write(&model, deep_model(&"q".repeat(2_000_000), 32)).expect("write");
    let r = measured(shardc().args(["check", "--format", "short"]).arg(&model));
    assert_eq!(r.code, Some(1), "{}", r.err);
    assert!(
        r.out.contains("E0005") && r.out.contains("a name of 2000000 characters"),
        "{}",
        &r.out[..r.out.len().min(300)]
    );
    assert!(r.peak_mib < 100.0, "{:.0} MiB", r.peak_mib);
    std::fs::write(&model, deep_model(&"q".repeat(1_024), 32)).expect("write");
    let r = measured(shardc().arg("check").arg(&model));
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(r.peak_mib < 100.0, "{:.0} MiB", r.peak_mib);
    let _ = std::fs::remove_dir_all(&dir);
}

fn ckpt_model(dir: &Path, ckpt: &Path) -> PathBuf {
    let f = dir.join(format!(
        "{}.shard",
        ckpt.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::write(&f, format!("{CLS}train C on m {{ data: synthetic(classes: 3), batch: 8, steps: 40, seed: 5, optimizer: adam(lr: 0.01), checkpoint: {{ every: 10, keep: 2, dir: \"{}\" }} }}\n", ckpt.display())).expect("write");
    f
}

/// Every entry under `dir`, links not followed: a link's target, a file's bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)
            .expect("read_dir")
            .filter_map(|e| e.ok())
        {
            let p = e.path();
            let t = e.file_type().expect("type");
            if t.is_symlink() {
                let to = std::fs::read_link(&p).expect("link");
                out.insert(p, to.to_string_lossy().as_bytes().to_vec());
            } else if t.is_dir() {
                out.insert(p.clone(), b"dir".to_vec());
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).expect("read"));
            }
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from)
        .expect("read_dir")
        .filter_map(|e| e.ok())
    {
        std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}

/// Finding: `--resume` accepted `step-+0000012`, a step of 2^64 − 1, and step
/// directories that were symlinks (a loop; one leading outside). Each trick is
/// now refused with its reason and every file left as it was; the real
/// checkpoint still resumes bit-identically.
#[test]
fn checkpoint_directory_tricks_are_refused_with_files_unchanged() {
    use std::os::unix::fs::symlink;
    let dir = temp("ckpt");
    let run = |model: &Path, extra: &[&str], out: &str| {
        measured(
            shardc()
                .args(["run", "--quiet"])
                .args(extra)
                .arg("--out")
                .arg(dir.join(out))
                .arg(model),
        )
    };
    let straight = ckpt_model(&dir, &dir.join("ck-a"));
    let a = dir.join("a.json");
    let r = run(&straight, &["--dump-losses", &a.to_string_lossy()], "run-a");
    assert_eq!(r.code, Some(0), "{}", r.err);
    let ck = dir.join("ck-b");
    let model = ckpt_model(&dir, &ck);
    let r = run(&model, &["--steps", "20"], "run-b");
    assert_eq!(r.code, Some(0), "{}", r.err);
    let good = ck.join("step-00000020");
    let outside = dir.join("outside");
    copy_dir(&good, &outside);
    let manifest = std::fs::read_to_string(good.join("manifest.json")).expect("manifest");
    assert!(manifest.contains("\"step\": 20,"), "{manifest}");
    let max_step = ck.join(format!("step-{}", usize::MAX));
    type Trick = (&'static str, Box<dyn Fn()>, PathBuf, &'static str);
    let tricks: Vec<Trick> = vec![
        (
            "a sign in the name",
            Box::new({
                let (g, p) = (good.clone(), ck.join("step-+0000030"));
                move || copy_dir(&g, &p)
            }),
            ck.join("step-+0000030"),
            "is not named as shardc names checkpoints",
        ),
        (
            "an extra leading zero",
            Box::new({
                let (g, p) = (good.clone(), ck.join("step-000000030"));
                move || copy_dir(&g, &p)
            }),
            ck.join("step-000000030"),
            "is not named as shardc names checkpoints",
        ),
        (
            "step 2^64 - 1",
            Box::new({
                let (g, p, m) = (good.clone(), max_step.clone(), manifest.clone());
                move || {
                    copy_dir(&g, &p);
                    let big = m.replace("\"step\": 20,", &format!("\"step\": {},", usize::MAX));
                    std::fs::write(p.join("manifest.json"), big).expect("write");
                }
            }),
            max_step.clone(),
            "past this run's last step 40",
        ),
        (
            "a symlink loop",
            Box::new({
                let p = ck.join("step-00000030");
                move || symlink("step-00000030", &p).expect("symlink")
            }),
            ck.join("step-00000030"),
            "is a symbolic link",
        ),
        (
            "a symlink leading outside",
            Box::new({
                let (o, p) = (outside.clone(), ck.join("step-00000030"));
                move || symlink(&o, &p).expect("symlink")
            }),
            ck.join("step-00000030"),
            "is a symbolic link",
        ),
        (
            "a file where a directory should be",
            Box::new({
                let p = ck.join("step-00000030");
                move || std::fs::write(&p, b"x").expect("write")
            }),
            ck.join("step-00000030"),
            "is not a directory",
        ),
        (
            "a checkpoint whose files are links",
            Box::new({
                let (g, p) = (good.clone(), ck.join("step-00000030"));
                move || {
                    std::fs::create_dir(&p).expect("mkdir");
                    for f in ["manifest.json", "tensors.safetensors"] {
                        symlink(g.join(f), p.join(f)).expect("symlink");
                    }
                }
            }),
            ck.join("step-00000030"),
            "is a symbolic link",
        ),
    ];
    for (what, make, path, says) in &tricks {
        make();
        let before = snapshot(&dir);
        let r = run(&model, &["--resume"], "run-b");
        assert_eq!(r.code, Some(2), "{what}: {}", r.err);
        assert!(r.err.contains(says), "{what}: {}", r.err);
        assert!(before == snapshot(&dir), "{what}: files changed");
        if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(path).expect("rm");
        } else {
            std::fs::remove_file(path).expect("rm");
        }
    }
    // `--resume-fallback` skips a trick with a warning instead.
    symlink(&outside, ck.join("step-00000030")).expect("symlink");
    let b = dir.join("b.json");
    let r = run(
        &model,
        &[
            "--resume",
            "--resume-fallback",
            "--dump-losses",
            &b.to_string_lossy(),
        ],
        "run-b",
    );
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(
        r.err.contains("warning: skipped") && r.err.contains("is a symbolic link"),
        "{}",
        r.err
    );
    let all = common::losses(&a);
    let rest = common::losses(&b);
    assert_eq!(rest.len(), 20);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&rest), bits(&all[20..]), "resumed bit for bit");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `.npz` of one stored entry whose method is patched to deflate: bytes
/// that claim compression but do not inflate.
fn compressed_npz() -> Vec<u8> {
    use std::io::Write;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.start_file("s_max_ids.npy", opts).expect("entry");
    w.write_all(b"\x93NUMPY\x01\x00").expect("write");
    let mut bytes = w.finish().expect("zip").into_inner();
    for (sig, at) in [(b"PK\x03\x04", 8), (b"PK\x01\x02", 10)] {
        let i = bytes.windows(4).position(|w| w == sig).expect("header");
        bytes[i + at..i + at + 2].copy_from_slice(&8u16.to_le_bytes());
    }
    bytes
}

/// Finding: one bad file in the FDO directory (which other processes write
/// into) stopped training with exit 1. Each is now skipped with a warning
/// naming it, training completes, and `fdo show` counts them.
#[test]
fn unreadable_fdo_files_are_skipped_and_training_completes() {
    use std::os::unix::ffi::OsStrExt;
    let dir = temp("fdo");
    let fdo = dir.join("run").join("fdo");
    std::fs::create_dir_all(&fdo).expect("mkdir");
    let name = |p: u32| fdo.join(format!("fdo_stats_{p}_1.npz"));
    std::fs::write(name(1), b"garbage").expect("write");
    std::fs::write(name(2), compressed_npz()).expect("write");
    std::fs::write(name(3), b"").expect("write");
    let fifo = std::ffi::CString::new(name(4).as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(name(5)).expect("mkdir");
    std::fs::write(dir.join("elsewhere.npz"), b"not here").expect("write");
    std::os::unix::fs::symlink(dir.join("elsewhere.npz"), name(6)).expect("symlink");
    let r = measured(
        shardc()
            .args(["run", "models/shakespeare.shard", "--steps", "16", "--out"])
            .arg(dir.join("run")),
    );
    assert_eq!(r.code, Some(0), "{}", r.err);
    let said = format!("{}{}", r.out, r.err);
    for p in 1..=6 {
        let n = format!("fdo_stats_{p}_1.npz`");
        assert!(
            said.lines()
                .any(|l| l.contains(&n) && l.contains("skipped, and the limits stay")),
            "file {p}: {said}"
        );
    }
    assert!(said.contains("is a symbolic link, not read"), "{said}");
    assert!(said.contains("done: 16 steps"), "{said}");
    let r = measured(shardc().args(["fdo", "show"]).arg(&fdo));
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(
        r.out.contains("skipped 6 file(s) that could not be used"),
        "{}",
        r.out
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding: a second `shardc run` into the same `--out` started and trampled
/// the first's files. It is refused at start, naming the holder, and the first
/// finishes bit-identical to a lone run. A killed run's lock is taken over.
#[test]
fn a_second_run_into_a_directory_in_use_is_refused() {
    let dir = temp("lock");
    let out = dir.join("run");
    let args = |out: &Path, losses: &Path| {
        let mut c = shardc();
        c.args([
            "run",
            "--quiet",
            "models/shakespeare.shard",
            "--steps",
            "40",
        ])
        .arg("--dump-losses")
        .arg(losses)
        .arg("--out")
        .arg(out);
        c
    };
    let mut first = args(&out, &dir.join("first.json"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lock = out.join(".shardc.lock");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&lock).is_ok_and(|s| !s.is_empty()) {
        assert!(Instant::now() < deadline, "the first run never locked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = measured(&mut args(&out, &dir.join("second.json")));
    let status = first.wait().expect("wait");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut first.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(status.success(), "{err}");
    assert_eq!(second.code, Some(2), "{}", second.err);
    assert!(
        second.err.contains("is in use by") && second.err.contains(&format!("pid {}", first.id())),
        "{}",
        second.err
    );
    assert!(!dir.join("second.json").exists());
    let lone = measured(&mut args(&dir.join("lone"), &dir.join("lone.json")));
    assert_eq!(lone.code, Some(0), "{}", lone.err);
    assert_eq!(
        std::fs::read(dir.join("first.json")).expect("first"),
        std::fs::read(dir.join("lone.json")).expect("lone"),
        "the run that kept the directory is bit-identical to a lone run"
    );
    // What a killed run leaves: a lock file naming it, and no lock.
    let stale = dir.join("stale");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(
        stale.join(".shardc.lock"),
        "pid 4242 on host elsewhere (started at unix time 1)\n",
    )
    .expect("write");
    let r = measured(
        shardc()
            .args(["run", "models/shakespeare.shard", "--steps", "2", "--out"])
            .arg(&stale),
    );
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(
        r.err.contains("took over the lock") && r.err.contains("pid 4242 on host elsewhere"),
        "{}",
        r.err
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding: the language server held 650-900 MB and a core for minutes on a
/// huge document. A buffer over the limit gets one warning and no analysis;
/// `maxDocumentBytes` moves the limit.
#[test]
fn the_editor_does_not_analyse_an_enormous_buffer() {
    let dir = lsp::scratch("untrusted", "lsp");
    let mut s = lsp::Server::start();
    s.initialize(json_init(&dir));
    let big = format!("// {}\n{CLS}", "x".repeat(5 << 20));
    let big_uri = lsp::uri(&dir.join("big.shard"));
    s.open(&big_uri, &big);
    let d = s.diags(&big_uri);
    assert_eq!(d.len(), 1, "{d:?}");
    let msg = d[0]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("more than the 4194304 bytes the editor analyses"),
        "{msg}"
    );
    let symbols = s.request(
        "textDocument/documentSymbol",
        serde_json::json!({"textDocument": {"uri": big_uri}}),
    );
    assert_eq!(symbols, serde_json::json!([]), "nothing analysed");
    // A small buffer beside it is analysed as ever.
    let small_uri = lsp::uri(&dir.join("small.shard"));
    s.open(
        &small_uri,
        &format!("{CLS}model D {{ fn forward(x: f32[B, 6]) -> f32[B, 6] {{ y }} }}\n"),
    );
    let d = s.diags(&small_uri);
    assert!(
        d.iter()
            .any(|x| x["message"].as_str().unwrap_or_default().contains("`y`")),
        "{d:?}"
    );
    s.finish();
    // The client's option wins over the default.
    let mut s = lsp::Server::start();
    let mut init = json_init(&dir);
    init["initializationOptions"] = serde_json::json!({"maxDocumentBytes": 100});
    s.initialize(init);
    let uri = lsp::uri(&dir.join("c.shard"));
    s.open(&uri, CLS);
    let d = s.diags(&uri);
    assert!(
        d.len() == 1
            && d[0]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("more than the 100 bytes"),
        "{d:?}"
    );
    s.finish();
}

fn json_init(dir: &Path) -> serde_json::Value {
    serde_json::json!({"rootUri": lsp::uri(dir)})
}
