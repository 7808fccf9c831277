//! SparseCore semantics of embedding tables, on the host: MOD partitioning, table
//! stacking, per-step input statistics, limits with their overflow policies, and
//! FDO (record, publish to a directory as `.npz`, load merged by maximum, raise the
//! limits; files named in the future are ignored and statistics are sanity-checked
//! before they set limits). These follow the JAX SparseCore library where it is
//! well defined; where it aborts the process, these return data the caller turns
//! into a diagnostic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// MOD row placement over `n` partitions: id `i` lives in partition `(i + shift) % n`
/// at row `i / n` of that partition's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partitioner {
    pub n: usize,
    pub shift: usize,
}

impl Partitioner {
    pub fn partition(&self, id: u64) -> usize {
        ((id + self.shift as u64) % self.n.max(1) as u64) as usize
    }
    pub fn local_row(&self, id: u64) -> usize {
        (id / self.n.max(1) as u64) as usize
    }
}

/// What happens when a step needs more ids in a partition than the limit allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Stop with a diagnostic (JAX aborts the process).
    Error,
    /// Keep the first ids in sorted order, drop the rest, count them.
    Drop,
    /// Raise the limit to what the step needs and continue (logged and counted).
    Grow,
}

impl Overflow {
    pub fn parse(s: &str) -> Option<Overflow> {
        match s {
            "error" => Some(Overflow::Error),
            "drop" => Some(Overflow::Drop),
            "grow" => Some(Overflow::Grow),
            _ => None,
        }
    }
}

/// How a feature row's looked-up rows are combined (TensorFlow's combiners),
/// over its valid ids with weights w: `sum` Σ w·row, `mean` Σ w·row / Σ w,
/// `sqrtn` Σ w·row / √Σ w².
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Combiner {
    #[default]
    Sum,
    Mean,
    Sqrtn,
}

impl Combiner {
    pub fn parse(s: &str) -> Option<Combiner> {
        match s {
            "sum" => Some(Combiner::Sum),
            "mean" => Some(Combiner::Mean),
            "sqrtn" => Some(Combiner::Sqrtn),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Combiner::Sum => "sum",
            Combiner::Mean => "mean",
            Combiner::Sqrtn => "sqrtn",
        }
    }
    /// Each id's factor, given its sample's effective weights (0 when the sample
    /// has none).
    pub fn factor(self, eff: &[f64]) -> f64 {
        let c = match self {
            Combiner::Mean => 1.0 / eff.iter().sum::<f64>(),
            Combiner::Sqrtn => 1.0 / eff.iter().map(|x| x * x).sum::<f64>().sqrt(),
            Combiner::Sum => 1.0,
        };
        if c.is_finite() {
            c
        } else {
            0.0
        }
    }
}

/// Where a table's rows live: MOD over `devices × sparsecores` partitions when
/// the (global) vocabulary divides evenly, else contiguous blocks per device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub vocab: usize,
    /// Devices along the table's axis.
    pub devices: usize,
    pub sparsecores: usize,
    pub part: Partitioner,
    pub mod_rows: bool,
}

impl Placement {
    pub fn rows_per_device(&self) -> usize {
        self.vocab / self.devices.max(1)
    }
    /// (owning device's index along the axis, row in its shard) of an id.
    pub fn locate(&self, id: u64) -> (usize, usize) {
        if !self.mod_rows {
            let r = self.rows_per_device().max(1);
            return (id as usize / r, id as usize % r);
        }
        let p = self.part.partition(id);
        let rpp = self.vocab / self.part.n.max(1);
        let sc = self.sparsecores.max(1);
        (p / sc, (p % sc) * rpp + self.part.local_row(id))
    }
    /// The id stored at `row` of device `owner`'s shard (the inverse of `locate`).
    pub fn id_at(&self, owner: usize, row: usize) -> u64 {
        if !self.mod_rows {
            return (owner * self.rows_per_device() + row) as u64;
        }
        let n = self.part.n.max(1);
        let rpp = self.vocab / n;
        let sc = self.sparsecores.max(1);
        let (k, j) = (row / rpp.max(1), row % rpp.max(1));
        let p = owner * sc + k;
        let q = (p as i64 - self.part.shift as i64).rem_euclid(n as i64) as u64;
        j as u64 * n as u64 + q
    }
}

