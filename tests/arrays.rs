//! Regression tests of the adversarial campaign against the array and FDO readers:
//! `.npy` headers (alone in a directory and inside `.npz`) that declare shapes far
//! beyond their data, truncated data, a FIFO named like an array file, and FDO
//! statistics files that are named in the future or forged all zero. Each must be
//! refused quickly with a message naming the file, never a panic, a huge
//! allocation or a hang; valid files must read as they always did.

use shardc::arrays::{self, Array, Problem, Values};
use shardc::embed::{self, FdoClient, Stats};
use shardc::files::DATA_CAP;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CLS: &str = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\ntrain C on m { data: synthetic(classes: 3), batch: 4, steps: 6, optimizer: sgd(lr: 0.3) }\n";

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-arrays-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A version 1.0 `.npy` with this header dict and these data bytes, written by
/// hand (not by the reader's own writer).
fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut header = dict.to_string();
    header.push_str(&" ".repeat((64 - (10 + header.len() + 1) % 64) % 64));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn f4(shape: &str, data: &[u8]) -> Vec<u8> {
    npy(
        &format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"),
        data,
    )
}

/// A stored zip of these entries, as numpy's `savez` writes one.
fn npz(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in entries {
        w.start_file(*name, opts).expect("entry");
        w.write_all(bytes).expect("write");
    }
    w.finish().expect("zip").into_inner()
}

/// 120 bytes: what a (5, 6) float32 array holds.
fn data120() -> Vec<u8> {
    (0..30u32).flat_map(|i| (i as f32).to_le_bytes()).collect()
}

/// Run `f` on its own thread; it must finish within `secs` seconds.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("finished in time (no hang, no panic)")
}

fn read_err(path: &Path) -> arrays::ArrayError {
    let p = path.to_path_buf();
    within(10, move || arrays::read_file(&p, DATA_CAP)).expect_err("refused")
}

