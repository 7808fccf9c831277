//! The MPI backend as a user runs it: `mpirun -np N shardc run FILE --backend mpi`,
//! one device per process. Its losses must equal the virtual mesh's bit for bit
//! (both add every reduction in rank order), for every kind of parallelism and
//! collective the seed models use, and a checkpoint written under MPI must resume
//! on the virtual mesh.
//!
//! The backend needs Open MPI and libclang, so it is behind the `mpi` feature.
//! When `mpirun` is on the PATH, these tests build a shardc with that feature
//! (in `target/mpi`) and run it; otherwise they say they were skipped, or fail
//! when `SHARDC_REQUIRE_MPI` is set (CI sets it, after installing Open MPI).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Why these tests cannot run here, or fail when they must.
fn unavailable(why: &str) -> Option<PathBuf> {
    if std::env::var_os("SHARDC_REQUIRE_MPI").is_some() {
        panic!("SHARDC_REQUIRE_MPI is set, but {why}");
    }
    eprintln!("skipped: the MPI backend tests need Open MPI ({why})");
    None
}

/// A shardc built with `--features mpi`, once for all tests here.
fn mpi_shardc() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let version = Command::new("mpirun").arg("--version").output();
            match version {
                Ok(o) if String::from_utf8_lossy(&o.stdout).contains("Open MPI") => {}
                Ok(_) => return unavailable("the `mpirun` on the PATH is not Open MPI's"),
                Err(_) => return unavailable("there is no `mpirun` on the PATH"),
            }
            let target = root().join("target/mpi");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            // Dependencies unoptimised: the build takes a third of the time, the
            // models here are small, and the arithmetic is the same IEEE
            // operations in the same order (the losses still match bit for bit).
            let out = Command::new(cargo)
                .current_dir(root())
                .args([
                    "build",
                    "--features",
                    "mpi",
                    "--bin",
                    "shardc",
                    "--config",
                    "profile.dev.package.\"*\".opt-level=0",
                    "--target-dir",
                ])
                .arg(&target)
                .output()
                .expect("run cargo");
            if !out.status.success() {
                return unavailable(&format!(
                    "`cargo build --features mpi` failed (libclang-dev installed?):\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Some(target.join("debug/shardc"))
        })
        .clone()
}

/// One test at a time: each `mpirun` starts a process per device on this
/// machine, and seed 000's runs share the `fdo/` directory.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn mpirun(bin: &Path, np: usize, mca_tcp: bool, args: &[&str]) -> Output {
    let mut c = Command::new("mpirun");
    c.current_dir(root())
        // Containers and CI often run as root; Open MPI refuses that unless told.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Several processes share this machine's cores.
        .env("RAYON_NUM_THREADS", "1")
        .args(["--oversubscribe", "-np", &np.to_string()]);
    if mca_tcp {
        // Over TCP sockets instead of shared memory: the path between machines.
        c.args(["--mca", "btl", "tcp,self"]);
    }
    c.arg(bin)
        .arg("--allow-path")
        .arg(std::env::temp_dir())
        .args(["run", "--backend", "mpi"])
        .args(args)
        .output()
        .expect("spawn mpirun")
}

fn virtual_run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(root())
        .arg("--allow-path")
        .arg(std::env::temp_dir())
        .arg("run")
        .args(args)
        .output()
        .expect("spawn shardc")
}

mod common;

fn temp(name: &str) -> PathBuf {
    common::temp("mpi", name)
}

fn loss_bits(path: &Path) -> Vec<u64> {
    common::losses(path).iter().map(|x| x.to_bits()).collect()
}