/// Per-stack input statistics of one step (or the maximum over several).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Per partition: the most ids one SparseCore sends it, after merging duplicate
    /// (sample, id) pairs.
    pub max_ids: Vec<i64>,
    /// Per partition: the most distinct ids one SparseCore sends it.
    pub max_unique_ids: Vec<i64>,
    /// Per SparseCore: the sum over partitions of its id counts, each rounded up to 8.
    pub required_buffer_size: Vec<i64>,
    /// Per partition: ids dropped by `overflow: drop`.
    pub id_drop_counters: Vec<i64>,
}

impl Stats {
    /// Element-wise maximum (how FDO merges steps and processes).
    pub fn merge_max(&mut self, o: &Stats) {
        fn m(a: &mut Vec<i64>, b: &[i64]) {
            if a.len() < b.len() {
                a.resize(b.len(), 0);
            }
            for (x, y) in a.iter_mut().zip(b) {
                *x = (*x).max(*y);
            }
        }
        m(&mut self.max_ids, &o.max_ids);
        m(&mut self.max_unique_ids, &o.max_unique_ids);
        m(&mut self.required_buffer_size, &o.required_buffer_size);
        m(&mut self.id_drop_counters, &o.id_drop_counters);
    }
}

/// A table's current limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_ids: i64,
    pub max_unique_ids: i64,
}

/// A limit a step exceeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    pub device: usize,
    pub sparsecore: usize,
    pub partition: usize,
    /// `max_ids_per_partition` or `max_unique_ids_per_partition`.
    pub limit_name: &'static str,
    pub observed: i64,
    pub limit: i64,
}

/// The result of preprocessing one feature's ids for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Preprocessed {
    pub stats: Stats,
    /// Per id position: false where `overflow: drop` dropped it.
    pub keep: Vec<bool>,
    /// Limits a `grow` or `drop` step exceeded (for the log).
    pub exceeded: Vec<Exceeded>,
}

/// SparseCores and devices a feature's samples are spread over: the global batch is
/// split into `devices` contiguous pieces, each into `sparsecores` pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub devices: usize,
    pub sparsecores: usize,
}

impl Layout {
    pub fn sources(&self) -> usize {
        self.devices.max(1) * self.sparsecores.max(1)
    }
}

/// Statistics of one step's ids (`ids` row-major `[samples, valency]`; negative
/// ids pad ragged samples and are not looked up), and the limits applied with
/// `policy`. `limits` is raised in place under `grow`; under `error` the first
/// limit exceeded is returned as `Err`.
pub fn preprocess(
    ids: &[i64],
    valency: usize,
    layout: Layout,
    part: Partitioner,
    limits: &mut Limits,
    policy: Overflow,
) -> Result<Preprocessed, Exceeded> {
    let (stats, mut keep, exceeded) = preprocess_stack(
        &[Feature {
            ids,
            valency,
            part,
            table: 0,
        }],
        layout,
        limits,
        policy,
    )?;
    Ok(Preprocessed {
        stats,
        keep: keep.pop().unwrap_or_default(),
        exceeded,
    })
}

/// One feature's ids in a stack: `[samples, valency]`, placed by its table's
/// partitioner (its shard rotation).
#[derive(Clone, Copy, Debug)]
pub struct Feature<'a> {
    pub ids: &'a [i64],
    pub valency: usize,
    pub part: Partitioner,
    /// Which table of the stack (ids of different tables never merge).
    pub table: usize,
}

