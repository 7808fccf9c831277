//! SparseCore semantics on hand-computed cases: statistics, limits and their
//! overflow policies, stacking, and FDO files.

use shardc::embed::{self, FdoClient, Layout, Limits, Overflow, Partitioner, Stats, TableInfo};

const LOOSE: Limits = Limits {
    max_ids: 1 << 30,
    max_unique_ids: 1 << 30,
};

/// SparseCore's documented example: 1 device × 2 SparseCores, batch 2, the first
/// sample's ids [0,0,0,2,4,1], the second's [1,1,1,3,3,5,5,7,7,0]: ragged, so the
/// first is padded to valency 10 with -1 (padding is not looked up).
#[test]
fn documented_example_max_ids_per_partition() {
    let ids: Vec<i64> = [0, 0, 0, 2, 4, 1, -1, -1, -1, -1]
        .into_iter()
        .chain([1, 1, 1, 3, 3, 5, 5, 7, 7, 0])
        .collect();
    let mut limits = LOOSE;
    let p = embed::preprocess(
        &ids,
        10,
        Layout {
            devices: 1,
            sparsecores: 2,
        },
        Partitioner { n: 2, shift: 0 },
        &mut limits,
        Overflow::Error,
    )
    .expect("within limits");
    assert_eq!(p.stats.max_ids, vec![3, 4]);
    assert_eq!(p.stats.max_unique_ids, vec![3, 4]);
    // SparseCore 0 sends 3 + 1 ids, SparseCore 1 sends 1 + 4: each rounded up to 8.
    assert_eq!(p.stats.required_buffer_size, vec![16, 16]);
    assert_eq!(p.stats.id_drop_counters, vec![0, 0]);
}

#[test]
fn mod_placement_with_a_shift() {
    let p = Partitioner { n: 32, shift: 4 };
    assert_eq!(p.partition(0), 4);
    assert_eq!(p.partition(29), 1);
    assert_eq!(p.local_row(29), 0);
    assert_eq!(p.local_row(70), 2);
}

/// Two samples on one SparseCore: merged pairs count per sample, unique ids across.
#[test]
fn unique_ids_count_across_samples() {
    let ids = [5i64, 5, 7, 5, 7, 9];
    let mut limits = LOOSE;
    let p = embed::preprocess(
        &ids,
        3,
        Layout {
            devices: 1,
            sparsecores: 1,
        },
        Partitioner { n: 2, shift: 0 },
        &mut limits,
        Overflow::Error,
    )
    .expect("ok");
    // Partition 1 gets (5,s0), (7,s0), (5,s1), (7,s1), (9,s1): 5 pairs, 3 distinct.
    assert_eq!(p.stats.max_ids, vec![0, 5]);
    assert_eq!(p.stats.max_unique_ids, vec![0, 3]);
    assert_eq!(p.stats.required_buffer_size, vec![8]);
}

#[test]
fn error_policy_names_device_sparsecore_partition_and_counts() {
    let ids = [1i64, 3, 5, 7, 9, 11];
    let mut limits = Limits {
        max_ids: 4,
        max_unique_ids: 4,
    };
    let e = embed::preprocess(
        &ids,
        1,
        Layout {
            devices: 1,
            sparsecores: 1,
        },
        Partitioner { n: 2, shift: 0 },
        &mut limits,
        Overflow::Error,
    )
    .expect_err("over the limit");
    assert_eq!((e.device, e.sparsecore, e.partition), (0, 0, 1));
    assert_eq!((e.observed, e.limit), (6, 4));
}