fn ok(what: &str, o: &Output) {
    assert!(
        o.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Train `file` both ways and compare the losses bit for bit.
fn same_losses(bin: &Path, dir: &Path, file: &str, np: usize, tcp: bool, extra: &[&str]) {
    let tag = file.replace(['/', '.'], "_") + if tcp { "_tcp" } else { "" };
    let (v, m) = (
        dir.join(format!("{tag}.v.json")),
        dir.join(format!("{tag}.m.json")),
    );
    let out = dir.join(&tag);
    let common = |dump: &Path, out: &str| -> Vec<String> {
        let mut a: Vec<String> = vec![file.into(), "--quiet".into(), "--dump-losses".into()];
        a.push(dump.display().to_string());
        a.extend(["--out".into(), out.into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let va = common(&v, &format!("{}/v", out.display()));
    let ma = common(&m, &format!("{}/m", out.display()));
    ok(
        file,
        &virtual_run(&va.iter().map(String::as_str).collect::<Vec<_>>()),
    );
    let o = mpirun(
        bin,
        np,
        tcp,
        &ma.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    ok(&format!("mpirun -np {np} {file}"), &o);
    let (a, b) = (loss_bits(&v), loss_bits(&m));
    assert!(!a.is_empty(), "{file}: no losses");
    assert_eq!(a, b, "{file}: MPI losses differ from the virtual mesh's");
}

#[test]
fn mpi_runs_equal_the_virtual_mesh_bit_for_bit() {
    let _one = serial();
    let Some(bin) = mpi_shardc() else { return };
    let dir = temp("same");
    // Seed 000: a MOD-placed table (all-to-all lookups), FDO files at step 15
    // and 30 published by every process between host barriers.
    same_losses(
        &bin,
        &dir,
        "models/shakespeare.shard",
        8,
        false,
        &["--steps", "30"],
    );
    // Seed 003: data parallel, and FSDP (gather, reduce-scatter).
    same_losses(
        &bin,
        &dir,
        "models/fsdp_mlp.shard",
        8,
        false,
        &["--steps", "4"],
    );
    same_losses(
        &bin,
        &dir,
        "models/fsdp_mlp.shard",
        8,
        false,
        &["--steps", "4", "--model", "FSDPClassifier"],
    );
    // Seed 001's structure: dp × mp, psum over mp, vocabulary-parallel loss.
    same_losses(
        &bin,
        &dir,
        "tests/models/gptj_small.shard",
        8,
        false,
        &["--steps", "4"],
    );
    // Seed 004's structure: dp × pp × tp, activations moved by ppermute.
    same_losses(
        &bin,
        &dir,
        "tests/models/t3d_small.shard",
        8,
        false,
        &["--steps", "2"],
    );
    // The zero-bubble V schedule: two pieces per rank, the first and last
    // on rank 0, values moved within a rank and both ways between ranks,
    // backwards split into input and weight gradients.
    let zbv = dir.join("t3d_small_zbv.shard");
    let text = std::fs::read_to_string(root().join("tests/models/t3d_small.shard"))
        .expect("model")
        .replace("schedule: gpipe", "schedule: zbv");
    assert!(text.contains("schedule: zbv"), "the model file changed");
    std::fs::write(&zbv, text).expect("written");
    same_losses(
        &bin,
        &dir,
        &zbv.display().to_string(),
        8,
        false,
        &["--steps", "2"],
    );
    // bf16 mixed precision: 16-bit tensors cross as f32, and sums over
    // devices accumulate in f32 on both backends.
    let bf16 = dir.join("gptj_small_bf16.shard");
    let text = std::fs::read_to_string(root().join("tests/models/gptj_small.shard"))
        .expect("model")
        .replace("  optimizer:", "  precision: bf16\n  optimizer:");
    std::fs::write(&bf16, text).expect("written");
    same_losses(
        &bin,
        &dir,
        &bf16.display().to_string(),
        8,
        false,
        &["--steps", "4"],
    );
    // Over TCP, as between machines.
    same_losses(
        &bin,
        &dir,
        "tests/models/gptj_small.shard",
        8,
        true,
        &["--steps", "2"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// 20 steps under MPI with checkpoints, then 20 more resumed on the virtual
/// mesh: the losses of 40 straight steps, bit for bit.
#[test]
fn a_checkpoint_written_under_mpi_resumes_on_the_virtual_mesh() {
    let _one = serial();
    let Some(bin) = mpi_shardc() else { return };
    let dir = temp("ckpt");
    let model = dir.join("c.shard");
    let text = |ck: &Path| {
        format!(
            "import nn\nmesh m(data: 4)\nmodel C {{\n  a = Dense(6 -> 8)\n  b = Dense(8 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ b(dropout(silu(a(x)), 0.1)) }}\n}}\ntrain C on m {{ data: synthetic(classes: 3), batch: 16, steps: 40, seed: 3, optimizer: adamw(lr: 0.01), checkpoint: {{ every: 10, keep: 2, dir: \"{}\" }} }}\n",
            ck.display()
        )
    };
    let straight = dir.join("straight.shard");
    std::fs::write(&straight, text(&dir.join("ck-straight"))).expect("write");
    std::fs::write(&model, text(&dir.join("ck"))).expect("write");
    let p = |x: &Path| x.display().to_string();
    let (s, a, b) = (dir.join("s.json"), dir.join("a.json"), dir.join("b.json"));
    let out = p(&dir.join("runs"));
    ok(
        "straight",
        &virtual_run(&[
            &p(&straight),
            "--quiet",
            "--out",
            &out,
            "--dump-losses",
            &p(&s),
        ]),
    );
    ok(
        "mpi, 20 steps",
        &mpirun(
            &bin,
            4,
            false,
            &[
                &p(&model),
                "--quiet",
                "--steps",
                "20",
                "--out",
                &out,
                "--dump-losses",
                &p(&a),
            ],
        ),
    );
    ok(
        "resumed",
        &virtual_run(&[
            &p(&model),
            "--quiet",
            "--resume",
            "--out",
            &out,
            "--dump-losses",
            &p(&b),
        ]),
    );
    let joined: Vec<u64> = loss_bits(&a).into_iter().chain(loss_bits(&b)).collect();
    assert_eq!(joined, loss_bits(&s));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The wrong number of processes is a usage error, said once.
#[test]
fn one_process_per_device_or_a_usage_error() {
    let _one = serial();
    let Some(bin) = mpi_shardc() else { return };
    let o = mpirun(&bin, 2, false, &["models/fsdp_mlp.shard", "--quiet"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let msg = "has 8 devices, but MPI started 2 processes";
    assert_eq!(err.matches(msg).count(), 1, "{err}");
    assert!(err.contains("mpirun -np 8"), "{err}");
}

/// A run that stops at a step stops on every process, and is reported once,
/// with its source line (seed 000 under the reference's limits, step 22).
#[test]
fn a_stopped_run_is_reported_once() {
    let _one = serial();
    let Some(bin) = mpi_shardc() else { return };
    let dir = temp("stop");
    let out = dir.join("run").display().to_string();
    let o = mpirun(
        &bin,
        8,
        false,
        &[
            "examples/shakespeare_reference_limits.shard",
            "--quiet",
            "--out",
            &out,
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("error: the run stopped: step 22").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("shakespeare_reference_limits.shard:16:7"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A token stream under MPI: each of 2 processes reads its half of the id
/// scan and only its own examples' windows (process 0 the first 4 of a batch
/// of 8, process 1 the rest), so each reads a little over half of the file
/// (with the 4,096 ids `check` samples of a `.bin`), and the losses equal the
/// virtual mesh's bit for bit. A parquet source is converted by the first
/// process (the other waits, then reuses its uint32 stream). Bytes as each
/// process reports them (`data: process P of N read X of Y bytes`).
#[test]
fn each_process_reads_only_its_share_of_a_token_stream() {
    let _one = serial();
    let Some(bin) = mpi_shardc() else { return };
    for (source, id_bytes, sample) in [
        ("tests/fixtures/tokens/stream.bin", 2u64, 4096 * 2),
        ("tests/fixtures/tables/ids.parquet", 4, 0),
    ] {
        let dir = temp(&format!("stream{id_bytes}"));
        let file = dir.join("lm.shard");
        std::fs::write(
            &file,
            format!(
                "import nn\nmesh m(dp: 2)\nmodel LM {{\n  e = Embed(256, 16)\n  head = Dense(16 -> 256)\n  fn forward(ids: i32[B@dp, 16]) -> f32[B@dp, 16, 256] {{ head(e(ids)) }}\n}}\ntrain LM on m {{\n  data: tokens(path: \"{}\", seq: 16)\n  batch: 8, steps: 3, seed: 0, optimizer: adam(lr: 0.01)\n}}\n",
                root().join(source).display()
            ),
        )
        .expect("write");
        let f = file.display().to_string();
        let root_s = root().display().to_string();
        let (v, m) = (dir.join("v.json"), dir.join("m.json"));
        let args = |dump: &Path, out: &str| -> Vec<String> {
            vec![
                f.clone(),
                "--allow-path".into(),
                root_s.clone(),
                "--dump-losses".into(),
                dump.display().to_string(),
                "--out".into(),
                dir.join(out).display().to_string(),
            ]
        };
        let va = args(&v, "v");
        ok(
            "virtual",
            &virtual_run(&va.iter().map(String::as_str).collect::<Vec<_>>()),
        );
        let ma = args(&m, "m");
        let o = mpirun(
            &bin,
            2,
            false,
            &ma.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        ok("mpirun -np 2", &o);
        assert_eq!(
            loss_bits(&v),
            loss_bits(&m),
            "{source}: MPI losses differ from the virtual mesh's"
        );
        let err = String::from_utf8_lossy(&o.stderr);
        let total = 20_000 * id_bytes;
        let mut seen = Vec::new();
        // mpirun merges both processes' stderr, so one process's line may
        // start in the middle of the other's (a progress line written in
        // pieces): look for the report anywhere in a line.
        for line in err
            .lines()
            .filter_map(|l| l.find("data: process").map(|at| &l[at..]))
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            let p: usize = words[2].parse().expect("process");
            let read: u64 = words[6].parse().expect("bytes read");
            let all: u64 = words[8].parse().expect("bytes");
            assert_eq!(all, total, "{line}");
            // `check`'s sample, half of the scan before step 1, and
            // 3 steps x 4 examples x 17 ids.
            assert_eq!(read, sample + total / 2 + 3 * 4 * 17 * id_bytes, "{line}");
            seen.push(p);
        }
        seen.sort();
        assert_eq!(seen, vec![0, 1], "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--profile` under MPI: each process timed only its own stage's nodes;
/// the processes add their times up before the first writes `profile.json`,
/// so every node the virtual mesh timed is timed (a profile of process 0
/// alone would have no time for stage 1's blocks), and `shardc plan
/// --profile` takes it.
#[test]
fn an_mpi_run_writes_the_whole_runs_profile() {
    let _one = serial();
    let Some(bin) = mpi_shardc() else { return };
    let dir = temp("profile");
    let file = "tests/models/t3d_small.shard";
    let mesh = "dp=1,pp=2,tp=1";
    let args = |out: &str| -> Vec<String> {
        [
            file,
            "--mesh",
            mesh,
            "--steps",
            "3",
            "--quiet",
            "--profile",
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([dir.join(out).display().to_string()])
        .collect()
    };
    let va = args("v");
    ok(
        "virtual",
        &virtual_run(&va.iter().map(String::as_str).collect::<Vec<_>>()),
    );
    let ma = args("m");
    ok(
        "mpirun -np 2",
        &mpirun(
            &bin,
            2,
            false,
            &ma.iter().map(String::as_str).collect::<Vec<_>>(),
        ),
    );
    let timed = |run: &str| -> Vec<bool> {
        let path = dir.join(run).join("profile.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v: serde_json::Value = serde_json::from_str(&text).expect("profile JSON");
        v["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n[0].as_f64().unwrap_or(0.0) > 0.0)
            .collect()
    };
    let (v, m) = (timed("v"), timed("m"));
    assert!(v.iter().filter(|t| **t).count() > 10, "{v:?}");
    assert_eq!(v, m, "nodes with a forward time: virtual vs MPI");
    let plan = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(root())
        .args(["plan", file, "--mesh", mesh, "--profile"])
        .arg(dir.join("m").join("profile.json"))
        .output()
        .expect("spawn shardc plan");
    ok("plan --profile", &plan);
    assert!(String::from_utf8_lossy(&plan.stdout).contains("measured for its nodes"));
    let _ = std::fs::remove_dir_all(&dir);
}
