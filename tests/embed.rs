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
        required_buffer_size: vec![8 * a],
        id_drop_counters: vec![0, b % 2],
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
    let (merged, files) = (l.stats, l.files);
    assert_eq!(files.len(), 2);
    assert!(!files.contains(&old));
    let w = &merged["words"];
    assert_eq!(w.max_ids, vec![6, 11]);
    assert_eq!(w.max_unique_ids, vec![5, 10]);
    assert_eq!(w.required_buffer_size, vec![48]);
    assert_eq!(w.id_drop_counters, vec![0, 1]);
    let (limits, buffer) = embed::limits_from(w, 1.25, 4);
    assert_eq!(
        (limits.max_ids, limits.max_unique_ids, buffer),
        (14, 13, 192)
    );
    let shown = embed::render(&merged, &files);
    assert!(shown.contains("stack `words`"), "{shown}");
    // A one-process run takes only process 0's file: process 1's belongs to
    // another run (of more processes) that used this directory before.
    let l = embed::load_processes(&dir, Some(1), &Default::default()).expect("load");
    let (merged, files) = (l.stats, l.files);
    assert_eq!(files.len(), 1);
    assert_eq!(merged["words"].max_ids, vec![6, 9]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_or_corrupt_fdo_files_are_errors() {
    let dir = std::env::temp_dir().join(format!("shardc-fdo-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let e = embed::load(&dir).expect_err("missing");
    assert!(e.contains("cannot read"), "{e}");
    std::fs::create_dir_all(&dir).expect("dir");
    let e = embed::load(&dir).expect_err("empty");
    assert!(e.contains("no `fdo_stats_"), "{e}");
    std::fs::write(dir.join("fdo_stats_0_1.npz"), b"garbage").expect("write");
    let e = embed::load(&dir).expect_err("corrupt");
    assert!(e.contains("not a readable FDO file"), "{e}");
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