/// Several features looked up in one stack (feature stacking): each SparseCore
/// takes its block of every feature's samples, one after the other (feature k's
/// samples offset by those before it), and its (sample, table, id) triples are
/// counted per partition against the stack's limits. Returns the statistics, a
/// keep mask per feature, and the limits exceeded under `drop` or `grow`.
#[allow(clippy::type_complexity)]
pub fn preprocess_stack(
    features: &[Feature],
    layout: Layout,
    limits: &mut Limits,
    policy: Overflow,
) -> Result<(Stats, Vec<Vec<bool>>, Vec<Exceeded>), Exceeded> {
    let sources = layout.sources();
    let n = features.first().map_or(1, |f| f.part.n.max(1));
    let mut stats = Stats {
        max_ids: vec![0; n],
        max_unique_ids: vec![0; n],
        required_buffer_size: vec![0; sources],
        id_drop_counters: vec![0; n],
    };
    let mut keep: Vec<Vec<bool>> = features.iter().map(|f| vec![true; f.ids.len()]).collect();
    let mut exceeded = Vec::new();
    for s in 0..sources {
        // Per partition: ((table slot, id), (feature, sample)) pairs, duplicates
        // within a sample merged; the first element orders them for `drop`.
        type Pair = ((usize, u64), (usize, usize));
        let mut pairs: BTreeMap<usize, BTreeSet<Pair>> = BTreeMap::new();
        for (fi, f) in features.iter().enumerate() {
            let valency = f.valency.max(1);
            let samples = f.ids.len() / valency;
            let per_source = samples.div_ceil(sources);
            let lo = (s * per_source).min(samples);
            let hi = ((s + 1) * per_source).min(samples);
            for sample in lo..hi {
                for &id in &f.ids[sample * valency..(sample + 1) * valency] {
                    let Ok(id) = u64::try_from(id) else { continue };
                    pairs
                        .entry(f.part.partition(id))
                        .or_default()
                        .insert(((f.table, id), (fi, sample)));
                }
            }
        }
        let mut buffer = 0;
        for (&p, set) in &pairs {
            let count = set.len() as i64;
            let distinct: BTreeSet<(usize, u64)> = set.iter().map(|x| x.0).collect();
            let unique = distinct.len() as i64;
            stats.max_ids[p] = stats.max_ids[p].max(count);
            stats.max_unique_ids[p] = stats.max_unique_ids[p].max(unique);
            buffer += (count + 7) / 8 * 8;
            let over = |name, observed, limit| Exceeded {
                device: s / layout.sparsecores.max(1),
                sparsecore: s % layout.sparsecores.max(1),
                partition: p,
                limit_name: name,
                observed,
                limit,
            };
            let mut hits = Vec::new();
            if unique > limits.max_unique_ids {
                hits.push(over(
                    "max_unique_ids_per_partition",
                    unique,
                    limits.max_unique_ids,
                ));
            }
            if count > limits.max_ids {
                hits.push(over("max_ids_per_partition", count, limits.max_ids));
            }
            if hits.is_empty() {
                continue;
            }
            match policy {
                Overflow::Error => return Err(hits.remove(0)),
                Overflow::Grow => {
                    limits.max_ids = limits.max_ids.max(count);
                    limits.max_unique_ids = limits.max_unique_ids.max(unique);
                }
                Overflow::Drop => {
                    // Keep the smallest ids: first the distinct-id limit, then the
                    // pair limit, both in sorted order.
                    let allowed: BTreeSet<(usize, u64)> = distinct
                        .iter()
                        .take(limits.max_unique_ids.max(0) as usize)
                        .copied()
                        .collect();
                    let kept: BTreeSet<Pair> = set
                        .iter()
                        .filter(|x| allowed.contains(&x.0))
                        .take(limits.max_ids.max(0) as usize)
                        .copied()
                        .collect();
                    for &((_, id), (fi, sample)) in set.difference(&kept) {
                        stats.id_drop_counters[p] += 1;
                        let f = &features[fi];
                        let v = f.valency.max(1);
                        let r = sample * v..(sample + 1) * v;
                        for (k, x) in keep[fi][r.clone()].iter_mut().zip(&f.ids[r]) {
                            if *x == id as i64 {
                                *k = false;
                            }
                        }
                    }
                }
            }
            exceeded.extend(hits);
        }
        stats.required_buffer_size[s] = buffer;
    }
    Ok((stats, keep, exceeded))
}

