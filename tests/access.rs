//! The file-access policy and trusted checkpoints, end to end through the
//! binary (issue 15's findings 1, 5, 6, 7, 11 and the failed save): nothing a
//! model file names is read or written outside its directory and the run
//! directory; every damaged or mismatched checkpoint is refused on `--resume`
//! and leaves every checkpoint byte for byte as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-access-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// `shardc ARGS` in `dir`, with no grants.
fn shardc(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("spawn shardc")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// Every file under `dir` with its bytes (symlinks as their target).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(t) = e.file_type() else { continue };
            if t.is_symlink() {
                let target = std::fs::read_link(&p).unwrap_or_default();
                out.insert(p, target.to_string_lossy().as_bytes().to_vec());
            } else if t.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

const MODEL: &str = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 8)\n  b = Dense(8 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { b(silu(a(x))) }\n}\n";

fn train(extra: &str) -> String {
    format!("{MODEL}train C on m {{ data: synthetic(classes: 3), batch: 8, steps: 20, seed: 3, optimizer: adamw(lr: 0.01){extra} }}\n")
}

/// A victim directory outside the run directory that looks like a checkpoint
/// directory (what rotation used to delete), and a user's file.
fn victim(root: &Path) -> PathBuf {
    let v = root.join("victim");
    std::fs::create_dir_all(v.join("step-00000001")).expect("dir");
    std::fs::write(v.join("step-00000001/manifest.json"), "{}").expect("write");
    std::fs::create_dir_all(v.join(".tmp-step-00000002-1")).expect("dir");
    std::fs::write(v.join("notes.txt"), "mine").expect("write");
    v
}

