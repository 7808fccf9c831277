//! `data: tokens(...)`: flat token streams as numpy writes them
//! (`tests/fixtures/tokens/`, from `scripts/token_fixtures.py`). The windows
//! shardc cuts equal nanoGPT's `get_batch` slicing at the same starts (a run
//! on the stream and a run on the reference's arrays give the same losses,
//! bit for bit), for `.bin` in uint16 and uint32 and for `.npy`, drawn and
//! sequential; a resumed run continues with exactly the next windows; memory
//! does not grow with the file; bad streams are errors naming the file and
//! the position.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

use common::{shardc, stderr};

const FIX: &str = "tests/fixtures/tokens";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn temp(name: &str) -> PathBuf {
    common::temp("tokens", name)
}

/// A small language model over ids below 256 trained on `data`, in `dir`.
fn model(dir: &Path, data: &str, extra: &str) -> PathBuf {
    let p = dir.join("lm.shard");
    std::fs::write(
        &p,
        format!(
            "import nn
mesh m(dp: 2)
model LM {{
  e = Embed(256, 16)
  head = Dense(16 -> 256)
  fn forward(ids: i32[B@dp, 16]) -> f32[B@dp, 16, 256] {{ head(e(ids)) }}
}}
train LM on m {{
  data: {data}
  batch: 8, steps: 3, seed: 0, optimizer: adam(lr: 0.01){extra}
}}
"
        ),
    )
    .expect("write");
    p
}

fn run(model: &Path, out: &Path, args: &[&str]) -> (Output, Vec<f64>) {
    common::trained(model, out, &[&["--quiet"], args].concat())
}

fn fixture(name: &str) -> String {
    root().join(FIX).join(name).display().to_string()
}