/// One table of a stack, placed in the stack's shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackedTable {
    pub name: String,
    pub vocab: usize,
    pub padded_vocab: usize,
    pub dim: usize,
    /// Rows of this table before it in every shard.
    pub row_offset_in_shard: usize,
    /// Its MOD shift, so stacked tables do not all start on the same partition.
    pub shard_rotation: usize,
}

/// Tables stacked into one: same padded dim, optimizer and combiner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    pub name: String,
    pub dim: usize,
    pub partitions: usize,
    pub tables: Vec<StackedTable>,
}

impl Stack {
    pub fn rows_per_shard(&self) -> usize {
        self.tables
            .iter()
            .map(|t| t.padded_vocab / self.partitions.max(1))
            .sum()
    }
    /// Shard row of a table's id: (partition, row within that partition's shard).
    pub fn place(&self, table: &str, id: u64) -> Option<(usize, usize)> {
        let t = self.tables.iter().find(|t| t.name == table)?;
        let p = Partitioner {
            n: self.partitions,
            shift: t.shard_rotation,
        };
        Some((p.partition(id), t.row_offset_in_shard + p.local_row(id)))
    }
}

/// What stacking needs to know of a table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    pub name: String,
    pub vocab: usize,
    pub dim: usize,
    pub optimizer: String,
    pub combiner: String,
    /// Activation bytes its features produce per step (for the stacking limit).
    pub activation_bytes: f64,
}

pub fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m.max(1)) * m.max(1)
}

/// Stack tables as SparseCore does: dims padded to multiples of 8, vocabularies to
/// multiples of 8 × `partitions`; tables with the same padded dim, optimizer and
/// combiner share a stack (in declaration order) while the stack's activations stay
/// under `limit_bytes`. Table k of a stack is rotated by k × `sparsecores_per_device`.
pub fn stack(
    tables: &[TableInfo],
    partitions: usize,
    sparsecores_per_device: usize,
    limit_bytes: Option<f64>,
) -> Vec<Stack> {
    let partitions = partitions.max(1);
    let mut stacks: Vec<(Stack, String, String, f64)> = Vec::new();
    for t in tables {
        let dim = round_up(t.dim, 8);
        let padded_vocab = round_up(t.vocab, 8 * partitions);
        let fits = |s: &(Stack, String, String, f64)| {
            s.0.dim == dim
                && s.1 == t.optimizer
                && s.2 == t.combiner
                && limit_bytes.is_none_or(|l| s.3 + t.activation_bytes <= l)
        };
        let i = match stacks.iter().position(fits) {
            Some(i) => i,
            None => {
                stacks.push((
                    Stack {
                        name: String::new(),
                        dim,
                        partitions,
                        tables: vec![],
                    },
                    t.optimizer.clone(),
                    t.combiner.clone(),
                    0.0,
                ));
                stacks.len() - 1
            }
        };
        let s = &mut stacks[i];
        let k = s.0.tables.len();
        s.0.tables.push(StackedTable {
            name: t.name.clone(),
            vocab: t.vocab,
            padded_vocab,
            dim: t.dim,
            row_offset_in_shard: s.0.rows_per_shard(),
            shard_rotation: (k * sparsecores_per_device.max(1)) % partitions,
        });
        s.3 += t.activation_bytes;
    }
    stacks
        .into_iter()
        .map(|(mut s, ..)| {
            s.name = s
                .tables
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join("_");
            s
        })
        .collect()
}

/// The limits FDO sets from merged statistics: the largest observed count times
/// `headroom` (rounded up), and the buffer size max(required) × SparseCores per device.
pub fn limits_from(stats: &Stats, headroom: f64, sparsecores_per_device: usize) -> (Limits, i64) {
    let up = |v: &[i64]| {
        let m = v.iter().copied().max().unwrap_or(0).max(1);
        ((m as f64) * headroom.max(1.0)).ceil() as i64
    };
    (
        Limits {
            max_ids: up(&stats.max_ids),
            max_unique_ids: up(&stats.max_unique_ids),
        },
        stats
            .required_buffer_size
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            * sparsecores_per_device.max(1) as i64,
    )
}