/// `shardc ARGS`, killed after 10 s: (exit status, stderr on one line).
fn shardc(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            let out = child.wait_with_output().expect("output");
            // The renderer wraps long messages: join its lines back up.
            let err = String::from_utf8_lossy(&out.stderr).replace('│', " ");
            let err = err.split_whitespace().collect::<Vec<_>>().join(" ");
            return (out.status.code(), err);
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("shardc {args:?} still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// Finding: a `.npy` declaring shape (2^62, 6) panicked with a capacity overflow.
#[test]
fn npy_declaring_2_pow_62_rows_is_refused() {
    let dir = temp("p62");
    std::fs::write(
        dir.join("x.npy"),
        f4("(4611686018427387904, 6)", &data120()),
    )
    .expect("w");
    let e = read_err(&dir);
    assert_eq!(e.member.as_deref(), Some("x.npy"));
    assert!(
        matches!(*e.problem, Problem::SizeMismatch { holds: 120, .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("`x.npy` declares shape (4611686018427387904, 6) of float32 = 111 EB, but the file holds 120 bytes of data"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding: (10^12, 6) aborted trying to allocate 24 TB. Reached the way a user
/// does: `shardc check --data DIR` is a diagnostic naming the file and the sizes.
#[test]
fn npy_declaring_a_trillion_rows_is_refused_by_check_data() {
    let dir = temp("tera");
    std::fs::write(dir.join("x.npy"), f4("(1000000000000, 6)", &data120())).expect("w");
    std::fs::write(
        dir.join("y.npy"),
        npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }",
            &[0u8; 40],
        ),
    )
    .expect("w");
    let e = read_err(&dir);
    assert!(
        e.to_string()
            .contains("declares shape (1000000000000, 6) of float32 = 24 TB, but the file holds 120 bytes of data"),
        "{e}"
    );
    let model = dir.join("cls.shard");
    std::fs::write(&model, CLS).expect("model");
    let (code, err) = shardc(&[
        "check".as_ref(),
        "--data".as_ref(),
        dir.as_os_str(),
        model.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("E0304")
            && err.contains("`x.npy` declares shape (1000000000000, 6)")
            && err.contains("24 TB"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding: the same headers inside an `.npz`; and an entry whose zip headers
/// declare more bytes than the archive holds is refused before it is read.
#[test]
fn npz_entries_declaring_huge_shapes_are_refused() {
    let dir = temp("npz");
    for (shape, says) in [
        ("(4611686018427387904, 6)", "111 EB"),
        ("(1000000000000, 6)", "24 TB"),
    ] {
        let path = dir.join("d.npz");
        let bytes = npz(&[
            ("x.npy", f4(shape, &data120())),
            ("y.npy", f4("(5,)", &[0; 20])),
        ]);
        std::fs::write(&path, bytes).expect("w");
        let e = read_err(&path);
        assert_eq!(e.member.as_deref(), Some("x.npy"), "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "`{}`: `x.npy` declares shape {shape}",
                path.display()
            )),
            "{e}"
        );
    }
    // The entry's declared (uncompressed) size patched to 4 GB in both headers.
    let mut bytes = npz(&[("x.npy", f4("(5, 6)", &data120()))]);
    for (sig, at) in [(b"PK\x03\x04", 22), (b"PK\x01\x02", 24)] {
        let i = bytes.windows(4).position(|w| w == sig).expect("header");
        bytes[i + at..i + at + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    }
    let path = dir.join("lies.npz");
    std::fs::write(&path, bytes).expect("w");
    let e = read_err(&path);
    assert!(
        matches!(
            *e.problem,
            Problem::EntryTooBig {
                declared: 0xffff_fff0,
                ..
            }
        ),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding: a FIFO named `x.npy` hung `check` and `run`. A FIFO (or a FIFO named
/// like an `.npz`, or an FDO file) is refused without waiting for a writer.
#[test]
fn a_fifo_named_like_an_array_file_is_refused_quickly() {
    let dir = temp("fifo");
    let data = dir.join("d");
    std::fs::create_dir_all(&data).expect("dir");
    mkfifo(&data.join("x.npy"));
    let e = read_err(&data);
    assert_eq!(e.member.as_deref(), Some("x.npy"));
    assert!(e.to_string().contains("not a regular file"), "{e}");
    mkfifo(&dir.join("d.npz"));
    let e = read_err(&dir.join("d.npz"));
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let model = dir.join("cls.shard");
    std::fs::write(&model, CLS).expect("model");
    for target in [data.clone(), dir.join("d.npz")] {
        let (code, err) = shardc(&[
            "check".as_ref(),
            "--data".as_ref(),
            target.as_os_str(),
            model.as_os_str(),
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("E0304") && err.contains("not a regular file"),
            "{err}"
        );
    }
    let (code, err) = shardc(&[
        "run".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
        "--out".as_ref(),
        dir.join("run").as_os_str(),
        model.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    let fdo = dir.join("fdo");
    std::fs::create_dir_all(&fdo).expect("dir");
    mkfifo(&fdo.join("fdo_stats_0_5.npz"));
    let l = within(10, move || embed::load(&fdo)).expect("skipped");
    let e = l.warnings.join("\n");
    assert!(
        e.contains("not a readable FDO file") && e.contains("not a regular file"),
        "{e}"
    );
    assert_eq!(l.refused.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Data shorter (or longer) than the header declares, and a file cut inside its
/// header, are refused: the shape must account for the bytes exactly.
#[test]
fn truncated_or_padded_data_is_refused() {
    let dir = temp("trunc");
    let full = f4("(5, 6)", &data120());
    for (name, bytes, says) in [
        ("short", full[..full.len() - 7].to_vec(), "holds 113 bytes"),
        (
            "long",
            [full.clone(), vec![0; 4]].concat(),
            "holds 124 bytes",
        ),
        ("header", full[..40].to_vec(), "header declares"),
        ("magic", b"\x93NUMP".to_vec(), "magic"),
        ("empty", Vec::new(), "magic"),
    ] {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(d.join("x.npy"), &bytes).expect("w");
        let e = read_err(&d);
        assert!(e.to_string().contains(says), "{name}: {e}");
        // The same bytes as an archive's entry.
        std::fs::write(d.join("a.npz"), npz(&[("x.npy", bytes)])).expect("w");
        let e = read_err(&d.join("a.npz"));
        assert!(e.to_string().contains(says), "{name} in npz: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A safetensors file whose header declares a huge tensor, or offsets past its
/// end, is refused (the crate checks offsets against the buffer read).
#[test]
fn safetensors_declaring_huge_tensors_are_refused() {
    let dir = temp("st");
    for (shape, offsets) in [
        ("[1000000000000, 6]", "[0, 120]"),
        ("[5, 6]", "[0, 24000000000000]"),
        ("[4611686018427387904, 6]", "[0, 120]"),
    ] {
        let header =
            format!("{{\"x\":{{\"dtype\":\"F32\",\"shape\":{shape},\"data_offsets\":{offsets}}}}}");
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&data120());
        let path = dir.join("x.safetensors");
        std::fs::write(&path, bytes).expect("w");
        let e = read_err(&path);
        assert!(matches!(*e.problem, Problem::NotSafetensors(_)), "{e:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Valid files read as before: the fixtures (`.npz`, a directory of `.npy`,
/// safetensors), and the `.npy` variants numpy writes (version 2.0, Fortran
/// order, big-endian, half floats, booleans).
#[test]
fn valid_files_read_as_before() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/data");
    let cls = arrays::read_file(&root.join("cls.npz"), DATA_CAP).expect("npz");
    assert_eq!(
        cls.iter()
            .map(|a| (a.name.as_str(), a.shape.clone(), a.dtype))
            .collect::<Vec<_>>(),
        vec![("x", vec![4, 6], "float32"), ("y", vec![4], "int64")]
    );
    // Each keeps its stored type: int64 labels, float32 features.
    assert_eq!(cls[1].values, Values::I64(vec![0, 1, 2, 1]));
    assert!(matches!(cls[0].values, Values::F32(_)));
    assert!(cls[1].int && !cls[0].int);
    let dir = arrays::read_file(&root.join("cls_npy"), DATA_CAP).expect("dir");
    assert_eq!(dir[0].dtype, "float64");
    assert_eq!(dir[1].values, Values::I32(vec![2, 0, 1, 0]));
    // The `.npy` in the directory and the `.npz` hold the same x.
    assert_eq!(
        dir[0].values.iter().collect::<Vec<_>>(),
        cls[0].values.iter().collect::<Vec<_>>()
    );
    let st = arrays::read_file(&root.join("cls_steps.safetensors"), DATA_CAP).expect("st");
    assert_eq!(st[0].shape, vec![5, 4, 6]);
    assert_eq!(st[1].dtype, "int32");
    // Through the file-system abstraction the checker uses.
    let same = arrays::read(&shardc::files::Disk, &root.join("cls.npz")).expect("read");
    assert_eq!(same, cls);

    let d = temp("valid");
    let v2 = {
        let h = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }\n";
        let mut b = b"\x93NUMPY\x02\x00".to_vec();
        b.extend_from_slice(&(h.len() as u32).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[1, 0, 2, 0, 0xff, 0xff]);
        b
    };
    let files: [(&str, Vec<u8>); 5] = [
        ("a", v2),
        (
            "b",
            npy(
                "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }",
                &[1i32, 4, 2, 5, 3, 6]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        ),
        (
            "c",
            npy(
                "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }",
                &[1.5f64, -2.0]
                    .iter()
                    .flat_map(|v| v.to_be_bytes())
                    .collect::<Vec<u8>>(),
            ),
        ),
        (
            "d",
            npy(
                "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
                &[0x00, 0x3c, 0x00, 0xc0],
            ),
        ),
        (
            "e",
            npy(
                "{'descr': '|b1', 'fortran_order': False, 'shape': (0, 3), }",
                &[],
            ),
        ),
    ];
    for (name, bytes) in &files {
        std::fs::write(d.join(format!("{name}.npy")), bytes).expect("w");
    }
    let got = arrays::read_file(&d, DATA_CAP).expect("variants");
    let vals: Vec<(&str, Vec<usize>, Vec<f64>)> = got
        .iter()
        .map(|a: &Array| (a.name.as_str(), a.shape.clone(), a.values.iter().collect()))
        .collect();
    // uint16 and int32 as I32, float16 as F32, big-endian float64 as F64.
    let kinds: Vec<&str> = got
        .iter()
        .map(|a| match a.values {
            Values::I32(_) => "i32",
            Values::I64(_) => "i64",
            Values::F32(_) => "f32",
            Values::F64(_) => "f64",
        })
        .collect();
    assert_eq!(kinds, ["i32", "i32", "f64", "f32", "i32"]);
    assert_eq!(
        vals,
        vec![
            ("a", vec![3], vec![1.0, 2.0, 65535.0]),
            ("b", vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            ("c", vec![2], vec![1.5, -2.0]),
            ("d", vec![2], vec![1.0, -2.0]),
            ("e", vec![0, 3], vec![]),
        ]
    );
    // An empty array whose other dimensions multiply past any file is refused.
    std::fs::write(
        d.join("f.npy"),
        f4("(0, 1000000000000, 1000000000000)", &[]),
    )
    .expect("w");
    let e = read_err(&d);
    assert!(matches!(*e.problem, Problem::EmptyTooBig { .. }), "{e:?}");
    let _ = std::fs::remove_dir_all(&d);
}

fn stats(max_ids: Vec<i64>) -> Stats {
    Stats {
        max_unique_ids: max_ids.iter().map(|x| (x - 1).max(0)).collect(),
        required_buffer_size: max_ids.iter().map(|x| (x + 7) / 8 * 8).collect(),
        id_drop_counters: vec![0; max_ids.len()],
        max_ids,
        ..Default::default()
    }
}

/// An FDO file with these statistics for stack `s`, named for `process` at `ns`.
fn forge(dir: &Path, process: usize, ns: u128, s: &Stats) -> PathBuf {
    let arrays: Vec<(String, Vec<i32>)> = [
        ("max_ids", &s.max_ids),
        ("max_unique_ids", &s.max_unique_ids),
        ("required_buffer_size", &s.required_buffer_size),
        ("id_drop_counters", &s.id_drop_counters),
    ]
    .iter()
    .map(|(k, v)| (format!("s_{k}"), v.iter().map(|x| *x as i32).collect()))
    .collect();
    let path = dir.join(format!("fdo_stats_{process}_{ns}.npz"));
    std::fs::write(&path, arrays::npz_of_i32(&arrays).expect("npz")).expect("w");
    path
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

/// Finding: a stats file with a future timestamp in its name overrode the run's
/// own output at every round. It is ignored with a warning; one within the
/// clock-skew allowance is still used.
#[test]
fn future_named_fdo_file_is_ignored_with_a_warning() {
    let dir = temp("fdo-future");
    let mut own = FdoClient::new(&dir, 0);
    own.record("s", &stats(vec![3, 5]));
    let mine = own.publish().expect("publish");
    let hour = 3_600_000_000_000u128;
    let forged = forge(&dir, 0, now_ns() + hour, &stats(vec![900, 900]));
    let l = embed::load(&dir).expect("load");
    assert_eq!(l.files, vec![mine.clone()]);
    assert_eq!(l.stats["s"].max_ids, vec![3, 5]);
    assert!(l.refused.is_empty());
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(
        l.warnings[0].contains(&forged.display().to_string())
            && l.warnings[0].contains("in the future"),
        "{:?}",
        l.warnings
    );
    // `shardc fdo show` prints the warning and the run's own statistics.
    let (code, err) = shardc(&["fdo".as_ref(), "show".as_ref(), dir.as_os_str()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning:") && err.contains("in the future"),
        "{err}"
    );
    // Ten seconds ahead is clock skew, not forgery: that file is the newest.
    std::fs::remove_file(&forged).expect("rm");
    let near = forge(&dir, 0, now_ns() + 10_000_000_000, &stats(vec![4, 4]));
    let l = embed::load(&dir).expect("load");
    assert_eq!((l.files, l.warnings.len()), (vec![near], 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding: a forged all-zero file set the limits to 2. It is refused with a
/// warning, and a run keeps the limits it had; so is one that claims more ids
/// than a step can send, or the wrong number of partitions.
#[test]
fn forged_fdo_files_are_refused_and_limits_kept() {
    use shardc::embed::{Layout, Limits, Overflow, Partitioner};
    use shardc::runtime::sparse::{self, Fdo, Host, LookupRun, SparseConfig, TableRun};
    let dir = temp("fdo-zero");
    let zero = forge(&dir, 0, now_ns(), &stats(vec![0, 0]));
    let l = embed::load(&dir).expect("load");
    assert_eq!(l.refused, vec![zero.clone()]);
    assert!(l.stats.is_empty() && l.files.is_empty());
    assert!(l.warnings[0].contains("all zero"), "{:?}", l.warnings);
    std::fs::remove_file(&zero).expect("rm");

    // A run: 4 samples of 2 ids over 2 SparseCores and 2 partitions, FDO every
    // step. Its own statistics set the limits; a forged file named just after its
    // publish (within the clock-skew allowance, so it is the newest) does not.
    let cfg = SparseConfig {
        tables: vec![TableRun {
            name: "t".into(),
            stack: "s".into(),
            layout: Layout {
                devices: 1,
                sparsecores: 2,
            },
            part: Partitioner { n: 2, shift: 0 },
            limits: Limits {
                max_ids: 64,
                max_unique_ids: 64,
            },
            policy: Overflow::Grow,
            stack_limits: (None, None),
        }],
        lookups: vec![LookupRun {
            node: 0,
            input: 0,
            valency: 2,
            table: 0,
        }],
        fdo: Some(Fdo {
            every: 1,
            dir: dir.clone(),
            headroom: 1.2,
        }),
        sparsecores: 2,
    };
    let barrier = || Ok(());
    let host = Host {
        process: 0,
        processes: 1,
        barrier: &barrier,
    };
    let ids = |_: usize, _: usize| vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
    let notes = |forged: Option<Stats>| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        if let Some(s) = forged {
            forge(&dir, 0, now_ns() + 30_000_000_000, &s);
        }
        let steps = sparse::plan_steps(&cfg, 1, 0, &host, &ids)
            .expect("plan")
            .steps;
        steps[0].notes.join("\n")
    };
    let honest = notes(None);
    assert!(honest.contains("max_ids_per_partition 64 → 3"), "{honest}");
    let zeroed = notes(Some(stats(vec![0, 0])));
    assert!(
        zeroed.contains("warning")
            && zeroed.contains("all zero")
            && zeroed.contains("limits unchanged"),
        "{zeroed}"
    );
    // One SparseCore sends at most 2 samples × 2 ids = 4 ids in a step.
    let huge = notes(Some(stats(vec![5, 1])));
    assert!(
        huge.contains("claims 5 ids in partition 0") && huge.contains("limits unchanged"),
        "{huge}"
    );
    let three = notes(Some(stats(vec![1, 1, 1])));
    assert!(
        three.contains("has 3 partitions") && three.contains("limits unchanged"),
        "{three}"
    );
    let negative = {
        let mut s = stats(vec![2, 2]);
        s.max_ids[0] = -4;
        notes(Some(s))
    };
    assert!(
        negative.contains("the count -4") && negative.contains("limits unchanged"),
        "{negative}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An FDO file whose arrays declare huge shapes is an error naming it, not an
/// allocation (FDO files go through the same verified `.npz` reader).
#[test]
fn fdo_file_with_a_huge_header_is_an_error() {
    let dir = temp("fdo-huge");
    let bytes = npz(&[(
        "s_max_ids.npy",
        npy(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (1000000000000,), }",
            &[0; 8],
        ),
    )]);
    std::fs::write(dir.join("fdo_stats_0_1.npz"), bytes).expect("w");
    let e = within(10, {
        let dir = dir.clone();
        move || embed::load(&dir)
    })
    .expect("skipped")
    .warnings
    .join("\n");
    assert!(
        e.contains("not a readable FDO file")
            && e.contains("declares shape (1000000000000,) of int32 = 4.0 TB"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