/// `drop` keeps the first ids in sorted order and counts the rest; `grow` raises
/// the limit and keeps everything.
#[test]
fn drop_keeps_the_smallest_ids_and_grow_raises_the_limit() {
    let ids = [9i64, 1, 7, 3, 5, 11];
    let layout = Layout {
        devices: 1,
        sparsecores: 1,
    };
    let part = Partitioner { n: 2, shift: 0 };
    let mut limits = Limits {
        max_ids: 4,
        max_unique_ids: 4,
    };
    let p = embed::preprocess(&ids, 1, layout, part, &mut limits, Overflow::Drop).expect("drop");
    assert_eq!(p.keep, vec![false, true, true, true, true, false]);
    assert_eq!(p.stats.id_drop_counters, vec![0, 2]);
    assert_eq!(
        p.stats.max_ids,
        vec![0, 6],
        "statistics show what was needed"
    );
    assert_eq!(limits.max_ids, 4);
    let p = embed::preprocess(&ids, 1, layout, part, &mut limits, Overflow::Grow).expect("grow");
    assert!(p.keep.iter().all(|k| *k));
    assert_eq!(limits.max_ids, 6);
    assert_eq!(p.exceeded.len(), 2, "both limits were exceeded and logged");
}

/// Three tables on 2 devices × 4 SparseCores (8 partitions): dims padded to 16,
/// vocabularies to multiples of 64, offsets in shard 0 / 16 / 24, rotations 0 / 4 / 0.
/// A fourth table with another optimizer gets a stack of its own.
#[test]
fn three_tables_stack_with_offsets_and_rotations() {
    let t = |name: &str, vocab, dim, opt: &str| TableInfo {
        name: name.into(),
        vocab,
        dim,
        optimizer: opt.into(),
        combiner: "sum".into(),
        activation_bytes: 1000.0,
    };
    let stacks = embed::stack(
        &[
            t("a", 100, 10, "adam"),
            t("b", 64, 16, "adam"),
            t("d", 50, 16, "sgd"),
            t("c", 30, 13, "adam"),
        ],
        8,
        4,
        None,
    );
    assert_eq!(stacks.len(), 2);
    let s = &stacks[0];
    assert_eq!(s.name, "a_b_c");
    assert_eq!(s.dim, 16);
    let got: Vec<(usize, usize, usize)> = s
        .tables
        .iter()
        .map(|t| (t.padded_vocab, t.row_offset_in_shard, t.shard_rotation))
        .collect();
    assert_eq!(got, vec![(128, 0, 0), (64, 16, 4), (64, 24, 0)]);
    assert_eq!(s.rows_per_shard(), 32);
    // b's id 10: partition (10 + 4) % 8 = 6, row 16 + 10 / 8 = 17.
    assert_eq!(s.place("b", 10), Some((6, 17)));
    assert_eq!(stacks[1].name, "d");
    // An activation limit splits the compatible tables.
    let limited = embed::stack(
        &[t("a", 100, 10, "adam"), t("b", 64, 16, "adam")],
        8,
        4,
        Some(1500.0),
    );
    assert_eq!(limited.len(), 2);
}

fn stats(a: i64, b: i64) -> Stats {
    Stats {
        max_ids: vec![a, b],
        max_unique_ids: vec![a - 1, b - 1],
        required_buffer_size: vec![8 * a, 8 * b],
        id_drop_counters: vec![0, b % 2],
        ..Default::default()
    }
}