/// FDO through files, in the layout of JAX SparseCore's `NPZFileFDOClient`: each
/// process publishes `fdo_stats_<process>_<time_ns>.npz` holding, per stack,
/// `<stack>_max_ids`, `<stack>_max_unique_ids`, `<stack>_required_buffer_size` and
/// `<stack>_id_drop_counters` (int32); loading takes each process's newest file and
/// merges them by element-wise maximum.
#[derive(Debug)]
pub struct FdoClient {
    pub dir: PathBuf,
    pub process: usize,
    recorded: BTreeMap<String, Stats>,
}

const KEYS: [&str; 4] = [
    "max_ids",
    "max_unique_ids",
    "required_buffer_size",
    "id_drop_counters",
];

/// The most an FDO statistics file may hold (a few int32 per partition and stack).
pub const FDO_CAP: u64 = 256 << 20;
/// How far in the future a file's name may date it: the clocks of a job's hosts
/// differ a little. Files named later than that are ignored.
pub const CLOCK_SKEW_NS: u128 = 60_000_000_000;
/// The largest count a statistics file may hold (they are stored as int32).
const COUNT_MAX: f64 = i32::MAX as f64;

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

impl FdoClient {
    pub fn new(dir: &Path, process: usize) -> FdoClient {
        FdoClient {
            dir: dir.to_path_buf(),
            process,
            recorded: BTreeMap::new(),
        }
    }

    /// Fold one step's statistics into what the next publish writes.
    pub fn record(&mut self, stack: &str, stats: &Stats) {
        self.recorded
            .entry(stack.to_string())
            .or_default()
            .merge_max(stats);
    }

    /// Write what was recorded (atomically, and never through a link planted at
    /// the file's name: [`crate::files::write_replace`]).
    pub fn publish(&mut self) -> Result<PathBuf, String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create `{}`: {e}", self.dir.display()))?;
        let dest = self
            .dir
            .join(format!("fdo_stats_{}_{}.npz", self.process, now_ns()));
        let mut arrays = Vec::new();
        for (stack, s) in &self.recorded {
            for (key, v) in KEYS.iter().zip([
                &s.max_ids,
                &s.max_unique_ids,
                &s.required_buffer_size,
                &s.id_drop_counters,
            ]) {
                let data: Vec<i32> = v
                    .iter()
                    .map(|x| (*x).clamp(0, i32::MAX as i64) as i32)
                    .collect();
                arrays.push((format!("{stack}_{key}"), data));
            }
        }
        let cannot = |e: String| format!("cannot write `{}`: {e}", dest.display());
        let bytes = crate::arrays::npz_of_i32(&arrays).map_err(cannot)?;
        crate::files::write_replace(&dest, &bytes).map_err(|e| cannot(e.to_string()))?;
        Ok(dest)
    }
}

/// What a run knows its statistics files must look like, per stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The stack's partitions: the length of `max_ids` and `max_unique_ids`.
    pub partitions: usize,
    /// The most ids one SparseCore can send a partition in a step (its share of
    /// the batch times the valency, summed over the stack's features).
    pub max_ids: Option<i64>,
}

/// The statistics of a directory of FDO files.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Per stack, merged by element-wise maximum over the files used.
    pub stats: BTreeMap<String, Stats>,
    /// The files used (each process's newest).
    pub files: Vec<PathBuf>,
    /// Files passed over, and why: named with a time in the future, or holding
    /// statistics that fail the sanity checks.
    pub warnings: Vec<String>,
    /// Files whose statistics failed the sanity checks. A run keeps its limits
    /// when any was refused: the merge would miss that process.
    pub refused: Vec<PathBuf>,
}

/// The newest file of each process in `dir`, merged by element-wise maximum, per
/// stack. A directory without FDO files, or an unreadable file, is an error naming it.
pub fn load(dir: &Path) -> Result<Loaded, String> {
    load_processes(dir, None, &BTreeMap::new())
}