#[test]
fn model_files_cannot_write_or_delete_outside_the_run_directory() {
    let root = scratch("writes");
    let work = root.join("work");
    std::fs::create_dir_all(&work).expect("dir");
    let v = victim(&root);
    let before = snapshot(&v);
    for dir in [
        "../victim",
        "../../victim",
        "/tmp",
        v.to_str().unwrap_or("/x"),
    ] {
        for block in [
            "checkpoint: { every: 5, keep: 1, dir: \"D\" }",
            "fdo: { every: 5, dir: \"D\" }",
        ] {
            let f = work.join("m.shard");
            std::fs::write(&f, train(&format!(", {}", block.replace('D', dir)))).expect("write");
            let o = shardc(&work, &["check", "m.shard"]);
            assert_eq!(o.status.code(), Some(1), "{dir}: {}", text(&o));
            assert!(text(&o).contains("E0307"), "{}", text(&o));
            let o = shardc(&work, &["run", "--quiet", "m.shard", "--out", "run"]);
            assert!(!o.status.success(), "{dir}: a run must refuse");
        }
    }
    // A symlink planted in the run directory does not carry writes out.
    std::fs::create_dir_all(work.join("run")).expect("dir");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&v, work.join("run/ckpt")).expect("symlink");
    std::fs::write(
        work.join("m.shard"),
        train(", checkpoint: { every: 5, keep: 1, dir: \"ckpt\" }"),
    )
    .expect("write");
    let o = shardc(&work, &["run", "--quiet", "m.shard", "--out", "run"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("outside the run directory"),
        "{}",
        text(&o)
    );
    assert_eq!(snapshot(&v), before, "the victim directory is untouched");
    // Granted, the same absolute directory is used, and rotation there deletes
    // only this run's checkpoints.
    let granted = root.join("granted");
    std::fs::create_dir_all(&granted).expect("dir");
    std::fs::write(granted.join("notes.txt"), "mine").expect("write");
    let abs = granted.join("ck");
    std::fs::write(
        work.join("m.shard"),
        train(&format!(
            ", checkpoint: {{ every: 5, keep: 1, dir: \"{}\" }}",
            abs.display()
        )),
    )
    .expect("write");
    let g = granted.to_string_lossy().to_string();
    let o = shardc(
        &work,
        &[
            "--allow-path",
            &g,
            "run",
            "--quiet",
            "m.shard",
            "--out",
            "run2",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(abs.join("step-00000020/manifest.json").is_file());
    assert_eq!(
        std::fs::read(granted.join("notes.txt")).ok(),
        Some(b"mine".to_vec())
    );
    // And a legitimate run writes nothing outside its run directory.
    let outside = snapshot(&root);
    std::fs::write(
        work.join("m.shard"),
        train(", checkpoint: { every: 5, keep: 2, dir: \"ckpt\" }"),
    )
    .expect("write");
    let before_all = outside.clone();
    let o = shardc(&work, &["run", "--quiet", "m.shard", "--out", "run3"]);
    assert!(o.status.success(), "{}", text(&o));
    let after: BTreeMap<_, _> = snapshot(&root)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(work.join("run3")) && *p != work.join("m.shard"))
        .collect();
    let before_all: BTreeMap<_, _> = before_all
        .into_iter()
        .filter(|(p, _)| *p != work.join("m.shard"))
        .collect();
    assert_eq!(after, before_all, "only the run directory changed");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn model_files_cannot_read_outside_their_directory() {
    let root = scratch("reads");
    let work = root.join("work");
    std::fs::create_dir_all(&work).expect("dir");
    std::fs::write(root.join("secret.shard"), "const SECRET_TOKEN_XYZ = 1\n").expect("write");
    std::fs::write(root.join("secret.txt"), "SECRET_TOKEN_XYZ\n").expect("write");
    #[cfg(unix)]
    std::os::unix::fs::symlink(root.join("secret.shard"), work.join("link.shard"))
        .expect("symlink");
    let cases = [
        ("import \"../secret.shard\"\n".to_string(), "E0102"),
        ("import \"link.shard\"\n".to_string(), "E0102"),
        (format!("import \"{}\"\n", root.join("secret.txt").display()), "E0102"),
        ("import \"/etc/passwd\"\n".to_string(), "E0102"),
        (
            format!("{MODEL}train C on m {{ data: text(path: \"../secret.txt\"), batch: 8, steps: 1, optimizer: sgd(lr: 0.1) }}\n"),
            "E0304",
        ),
    ];
    for (src, code) in cases {
        std::fs::write(work.join("m.shard"), &src).expect("write");
        let o = shardc(&work, &["check", "m.shard"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{src}: {t}");
        assert!(t.contains(code), "{src}: {t}");
        assert!(
            !t.contains("SECRET_TOKEN_XYZ"),
            "{src}: the file's contents leaked: {t}"
        );
        assert!(!t.contains("root:"), "{src}: /etc/passwd leaked: {t}");
    }
    // Granted, the import is read.
    std::fs::write(work.join("m.shard"), "import \"../secret.shard\"\n").expect("write");
    let r = root.to_string_lossy().to_string();
    let o = shardc(&work, &["--allow-path", &r, "check", "m.shard"]);
    assert!(o.status.success(), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn symlinked_outputs_are_replaced_not_followed() {
    let root = scratch("links");
    let v = root.join("precious.txt");
    std::fs::write(&v, "keep me").expect("write");
    let run = root.join("run");
    std::fs::create_dir_all(&run).expect("dir");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&v, run.join("metrics.jsonl")).expect("symlink");
        std::os::unix::fs::symlink(&v, run.join("loss.svg")).expect("symlink");
    }
    std::fs::write(root.join("m.shard"), train("")).expect("write");
    let o = shardc(&root, &["run", "--quiet", "m.shard", "--out", "run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&v).ok().as_deref(), Some("keep me"));
    assert!(
        // The configuration, then 20 steps.
        std::fs::read_to_string(run.join("metrics.jsonl")).is_ok_and(|m| m.lines().count() == 21)
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// 20 steps with checkpoints every 5 (keep 4): the four checkpoints' files.
fn trained(root: &Path, extra_args: &[&str], opt: &str) -> PathBuf {
    let src =
        train(", checkpoint: { every: 5, keep: 4, dir: \"ckpt\" }").replace("adamw(lr: 0.01)", opt);
    std::fs::write(root.join("m.shard"), src).expect("write");
    let mut args = vec!["run", "--quiet", "m.shard", "--out", "run"];
    args.extend_from_slice(extra_args);
    let o = shardc(root, &args);
    assert!(o.status.success(), "{}", text(&o));
    root.join("run/ckpt")
}

fn resume(root: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "run", "--quiet", "m.shard", "--out", "run", "--resume", "--steps", "30",
    ];
    args.extend_from_slice(extra);
    shardc(root, &args)
}

#[test]
fn damaged_checkpoints_are_refused_and_nothing_is_rotated_away() {
    let root = scratch("damage");
    let ck = trained(&root, &[], "adamw(lr: 0.01)");
    let newest = ck.join("step-00000020");
    let tensors = newest.join("tensors.safetensors");
    let pristine = std::fs::read(&tensors).expect("tensors");
    let manifest_text = std::fs::read_to_string(newest.join("manifest.json")).expect("manifest");
    let manifest: serde_json::Value = serde_json::from_str(&manifest_text).expect("json");
    let all = snapshot(&ck);
    let check_refused = |what: &str, expect: &str| {
        let o = resume(&root, &[]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{what}: {t}");
        assert!(t.contains(expect), "{what}: expected `{expect}` in: {t}");
    };
    // One flipped bit in every tensor, in turn.
    let st = safetensors::SafeTensors::deserialize(&pristine).expect("safetensors");
    let header = 8 + u64::from_le_bytes(pristine[..8].try_into().expect("8 bytes")) as usize;
    let mut names: Vec<String> = st.names().into_iter().map(|n| n.to_string()).collect();
    names.sort();
    assert!(names.len() >= 8, "params and Adam moments: {names:?}");
    for name in &names {
        let (start, _) = st
            .tensor(name)
            .map(|t| {
                let off = t.data().as_ptr() as usize - pristine.as_ptr() as usize;
                (off, t.data().len())
            })
            .expect("tensor");
        assert!(start >= header);
        let mut b = pristine.clone();
        b[start + 2] ^= 0x40; // an exponent bit of the first value
        std::fs::write(&tensors, &b).expect("write");
        check_refused(name, "does not match its checksum");
        std::fs::write(&tensors, &pristine).expect("restore");
    }
    // Zeroed weights.
    let mut z = pristine.clone();
    for x in &mut z[header..] {
        *x = 0;
    }
    std::fs::write(&tensors, &z).expect("write");
    check_refused("zeroed", "checksum");
    std::fs::write(&tensors, &pristine).expect("restore");
    // A dropped tensor.
    let kept: Vec<(String, safetensors::tensor::TensorView)> = names
        .iter()
        .filter(|n| !n.starts_with("opt_v/"))
        .map(|n| (n.clone(), st.tensor(n).expect("tensor")))
        .collect();
    let dropped = safetensors::tensor::serialize(kept, None).expect("serialize");
    std::fs::write(&tensors, &dropped).expect("write");
    check_refused("dropped opt_v", "lacks the tensor");
    std::fs::write(&tensors, &pristine).expect("restore");
    // Edited manifest fields.
    let edits: Vec<(&str, serde_json::Value, &str)> = vec![
        ("step", 15.into(), "named for step 20"),
        ("seed", 4.into(), "seed"),
        ("optimizer", "sgd".into(), "optimizer"),
        ("dtype", "f64".into(), "dtype"),
        ("data_position", 0.into(), "data position"),
        ("model", "D".into(), "model"),
        ("format", "shardc-checkpoint-1".into(), "format"),
    ];
    for (field, value, expect) in edits {
        let mut m = manifest.clone();
        m[field] = value;
        std::fs::write(newest.join("manifest.json"), m.to_string()).expect("write");
        check_refused(field, expect);
    }
    let mut m = manifest.clone();
    if let Some(t) = m["tensors"].as_array_mut() {
        t.retain(|t| !t["name"].as_str().is_some_and(|n| n.starts_with("opt_m/")));
    }
    std::fs::write(newest.join("manifest.json"), m.to_string()).expect("write");
    check_refused("moments dropped from the manifest", "does not list");
    std::fs::write(newest.join("manifest.json"), &manifest_text).expect("restore");
    assert_eq!(
        snapshot(&ck),
        all,
        "every checkpoint is still there, byte for byte"
    );
    // `--seed` differing from the checkpoint's is refused, too.
    let o = resume(&root, &["--seed", "7"]);
    assert!(text(&o).contains("seed"), "{}", text(&o));
    // Damage the newest, then fall back on request: the newest valid one resumes
    // and no valid checkpoint is rotated away because of the damaged one.
    let mut b = pristine.clone();
    b[header + 5] ^= 1;
    std::fs::write(&tensors, &b).expect("write");
    let o = shardc(
        &root,
        &[
            "run",
            "--quiet",
            "m.shard",
            "--out",
            "run",
            "--resume",
            "--resume-fallback",
            "--steps",
            "19",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("skipped"), "{}", text(&o));
    for s in [5, 10, 15, 20] {
        assert!(
            ck.join(format!("step-{s:08}/manifest.json")).is_file(),
            "step {s} kept"
        );
    }
    // Without the request, the damaged newest is still refused.
    let o = resume(&root, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn checkpoints_of_another_optimizer_or_dtype_are_refused() {
    let root = scratch("mismatch");
    trained(&root, &[], "sgd(lr: 0.1)");
    // The same file now says adamw: an SGD checkpoint has no moments.
    let src = std::fs::read_to_string(root.join("m.shard"))
        .expect("read")
        .replace("sgd(lr: 0.1)", "adamw(lr: 0.01)");
    std::fs::write(root.join("m.shard"), src).expect("write");
    let o = resume(&root, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("optimizer"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&root);
    let root = scratch("mismatch-f64");
    trained(&root, &["--f64"], "adamw(lr: 0.01)");
    let o = resume(&root, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("dtype f64"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn runs_do_not_mix_and_resumes_append_their_metrics() {
    let root = scratch("series");
    let ck = trained(&root, &[], "adamw(lr: 0.01)");
    let before = snapshot(&ck);
    // A fresh run into the same directory is refused, and changes nothing.
    let o = shardc(&root, &["run", "--quiet", "m.shard", "--out", "run"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("another run"), "{}", text(&o));
    assert_eq!(snapshot(&ck), before);
    // Resumed, the metrics continue: steps 1..30, once each.
    let o = resume(&root, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let metrics = std::fs::read_to_string(root.join("run/metrics.jsonl")).expect("metrics");
    let steps: Vec<u64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["step"].as_u64())
        .collect();
    assert_eq!(steps, (1..=30).collect::<Vec<_>>());
    // `--overwrite` starts afresh.
    let o = shardc(
        &root,
        &["run", "--quiet", "m.shard", "--out", "run", "--overwrite"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(!ck.join("step-00000030").exists(), "the old series is gone");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_failed_save_is_an_error_exit() {
    let root = scratch("failsave");
    std::fs::write(
        root.join("m.shard"),
        train(", checkpoint: { every: 5, dir: \"ckpt\" }"),
    )
    .expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(&root)
        .env("SHARDC_FAULT_SAVE_FAIL", "1")
        .args(["run", "--quiet", "m.shard", "--out", "run"])
        .output()
        .expect("spawn");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("was not written"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&root);
}