#[test]
fn windows_equal_nanogpt_slicing_at_the_same_starts() {
    for (stream, opts, windows) in [
        ("stream.bin", "", "windows.npz"),
        ("stream32.bin", ", uint32: true", "windows.npz"),
        ("stream.npy", "", "windows.npz"),
        ("stream.bin", ", sequential: true", "windows_seq.npz"),
    ] {
        let dir = temp(&format!("win-{}{}", stream, opts.len()));
        let m = model(
            &dir,
            &format!("tokens(path: \"{}\", seq: 16{opts})", fixture(stream)),
            "",
        );
        let (a, la) = run(&m, &dir.join("a"), &[]);
        assert!(a.status.success(), "{stream}{opts}: {}", stderr(&a));
        let (b, lb) = run(&m, &dir.join("b"), &["--data", &fixture(windows)]);
        assert!(b.status.success(), "{}", stderr(&b));
        assert_eq!(la.len(), 3);
        assert_eq!(
            la, lb,
            "{stream}{opts}: the windows differ from the reference's"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_resumed_run_continues_with_the_next_windows() {
    let dir = temp("resume");
    let data = format!("tokens(path: \"{}\", seq: 16)", fixture("stream.bin"));
    let m = model(&dir, &data, ", checkpoint: { every: 2, dir: \"ck\" }");
    let (a, straight) = run(&m, &dir.join("a"), &["--steps", "6"]);
    assert!(a.status.success(), "{}", stderr(&a));
    let (b, first) = run(&m, &dir.join("b"), &["--steps", "4"]);
    assert!(b.status.success(), "{}", stderr(&b));
    let (c, rest) = run(&m, &dir.join("b"), &["--steps", "6", "--resume"]);
    assert!(c.status.success(), "{}", stderr(&c));
    assert_eq!(&straight[..4], &first[..]);
    assert_eq!(&straight[4..], &rest[..], "resumed: {rest:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream of `ids` zeros, written sparse (no disk used).
fn zeros(path: &Path, ids: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(ids * 2).expect("size");
}

#[test]
fn memory_does_not_grow_with_the_stream() {
    let dir = temp("memory");
    let (small, big) = (dir.join("small.bin"), dir.join("big.bin"));
    zeros(&small, 500_000); // 1 MB
    zeros(&big, 100_000_000); // 200 MB
    let mut peaks = Vec::new();
    for f in [&small, &big] {
        let m = model(
            &dir,
            &format!("tokens(path: \"{}\", seq: 16)", f.display()),
            "",
        );
        let r = common::measured(
            shardc()
                .args(["run", "--quiet", "--steps", "3", "--out"])
                .arg(dir.join("run"))
                .arg(&m),
        );
        assert_eq!(r.code, Some(0), "{}", r.err);
        peaks.push(r.peak_mib);
    }
    // 200 times the ids, the same memory (within a few MiB of noise).
    assert!(peaks[1] < peaks[0] + 16.0, "peak RSS {peaks:?} MiB");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_streams_are_errors_with_the_file_and_the_position() {
    let dir = temp("bad");
    let check = |data: &str, want: &[&str], command: &str| {
        let m = model(&dir, data, "");
        let mut c = shardc();
        c.arg(command);
        if command == "run" {
            c.arg("--out").arg(dir.join("run"));
        }
        let o = c.arg(&m).output().expect("spawn");
        let err = stderr(&o);
        assert!(!o.status.success(), "{data}: {err}");
        for w in want {
            assert!(err.contains(w), "{data}: `{w}` not in {err}");
        }
        assert!(!dir.join("run/final").exists(), "{data}: trained anyway");
    };
    let ids: Vec<u8> = std::fs::read(root().join(FIX).join("stream.bin")).expect("read");
    // Cut short: an odd number of bytes.
    let odd = dir.join("odd.bin");
    std::fs::write(&odd, &ids[..ids.len() - 1]).expect("write");
    check(
        &format!("tokens(path: \"{}\")", odd.display()),
        &["E0304", "39999 bytes, not a whole number of uint16 ids"],
        "check",
    );
    // Empty.
    let empty = dir.join("empty.bin");
    std::fs::write(&empty, b"").expect("write");
    check(
        &format!("tokens(path: \"{}\")", empty.display()),
        &["E0305", "holds 0 ids"],
        "check",
    );
    // An id past the vocabulary deep in the stream, where step 500 would read
    // it: `check` samples, `run` reads every id first and names it.
    let mut deep = ids.clone();
    deep[2 * 15_001..2 * 15_001 + 2].copy_from_slice(&300u16.to_le_bytes());
    let far = dir.join("far.bin");
    std::fs::write(&far, &deep).expect("write");
    check(
        &format!("tokens(path: \"{}\", seq: 16)", far.display()),
        &["id 300 at token 15001 (byte 30002) is outside the vocabulary of 256"],
        "run",
    );
    // A 2-D .npy and a float one.
    let npy = |name: &str, descr: &str, shape: &str, data: &[u8]| {
        let mut head =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + head.len() + 1) % 64 != 0 {
            head.push(' ');
        }
        head.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(head.len() as u16).to_le_bytes());
        b.extend_from_slice(head.as_bytes());
        b.extend_from_slice(data);
        let p = dir.join(name);
        std::fs::write(&p, b).expect("write");
        p
    };
    let two = npy("two.npy", "<u2", "(100, 200)", &ids);
    check(
        &format!("tokens(path: \"{}\")", two.display()),
        &["shape is [100, 200]; a token stream is 1-D"],
        "check",
    );
    let float = npy("float.npy", "<f4", "(10000,)", &ids);
    check(
        &format!("tokens(path: \"{}\")", float.display()),
        &["its dtype is float32"],
        "check",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stream_replaced_while_training_stops_the_run_with_its_checkpoints() {
    let dir = temp("replaced");
    let stream = dir.join("s.bin");
    std::fs::copy(root().join(FIX).join("stream.bin"), &stream).expect("copy");
    let m = model(
        &dir,
        &format!("tokens(path: \"{}\", seq: 16)", stream.display()),
        ", checkpoint: { every: 1, keep: 2, dir: \"ck\" }",
    );
    let child = shardc()
        .args(["run", "--quiet", "--steps", "100000", "--out"])
        .arg(dir.join("run"))
        .arg(&m)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let ck = dir.join("run/ck");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !ck.join("step-00000002").exists() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Replace it as a data pipeline would: a new file renamed over the old.
    let next = dir.join("s.bin.new");
    std::fs::copy(root().join(FIX).join("stream.bin"), &next).expect("copy");
    std::fs::rename(&next, &stream).expect("rename");
    let out = child.wait_with_output().expect("wait");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("s.bin` changed while the run read it (it was replaced by another file)"),
        "{err}"
    );
    let kept = std::fs::read_dir(&ck)
        .expect("ck")
        .filter_map(|e| e.ok())
        .count();
    assert!(kept >= 1, "checkpoints kept: {kept}");
    let _ = std::fs::remove_dir_all(&dir);
}