/// [`load`], taking only the files of processes `0..n` (a run's own processes:
/// a directory may still hold files that other processes of an earlier run
/// published, and a run must not inherit their maxima), and checking each stack
/// in `expect` against what the run knows of it.
pub fn load_processes(
    dir: &Path,
    n: Option<usize>,
    expect: &BTreeMap<String, Expected>,
) -> Result<Loaded, String> {
    load_at(dir, n, expect, now_ns())
}

/// [`load_processes`] as of `now` (nanoseconds since the epoch): files named
/// with a time past `now` + [`CLOCK_SKEW_NS`] are ignored with a warning (one
/// such file would otherwise be every round's newest and override the run's own
/// output), and each file's statistics are sanity-checked before they are used.
pub fn load_at(
    dir: &Path,
    n: Option<usize>,
    expect: &BTreeMap<String, Expected>,
    now: u128,
) -> Result<Loaded, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?;
    let mut out = Loaded::default();
    let mut found = 0;
    let mut newest: BTreeMap<String, (u128, PathBuf)> = BTreeMap::new();
    let mut future: Vec<(PathBuf, u128)> = Vec::new();
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name
            .strip_prefix("fdo_stats_")
            .and_then(|r| r.strip_suffix(".npz"))
        else {
            continue;
        };
        let Some((process, time)) = rest.rsplit_once('_') else {
            continue;
        };
        let Ok(time) = time.parse::<u128>() else {
            continue;
        };
        if n.is_some_and(|n| process.parse::<usize>().map_or(true, |p| p >= n)) {
            continue;
        }
        found += 1;
        if time > now.saturating_add(CLOCK_SKEW_NS) {
            future.push((e.path(), time - now));
            continue;
        }
        let slot = newest
            .entry(process.to_string())
            .or_insert((0, PathBuf::new()));
        if time >= slot.0 {
            *slot = (time, e.path());
        }
    }
    if found == 0 {
        return Err(format!(
            "`{}` holds no `fdo_stats_*.npz` files",
            dir.display()
        ));
    }
    future.sort();
    for (path, ahead) in future {
        out.warnings.push(format!(
            "`{}` is named with a time {} s in the future (more than the {} s allowed for clock skew); ignored",
            path.display(),
            ahead / 1_000_000_000,
            CLOCK_SKEW_NS / 1_000_000_000
        ));
    }
    for (_, (_, path)) in newest {
        let unreadable =
            |e: String| format!("`{}` is not a readable FDO file: {e}", path.display());
        let buf =
            crate::files::read_regular(&path, FDO_CAP).map_err(|e| unreadable(e.to_string()))?;
        let arrays =
            crate::arrays::npz_arrays(&path, &buf, FDO_CAP).map_err(|e| unreadable(e.reason()))?;
        if !arrays.iter().any(|a| a.name.ends_with("_max_ids")) {
            return Err(format!(
                "`{}` holds no `<stack>_max_ids` arrays",
                path.display()
            ));
        }
        match file_stats(&arrays, expect) {
            Ok(per) => {
                for (k, s) in per {
                    out.stats.entry(k).or_default().merge_max(&s);
                }
                out.files.push(path);
            }
            Err(why) => {
                out.warnings.push(format!(
                    "`{}` {why}; its statistics are not used, and the limits stay as they were",
                    path.display()
                ));
                out.refused.push(path);
            }
        }
    }
    Ok(out)
}