/// Publish then load: the newest file per process, merged by element-wise max, and
/// the limits FDO derives (with headroom) from them.
#[test]
fn fdo_publish_load_round_trip_and_max_merge() {
    let dir = std::env::temp_dir().join(format!("shardc-fdo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut p0 = FdoClient::new(&dir, 0);
    p0.record("words", &stats(3, 9));
    p0.record("words", &stats(5, 2));
    let old = p0.publish().expect("publish");
    let mut p1 = FdoClient::new(&dir, 1);
    p1.record("words", &stats(4, 11));
    p1.publish().expect("publish");
    // A later file of process 0 supersedes its first one.
    std::thread::sleep(std::time::Duration::from_millis(2));
    p0.record("words", &stats(6, 1));
    p0.publish().expect("publish");
    let l = embed::load(&dir).expect("load");
    assert_eq!(l.files.len(), 2);
    assert!(!l.files.contains(&old));
    let w = &l.stats["words"];
    assert_eq!(w.max_ids, vec![6, 11]);
    assert_eq!(w.max_unique_ids, vec![5, 10]);
    assert_eq!(w.required_buffer_size, vec![48, 88]);
    // Process 0's file holds its three steps, one row each: drops 1, 0, 1.
    let f0 = &l.per_file[0]["words"];
    assert_eq!((f0.steps, f0.devices, f0.partitions), (Some(3), 1, 2));
    assert_eq!(f0.dropped_per_step, vec![1, 0, 1]);
    let (limits, buffer) = embed::limits_from(w, 1.25, 4);
    assert_eq!(
        (limits.max_ids, limits.max_unique_ids, buffer),
        (14, 13, 352)
    );
    let shown = embed::render(&l);
    assert!(shown.contains("stack `words`: 3 step(s)"), "{shown}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_fdo_directory_is_an_error_and_a_corrupt_file_is_skipped() {
    let dir = std::env::temp_dir().join(format!("shardc-fdo-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let e = embed::load(&dir).expect_err("missing");
    assert!(e.contains("cannot read"), "{e}");
    std::fs::create_dir_all(&dir).expect("dir");
    let e = embed::load(&dir).expect_err("empty");
    assert!(e.contains("no `fdo_stats_"), "{e}");
    // A file that cannot be read is skipped with a warning naming it: other
    // processes write into this directory, and the limits stay as they were.
    std::fs::write(dir.join("fdo_stats_0_1.npz"), b"garbage").expect("write");
    let l = embed::load(&dir).expect("a corrupt file is skipped");
    let w = l.warnings.join("\n");
    assert!(
        w.contains("fdo_stats_0_1.npz` is not a readable FDO file"),
        "{w}"
    );
    assert_eq!(l.refused.len(), 1);
    assert!(l.files.is_empty() && l.stats.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Feature stacking: two features of one table on one SparseCore count together
/// per partition (their samples one after the other), while a sample's duplicate
/// ids merge only within that feature's sample; a second table's equal ids stay
/// distinct.
#[test]
fn stacked_features_count_together() {
    let part = Partitioner { n: 2, shift: 0 };
    let layout = Layout {
        devices: 1,
        sparsecores: 1,
    };
    let a = [2i64, 2, 4, 6];
    let b = [2i64, 8];
    let c = [2i64, 3];
    let mut limits = LOOSE;
    let (stats, keep, _) = embed::preprocess_stack(
        &[
            embed::Feature {
                ids: &a,
                valency: 2,
                part,
                table: 0,
            },
            embed::Feature {
                ids: &b,
                valency: 1,
                part,
                table: 0,
            },
            embed::Feature {
                ids: &c,
                valency: 1,
                part: Partitioner { n: 2, shift: 1 },
                table: 1,
            },
        ],
        layout,
        &mut limits,
        Overflow::Error,
    )
    .expect("ok");
    // Partition 0: a gives (2,s0), (4,s1), (6,s1); b gives (2), (8); c's 3 lands
    // there with shift 1: six pairs, distinct (table, id): 2, 4, 6, 8 of table 0
    // and 3 of table 1.
    assert_eq!(stats.max_ids, vec![6, 1]);
    assert_eq!(stats.max_unique_ids, vec![5, 1]);
    assert_eq!(keep.len(), 3);
}

// Issue 19: the library's semantics, one test per point, on hand-computed cases.

use shardc::embed::Combiner;
use shardc::runtime::sparse::{self, Fdo, Host, LookupRun, Planned, SparseConfig, TableRun};

const ONE_SC: Layout = Layout {
    devices: 1,
    sparsecores: 1,
};

fn temp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-embed-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// Point 1: a dropped (sample, id) pair counts every occurrence of the id in
/// its sample. One SparseCore, 2 partitions (all ids odd: partition 1), ragged
/// samples padded with -1: s0 = [1, 1, 3], s1 = [3, 5, 5, 5], s2 = [7]. Pairs
/// in order: (1,s0) (3,s0) (3,s1) (5,s1) (7,s2); the first 3 are kept, (5,s1)
/// drops 3 occurrences and (7,s2) one: 4 dropped ids (2 merged pairs).
#[test]
fn drop_counts_every_occurrence_of_a_dropped_pair() {
    let ids = [1i64, 1, 3, -1, 3, 5, 5, 5, 7, -1, -1, -1];
    let mut limits = Limits {
        max_ids: 3,
        max_unique_ids: 10,
    };
    let part = Partitioner { n: 2, shift: 0 };
    let p = embed::preprocess(&ids, 4, ONE_SC, part, &mut limits, Overflow::Drop).expect("drop");
    assert_eq!(p.stats.id_drop_counters, vec![0, 4]);
    assert_eq!(p.stats.dropped(), 4);
    assert_eq!(
        (p.stats.max_ids.clone(), p.stats.max_unique_ids.clone()),
        (vec![0, 5], vec![0, 4])
    );
    let kept: Vec<bool> = ids.iter().map(|&i| i != 5 && i != 7).collect();
    assert_eq!(p.keep, kept);
    assert_eq!(p.exceeded.len(), 1);
    assert_eq!(p.exceeded[0].dropped, 4);
}

/// Point 2: mean and sqrtn keep the whole sample's normaliser for the kept ids.
/// Weights [1, 2, 3] with the second dropped: mean 1/6, 0, 3/6 (not 1/4, 0,
/// 3/4); sqrtn 1/√14, 0, 3/√14; sum 1, 0, 3. Padding (weight 0) counts nothing.
#[test]
fn mean_and_sqrtn_keep_the_whole_samples_normaliser() {
    let w = [1.0, 2.0, 3.0, 0.0];
    let kept = [true, false, true, true];
    let close = |a: Vec<f64>, b: [f64; 4]| {
        assert!(
            a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12),
            "{a:?} vs {b:?}"
        );
    };
    close(Combiner::Mean.gains(&w, &kept), [1.0 / 6.0, 0.0, 0.5, 0.0]);
    let r = 14f64.sqrt();
    close(
        Combiner::Sqrtn.gains(&w, &kept),
        [1.0 / r, 0.0, 3.0 / r, 0.0],
    );
    close(Combiner::Sum.gains(&w, &kept), [1.0, 0.0, 3.0, 0.0]);
    // Repeated ids count per occurrence: [5, 5, 7] with unit weights, 7 dropped.
    close(
        Combiner::Sqrtn.gains(&[1.0, 1.0, 1.0, 0.0], &[true, true, false, true]),
        [1.0 / 3f64.sqrt(), 1.0 / 3f64.sqrt(), 0.0, 0.0],
    );
}

/// Point 3: `max_unique_ids_per_partition` above `max_ids_per_partition` is
/// accepted (no E0401), and whichever limit is smaller binds first.
#[test]
fn unique_limit_above_the_id_limit_is_accepted_and_the_smaller_binds() {
    let dir = temp("unique");
    let file = dir.join("t.shard");
    std::fs::write(
        &file,
        "mesh tpu(device: 8) { sparsecores: 4 }\ntable words {\n  vocab: 2048, dim: 16\n  max_ids_per_partition: 64\n  max_unique_ids_per_partition: 128\n  shard: rows(device)\n}\n",
    )
    .expect("w");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["check".as_ref(), file.as_os_str()])
        .output()
        .expect("shardc");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("E0401"), "{err}");
    // s0 = [1, 3], s1 = [1, 5], s2 = [3, 7]: pairs (1,s0) (1,s1) (3,s0) (3,s2)
    // (5,s1) (7,s2). Ids 2, distinct 10: the id limit keeps the first two.
    let ids = [1i64, 3, 1, 5, 3, 7];
    let part = Partitioner { n: 1, shift: 0 };
    let mut l = Limits {
        max_ids: 2,
        max_unique_ids: 10,
    };
    let p = embed::preprocess(&ids, 2, ONE_SC, part, &mut l, Overflow::Drop).expect("drop");
    assert_eq!(p.keep, vec![true, false, true, false, false, false]);
    // Ids 5, distinct 2: ids 1 and 3 are admitted, all four of their pairs kept.
    let mut l = Limits {
        max_ids: 5,
        max_unique_ids: 2,
    };
    let p = embed::preprocess(&ids, 2, ONE_SC, part, &mut l, Overflow::Drop).expect("drop");
    assert_eq!(p.keep, vec![true, true, true, false, true, false]);
    assert_eq!(p.stats.dropped(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

fn table(
    name: &str,
    stack: &str,
    layout: Layout,
    n: usize,
    limits: Limits,
    policy: Overflow,
) -> TableRun {
    TableRun {
        name: name.into(),
        stack: stack.into(),
        layout,
        part: Partitioner { n, shift: 0 },
        limits,
        policy,
        stack_limits: (None, None),
    }
}

fn plan(cfg: &SparseConfig, steps: usize, ids: &dyn Fn(usize, usize) -> Vec<f64>) -> Planned {
    let barrier = || Ok(());
    let host = Host {
        process: 0,
        processes: 1,
        barrier: &barrier,
    };
    sparse::plan_steps(cfg, steps, 0, &host, ids).expect("plan")
}

/// Point 4: a two-table stack keeps the stack's own limits (256/256 unless
/// `stack_max_*` says otherwise), not the sum of its tables' (16 + 16 = 32).
/// Each table's feature sends 20 distinct ids to the one partition: 40 in all.
#[test]
fn two_table_stack_takes_the_stack_limits() {
    let small = Limits {
        max_ids: 16,
        max_unique_ids: 16,
    };
    let mut cfg = SparseConfig {
        tables: vec![
            table("a", "a_b", ONE_SC, 1, small, Overflow::Error),
            table("b", "a_b", ONE_SC, 1, small, Overflow::Error),
        ],
        lookups: vec![
            LookupRun {
                node: 0,
                input: 0,
                valency: 1,
                table: 0,
            },
            LookupRun {
                node: 1,
                input: 1,
                valency: 1,
                table: 1,
            },
        ],
        fdo: None,
        sparsecores: 1,
    };
    let both: Vec<&TableRun> = cfg.tables.iter().collect();
    assert_eq!(
        sparse::stack_limits(&both),
        Limits {
            max_ids: 256,
            max_unique_ids: 256
        }
    );
    assert_eq!(
        sparse::stack_limits(&both[..1]),
        small,
        "a table alone keeps its own"
    );
    let ids = |_: usize, _: usize| (0..20).map(f64::from).collect::<Vec<f64>>();
    let p = plan(&cfg, 2, &ids);
    assert!(p.stop.is_none() && p.steps.len() == 2);
    cfg.tables[1].stack_limits = (Some(39), None);
    let p = plan(&cfg, 2, &ids);
    let e = p.stop.expect("over 39");
    assert_eq!(e.step, Some(1));
    assert!(
        e.message()
            .contains("sends 40 ids to partition 0, over `max_ids_per_partition: 39`")
            && e.message().contains("stack `a_b` of 2 tables"),
        "{}",
        e.message()
    );
    assert!(matches!(e.fault, shardc::fault::Fault::Data(_)));
}

/// Per-device statistics: 2 devices × 2 SparseCores, 4 partitions, valency 1,
/// 8 samples (2 per SparseCore): SparseCore k of device d gets samples 2(2d+k)
/// and 2(2d+k)+1, here ids [0, 4 | 1, 1 | 2, 6 | 8, 12].
#[test]
fn per_device_statistics_are_the_max_over_the_devices_sparsecores() {
    let ids = [0i64, 4, 1, 1, 2, 6, 8, 12];
    let layout = Layout {
        devices: 2,
        sparsecores: 2,
    };
    let mut l = LOOSE;
    let p = embed::preprocess(
        &ids,
        1,
        layout,
        Partitioner { n: 4, shift: 0 },
        &mut l,
        Overflow::Error,
    )
    .expect("ok");
    // Device 0: SC 0 sends 0, 4 to partition 0; SC 1 sends 1 (two samples) to
    // partition 1. Device 1: SC 0 sends 2, 6 to partition 2; SC 1 sends 8, 12
    // to partition 0.
    assert_eq!(p.stats.device_max_ids, vec![2, 2, 0, 0, 2, 0, 2, 0]);
    assert_eq!(p.stats.device_max_unique_ids, vec![2, 1, 0, 0, 2, 0, 2, 0]);
    assert_eq!(p.stats.max_ids, vec![2, 2, 2, 0]);
    assert_eq!(p.stats.required_buffer_size, vec![8, 8, 8, 8]);
}

/// Point 5: the file's keys, dtypes and per-step shapes are the library's, and
/// drops are kept per step (14 at one step and 17 at a later one: 31).
#[test]
fn fdo_files_have_the_librarys_keys_dtypes_and_per_step_shapes() {
    let dir = temp("layout");
    let layout = Layout {
        devices: 2,
        sparsecores: 2,
    };
    let part = Partitioner { n: 4, shift: 0 };
    let mut client = FdoClient::new(&dir, 0);
    for step in 0..3 {
        let ids: Vec<i64> = (0..8).map(|i| i * (step + 1)).collect();
        let mut l = LOOSE;
        let p = embed::preprocess(&ids, 1, layout, part, &mut l, Overflow::Error).expect("ok");
        let mut s = p.stats;
        s.id_drop_counters = match step {
            0 => vec![14, 0, 0, 0],
            2 => vec![0, 9, 8, 0],
            _ => vec![0; 4],
        };
        client.record("s", &s);
    }
    let path = client.publish().expect("publish");
    let arrays = shardc::arrays::read_file(&path, 1 << 20).expect("read");
    let got: Vec<(String, &str, Vec<usize>)> = arrays
        .iter()
        .map(|a| (a.name.clone(), a.dtype, a.shape.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("s_id_drop_counters".to_string(), "int64", vec![3, 1]),
            ("s_max_ids".to_string(), "int32", vec![3, 8]),
            ("s_max_unique_ids".to_string(), "int32", vec![3, 8]),
            ("s_required_buffer_size".to_string(), "int32", vec![3, 4]),
        ]
    );
    assert_eq!(
        arrays[0].values,
        shardc::arrays::Values::I64(vec![14, 0, 17])
    );
    let l = embed::load(&dir).expect("load");
    let f = &l.per_file[0]["s"];
    assert_eq!(
        (f.steps, f.devices, f.partitions, f.dropped()),
        (Some(3), 2, 4, 31)
    );
    let shown = embed::render(&l);
    assert!(
        shown.contains("31 ids dropped in all (most in one step: 17, row 2)"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Point 6: under `overflow: error` the plan ends at the step over the limit;
/// the steps before it are trained. One sample of 3 ids a step: [0, 1, 1]
/// merges to 2 pairs, which fit; step 3's [0, 1, 2] needs 3.
#[test]
fn overflow_error_stops_the_plan_at_the_failing_step() {
    let two = Limits {
        max_ids: 2,
        max_unique_ids: 2,
    };
    let cfg = SparseConfig {
        tables: vec![table("t", "t", ONE_SC, 1, two, Overflow::Error)],
        lookups: vec![LookupRun {
            node: 0,
            input: 0,
            valency: 3,
            table: 0,
        }],
        fdo: None,
        sparsecores: 1,
    };
    let ids = |s: usize, _: usize| {
        if s == 2 {
            vec![0.0, 1.0, 2.0]
        } else {
            vec![0.0, 1.0, 1.0]
        }
    };
    let p = plan(&cfg, 4, &ids);
    assert_eq!(p.steps.len(), 2);
    assert_eq!(p.end(4), 2);
    assert_eq!(p.stop.as_ref().and_then(|e| e.step), Some(3));
}

/// Point 6 on the seed-000 model with the reference's own limits: the run
/// trains every step before the first one over the FDO-set limit, writes their
/// metrics (and the FDO file of step 15), then stops with the diagnostic.
#[test]
fn reference_limits_train_up_to_the_failing_step_then_stop() {
    let dir = temp("reflim");
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args([
            "run",
            &format!("{root}/examples/shakespeare_reference_limits.shard"),
            "--out",
        ])
        .arg(&dir)
        .output()
        .expect("shardc");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let step = err
        .split("error: the run stopped: step ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .and_then(|n| n.parse::<usize>().ok())
        .expect("a step");
    assert!(step > 15, "FDO set the limit after step 15: {err}");
    assert!(
        err.contains("over `max_ids_per_partition: 36` (set by FDO after step 15)"),
        "{err}"
    );
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics");
    // The configuration's line, then one per step.
    assert_eq!(metrics.lines().count(), step, "{metrics}");
    assert!(metrics.starts_with("{\"config\":"), "{metrics}");
    let fdo: Vec<_> = std::fs::read_dir(dir.join("fdo")).expect("fdo").collect();
    assert_eq!(fdo.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Point 7: `shardc fdo show` on files the library wrote (the fixture from
/// `scripts/fdo_fixture.py`: one host of 2 devices × 4 SparseCores). Process
/// 0's file has 3 steps; device d sent partition p at most base + d + p ids
/// with base 3, 5, 4: per partition 6 + p (max 13), distinct (6 + p) / 2 (max
/// 6), buffer 40, drops 14 + 0 + 17. Process 1's has one step (1-D rows, a
/// scalar drop count): base 2, max 10, 3 dropped.
#[test]
fn fdo_show_prints_library_written_files() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["fdo", "show", &format!("{root}/tests/fixtures/fdo_library")])
        .output()
        .expect("shardc");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "stack `words`: 3 step(s), 2 device(s) × 8 partitions, 8 SparseCores",
        "stack `words`: 1 step(s), 2 device(s) × 8 partitions, 8 SparseCores",
        "        7       13               6",
        "required buffer: 40 per SparseCore at most; 31 ids dropped in all (most in one step: 17, row 2)",
        "required buffer: 16 per SparseCore at most; 3 ids dropped in all (most in one step: 3, row 0)",
        "          1   6   7   8   9  10  11  12  13",
        "limits loaded for stack `words` (maxima over 2 file(s)): max_ids_per_partition 13, max_unique_ids_per_partition 6",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert!(
        !text.contains("25600") && !text.contains("48 partitions"),
        "{text}"
    );
}

/// Point 8: a run loads the newest file of every process in the directory, as
/// the library's client does: its own newest, and another process's (here a
/// library-written one), whatever the run's process count; older files of a
/// process are passed over.
#[test]
fn a_run_loads_the_newest_file_of_every_process() {
    let dir = temp("loading");
    let root = env!("CARGO_MANIFEST_DIR");
    for f in [
        "fdo_stats_0_1700000000000000000.npz",
        "fdo_stats_1_1700000000000000001.npz",
    ] {
        std::fs::copy(
            format!("{root}/tests/fixtures/fdo_library/{f}"),
            dir.join(f),
        )
        .expect("copy");
    }
    let mut own = FdoClient::new(&dir, 0);
    own.record("words", &stats(1, 2));
    let mine = own.publish().expect("publish");
    let l = embed::load(&dir).expect("load");
    let lib1 = dir.join("fdo_stats_1_1700000000000000001.npz");
    assert_eq!(l.files, vec![mine, lib1]);
    // Process 1's library file (max 10) and the run's own (max 2).
    assert_eq!(l.stats["words"].max_ids.iter().max(), Some(&10));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Point 9: a partition over both limits logs its drop once, with the number
/// actually dropped. Ids 1..7 in one partition, limits 4 ids and 3 distinct:
/// 3 kept, 4 dropped (not 3 + 4 = 7).
#[test]
fn a_drop_past_both_limits_is_logged_once() {
    let lim = Limits {
        max_ids: 4,
        max_unique_ids: 3,
    };
    let cfg = SparseConfig {
        tables: vec![table("t", "t", ONE_SC, 1, lim, Overflow::Drop)],
        lookups: vec![LookupRun {
            node: 0,
            input: 0,
            valency: 1,
            table: 0,
        }],
        fdo: None,
        sparsecores: 1,
    };
    let ids = |_: usize, _: usize| (1..8).map(f64::from).collect::<Vec<f64>>();
    let p = plan(&cfg, 1, &ids);
    let notes = &p.steps[0].notes;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("needs 7 ids (`max_ids_per_partition: 4`) and 7 distinct ids (`max_unique_ids_per_partition: 3`) in partition 0: dropped 4 ids"),
        "{notes:?}"
    );
    assert_eq!(p.steps[0].keep[&0], vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
}

/// FDO in a run with `overflow: drop`: the published file's drop counters are
/// per step (a drop at a known step: step 2 of 3 drops 2 ids).
#[test]
fn a_drop_at_a_known_step_is_published_in_its_row() {
    let dir = temp("known");
    let lim = Limits {
        max_ids: 3,
        max_unique_ids: 3,
    };
    let cfg = SparseConfig {
        tables: vec![table("t", "t", ONE_SC, 1, lim, Overflow::Drop)],
        lookups: vec![LookupRun {
            node: 0,
            input: 0,
            valency: 1,
            table: 0,
        }],
        fdo: Some(Fdo {
            every: 3,
            dir: dir.clone(),
            headroom: 1.0,
        }),
        sparsecores: 1,
    };
    let ids = |s: usize, _: usize| {
        if s == 1 {
            vec![1.0, 2.0, 3.0, 4.0, 5.0]
        } else {
            vec![1.0, 2.0]
        }
    };
    let p = plan(&cfg, 3, &ids);
    assert!(
        p.steps[2].notes.iter().any(|n| n.contains("published")),
        "{:?}",
        p.steps[2].notes
    );
    let l = embed::load(&dir).expect("load");
    assert_eq!(l.per_file[0]["t"].dropped_per_step, vec![0, 2, 0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Point 4, exposed: `shardc plan` shows the limits a stack starts with. Two
/// tables of 16 / 16 share a stack; one states `stack_max_ids_per_partition:
/// 100`, so the stack starts at 100 / 100 (not 32, nor 16).
#[test]
fn plan_shows_the_stack_level_limits() {
    let dir = temp("planlimits");
    let file = dir.join("two.shard");
    std::fs::write(
        &file,
        "import nn\nmesh tpu(device: 8) { sparsecores: 4 }\n\
         table words { vocab: 2048, dim: 16, max_ids_per_partition: 16, max_unique_ids_per_partition: 16, shard: rows(device) }\n\
         table tags { vocab: 512, dim: 16, max_ids_per_partition: 16, max_unique_ids_per_partition: 16, stack_max_ids_per_partition: 100, shard: rows(device) }\n\
         feature context: i32[B * 16, 1] -> words\n\
         model M {\n  out = Dense(16 * 16 -> 2048)\n  fn forward(ids: i32[B@device, 16]) -> f32[B@device, 2048] {\n    out(reshape(lookup(context, ids), [B@device, 16 * 16]))\n  }\n}\n\
         train M on tpu { data: shakespeare_words(vocab: 2048, seq: 16), batch: 256, steps: 1, loss: softmax_cross_entropy, optimizer: adam(lr: 0.005) }\n",
    )
    .expect("w");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["plan".as_ref(), file.as_os_str()])
        .output()
        .expect("shardc");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("embedding stack `words_tags`")
            && text.contains("limits: max_ids_per_partition 100, max_unique_ids_per_partition 100 (the stack's own"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
