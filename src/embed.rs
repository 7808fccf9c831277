//! SparseCore semantics of embedding tables, on the host: MOD partitioning, table
//! stacking, per-step input statistics (per partition and per device), limits
//! with their overflow policies, and FDO ([`fdo`]: per-step statistics files in
//! the library's layout, loading, the limits they set). These follow the JAX
//! SparseCore library (`jax-tpu-embedding`) where it is well defined; where it
//! aborts the process, these return data the caller turns into a diagnostic.

mod fdo;
pub use fdo::*;

use std::collections::{BTreeMap, BTreeSet};

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
    /// Each occurrence's gain in one sample as the library computes it: the
    /// normaliser is taken over every occurrence of the sample (`weights`, 0 for
    /// padding), before any id is dropped; a dropped occurrence (`kept` false)
    /// then gets gain 0 and the kept ones keep theirs (`mean`: w / Σ w over the
    /// whole sample, `sqrtn`: w / √Σ w² over the whole sample).
    pub fn gains(self, weights: &[f64], kept: &[bool]) -> Vec<f64> {
        let c = self.factor(weights);
        weights
            .iter()
            .zip(kept.iter().chain(std::iter::repeat(&true)))
            .map(|(w, k)| if *k { w * c } else { 0.0 })
            .collect()
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
    /// Per partition: input ids dropped by `overflow: drop`, counted as the library
    /// counts them (every occurrence of a dropped (sample, id) pair).
    pub id_drop_counters: Vec<i64>,
    /// Per device and global partition (`[device][partition]`, row-major): the most
    /// ids one of the device's SparseCores sends the partition (what the library
    /// reports per step, and what FDO files hold). Empty: not known.
    pub device_max_ids: Vec<i64>,
    /// The same for distinct ids.
    pub device_max_unique_ids: Vec<i64>,
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
        m(&mut self.device_max_ids, &o.device_max_ids);
        m(&mut self.device_max_unique_ids, &o.device_max_unique_ids);
    }
    /// Input ids dropped in all.
    pub fn dropped(&self) -> i64 {
        self.id_drop_counters.iter().sum()
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
    /// Under `drop`: the input ids dropped at this SparseCore and partition
    /// (every occurrence of a dropped pair), on the first limit listed for them
    /// only, so a drop past both limits is counted once.
    pub dropped: i64,
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
///
/// Dropping follows the library: a partition's pairs are taken in sorted order
/// (id, then sample); a pair is kept while fewer than `max_ids` pairs were kept
/// and its id was admitted (an id is admitted when first seen if fewer than
/// `max_unique_ids` ids were); the other pairs are dropped, each counting as
/// many dropped ids as it had occurrences in its sample. Either limit may be
/// the larger; the smaller binds first.
#[allow(clippy::type_complexity)]
pub fn preprocess_stack(
    features: &[Feature],
    layout: Layout,
    limits: &mut Limits,
    policy: Overflow,
) -> Result<(Stats, Vec<Vec<bool>>, Vec<Exceeded>), Exceeded> {
    let sources = layout.sources();
    let sc = layout.sparsecores.max(1);
    let devices = layout.devices.max(1);
    let n = features.first().map_or(1, |f| f.part.n.max(1));
    let mut stats = Stats {
        max_ids: vec![0; n],
        max_unique_ids: vec![0; n],
        required_buffer_size: vec![0; sources],
        id_drop_counters: vec![0; n],
        device_max_ids: vec![0; devices * n],
        device_max_unique_ids: vec![0; devices * n],
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
        let (device, sparsecore) = (s / sc, s % sc);
        let mut buffer = 0;
        for (&p, set) in &pairs {
            let count = set.len() as i64;
            let unique = set.iter().map(|x| x.0).collect::<BTreeSet<_>>().len() as i64;
            stats.max_ids[p] = stats.max_ids[p].max(count);
            stats.max_unique_ids[p] = stats.max_unique_ids[p].max(unique);
            if let Some(d) = stats.device_max_ids.get_mut(device * n + p) {
                *d = (*d).max(count);
            }
            if let Some(d) = stats.device_max_unique_ids.get_mut(device * n + p) {
                *d = (*d).max(unique);
            }
            buffer += (count + 7) / 8 * 8;
            let over = |name, observed, limit| Exceeded {
                device,
                sparsecore,
                partition: p,
                limit_name: name,
                observed,
                limit,
                dropped: 0,
            };
            // The library checks the id limit first, then the distinct-id limit.
            let mut hits = Vec::new();
            if count > limits.max_ids {
                hits.push(over("max_ids_per_partition", count, limits.max_ids));
            }
            if unique > limits.max_unique_ids {
                hits.push(over(
                    "max_unique_ids_per_partition",
                    unique,
                    limits.max_unique_ids,
                ));
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
                    let (mut kept_ids, mut kept_unique) = (0i64, 0i64);
                    let mut last: Option<(usize, u64)> = None;
                    let mut admitted = false;
                    let mut dropped = 0;
                    for &((t, id), (fi, sample)) in set {
                        if last != Some((t, id)) {
                            last = Some((t, id));
                            admitted = kept_unique < limits.max_unique_ids;
                            if admitted && kept_ids < limits.max_ids {
                                kept_unique += 1;
                            }
                        }
                        if admitted && kept_ids < limits.max_ids {
                            kept_ids += 1;
                            continue;
                        }
                        // Every occurrence of the pair in its sample is dropped.
                        let f = &features[fi];
                        let v = f.valency.max(1);
                        let r = sample * v..(sample + 1) * v;
                        for (k, x) in keep[fi][r.clone()].iter_mut().zip(&f.ids[r]) {
                            if *x == id as i64 {
                                *k = false;
                                dropped += 1;
                            }
                        }
                    }
                    stats.id_drop_counters[p] += dropped;
                    hits[0].dropped = dropped;
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

/// The library's limits for a stack of several tables when none is given.
pub const STACK_DEFAULT_LIMIT: i64 = 256;

/// A table's own limits: as declared, 256 when left out, the distinct-id limit
/// defaulting to the id limit.
pub fn table_limits(max_ids: Option<i64>, max_unique_ids: Option<i64>) -> Limits {
    let max_ids = max_ids.unwrap_or(STACK_DEFAULT_LIMIT);
    Limits {
        max_ids,
        max_unique_ids: max_unique_ids.unwrap_or(max_ids),
    }
}

/// A table's `stack_max_ids_per_partition` and
/// `stack_max_unique_ids_per_partition`, where stated.
pub type StackStated = (Option<i64>, Option<i64>);

/// The limits a stack starts with, as the library sets them, from each table's
/// own limits and its stated `stack_max_*` limits: a table alone keeps its own;
/// a stack of several ignores its tables' and takes the largest stated stack
/// limits (the distinct-id limit defaulting to the id limit), else 256 / 256,
/// the library's default.
pub fn stack_limits(tables: &[(Limits, StackStated)]) -> Limits {
    match tables {
        [(own, _)] => *own,
        _ => {
            let max_ids = tables
                .iter()
                .filter_map(|t| t.1 .0)
                .max()
                .unwrap_or(STACK_DEFAULT_LIMIT);
            Limits {
                max_ids,
                max_unique_ids: tables
                    .iter()
                    .filter_map(|t| t.1 .1)
                    .max()
                    .unwrap_or(max_ids),
            }
        }
    }
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