/// One file's statistics per stack, each sanity-checked: integer counts in
/// int32's range, one per partition, at most as many distinct ids as ids, not all
/// zero (a file that claims observations saw at least one id), and within what
/// the run knows of the stack (`expect`).
fn file_stats(
    arrays: &[crate::arrays::Array],
    expect: &BTreeMap<String, Expected>,
) -> Result<BTreeMap<String, Stats>, String> {
    let mut per: BTreeMap<String, Stats> = BTreeMap::new();
    for a in arrays {
        let Some((stack, key)) = KEYS.iter().find_map(|k| {
            a.name
                .strip_suffix(&format!("_{k}"))
                .map(|s| (s.to_string(), *k))
        }) else {
            continue;
        };
        if !a.int || a.shape.len() != 1 {
            return Err(format!(
                "stores `{}` as {} of shape {:?}; FDO counts are one-dimensional integers",
                a.name, a.dtype, a.shape
            ));
        }
        if let Some(v) = a.values.iter().find(|v| !(0.0..=COUNT_MAX).contains(*v)) {
            return Err(format!(
                "holds the count {v} in `{}`; counts lie between 0 and {COUNT_MAX}",
                a.name
            ));
        }
        let v: Vec<i64> = a.values.iter().map(|x| *x as i64).collect();
        let s = per.entry(stack).or_default();
        match key {
            "max_ids" => s.max_ids = v,
            "max_unique_ids" => s.max_unique_ids = v,
            "required_buffer_size" => s.required_buffer_size = v,
            _ => s.id_drop_counters = v,
        }
    }
    for (stack, s) in &per {
        sane(stack, s, expect.get(stack))?;
    }
    Ok(per)
}

fn sane(stack: &str, s: &Stats, expect: Option<&Expected>) -> Result<(), String> {
    let p = s.max_ids.len();
    if p == 0 {
        return Err(format!("has no `{stack}_max_ids`"));
    }
    for (key, v) in [
        ("max_unique_ids", &s.max_unique_ids),
        ("id_drop_counters", &s.id_drop_counters),
    ] {
        if v.len() != p && !(key == "id_drop_counters" && v.is_empty()) {
            return Err(format!(
                "has {p} partitions in `{stack}_max_ids` but {} in `{stack}_{key}`",
                v.len()
            ));
        }
    }
    if let Some(i) = (0..p).find(|&i| s.max_unique_ids[i] > s.max_ids[i]) {
        return Err(format!(
            "claims {} distinct ids but {} ids in partition {i} of stack `{stack}`",
            s.max_unique_ids[i], s.max_ids[i]
        ));
    }
    if s.max_ids.iter().all(|&x| x == 0) {
        return Err(format!(
            "claims stack `{stack}` saw no ids in any of its {p} partitions (all zero), which would set its limits to the minimum"
        ));
    }
    let Some(e) = expect else {
        return Ok(());
    };
    if p != e.partitions {
        return Err(format!(
            "has {p} partitions for stack `{stack}`; the run's stack has {}",
            e.partitions
        ));
    }
    if let Some(bound) = e.max_ids {
        if let Some((i, m)) = s.max_ids.iter().enumerate().find(|(_, &m)| m > bound) {
            return Err(format!(
                "claims {m} ids in partition {i} of stack `{stack}`, more than one SparseCore sends in a step ({bound})"
            ));
        }
    }
    Ok(())
}

/// `shardc fdo show`: the merged statistics as a table.
pub fn render(stats: &BTreeMap<String, Stats>, files: &[PathBuf]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for f in files {
        let _ = writeln!(out, "from {}", f.display());
    }
    for (stack, s) in stats {
        let _ = writeln!(out, "\nstack `{stack}`");
        let _ = writeln!(
            out,
            "  {:>9} {:>8} {:>15} {:>8}",
            "partition", "max_ids", "max_unique_ids", "dropped"
        );
        for p in 0..s.max_ids.len() {
            let g = |v: &Vec<i64>| v.get(p).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "  {:>9} {:>8} {:>15} {:>8}",
                p,
                g(&s.max_ids),
                g(&s.max_unique_ids),
                g(&s.id_drop_counters)
            );
        }
        let max = |v: &Vec<i64>| v.iter().copied().max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:>9} {:>8} {:>15}",
            "max",
            max(&s.max_ids),
            max(&s.max_unique_ids)
        );
        let _ = writeln!(
            out,
            "  required buffer: {} per SparseCore at most ({} SparseCores); {} ids dropped",
            max(&s.required_buffer_size),
            s.required_buffer_size.len(),
            s.id_drop_counters.iter().sum::<i64>()
        );
    }
    out
}
