//! FDO (feedback-directed optimisation of SparseCore limits) through files, as
//! the library's `NPZFileFDOClient` does it: every step's statistics are
//! recorded as one row, each process publishes
//! `fdo_stats_<process>_<time_ns>.npz`, and loading takes the newest file of
//! every process and merges them by maximum. It exists apart from the
//! preprocessing in `embed.rs` because the file layouts (the library's per-step
//! rows and shardc's older running-maximum rows, both read), the loading rule,
//! and the checks a file passes before it sets any limit are their own subject.
//!
//! The layout written, per stack (exactly the library's keys and dtypes):
//!
//! | key                            | dtype | shape                                   |
//! |--------------------------------|-------|-----------------------------------------|
//! | `<stack>_max_ids`              | int32 | `[steps, devices × global partitions]`  |
//! | `<stack>_max_unique_ids`       | int32 | `[steps, devices × global partitions]`  |
//! | `<stack>_required_buffer_size` | int32 | `[steps, SparseCores]`                  |
//! | `<stack>_id_drop_counters`     | int64 | `[steps, 1]`                            |
//!
//! A row of `max_ids` is `[device][partition]`: the most ids one of the
//! device's SparseCores sent that global partition in that step.

use super::Stats;
use crate::arrays::{Array, Ints};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most an FDO statistics file may hold.
pub const FDO_CAP: u64 = 256 << 20;
/// How far in the future a file's name may date it: the clocks of a job's hosts
/// differ a little. Files named later than that are ignored.
pub const CLOCK_SKEW_NS: u128 = 60_000_000_000;
/// The largest count an int32 statistic may hold.
const COUNT_MAX: f64 = i32::MAX as f64;
/// The largest drop count (int64, read through f64: exact up to 2^53).
const DROPS_MAX: f64 = 9_007_199_254_740_992.0;
/// The most bytes of rows a client keeps per stack: past it, its two oldest rows
/// are folded into one (maxima, drops summed), so a long run's files stay
/// bounded and still give the same limits and drop total.
pub const ROWS_CAP_BYTES: usize = 32 << 20;

const KEYS: [&str; 4] = [
    "max_ids",
    "max_unique_ids",
    "required_buffer_size",
    "id_drop_counters",
];

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One recorded step of one stack.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    max_ids: Vec<i64>,
    max_unique_ids: Vec<i64>,
    required_buffer_size: Vec<i64>,
    dropped: i64,
}

impl Row {
    fn bytes(&self) -> usize {
        (self.max_ids.len() + self.max_unique_ids.len() + self.required_buffer_size.len()) * 4 + 8
    }
    fn fold(&mut self, o: &Row) {
        for (a, b) in [
            (&mut self.max_ids, &o.max_ids),
            (&mut self.max_unique_ids, &o.max_unique_ids),
            (&mut self.required_buffer_size, &o.required_buffer_size),
        ] {
            if a.len() < b.len() {
                a.resize(b.len(), 0);
            }
            a.iter_mut().zip(b).for_each(|(x, y)| *x = (*x).max(*y));
        }
        self.dropped = self.dropped.saturating_add(o.dropped);
    }
}

/// A process's FDO client: every step's statistics per stack, one row each,
/// published as the library's per-step layout.
#[derive(Debug)]
pub struct FdoClient {
    pub dir: PathBuf,
    pub process: usize,
    rows: BTreeMap<String, Vec<Row>>,
}

impl FdoClient {
    pub fn new(dir: &Path, process: usize) -> FdoClient {
        FdoClient {
            dir: dir.to_path_buf(),
            process,
            rows: BTreeMap::new(),
        }
    }

    /// Add one step's statistics of `stack` as a row (the per-device arrays; a
    /// `Stats` without them is one device's).
    pub fn record(&mut self, stack: &str, stats: &Stats) {
        let or = |d: &Vec<i64>, g: &Vec<i64>| if d.is_empty() { g.clone() } else { d.clone() };
        let row = Row {
            max_ids: or(&stats.device_max_ids, &stats.max_ids),
            max_unique_ids: or(&stats.device_max_unique_ids, &stats.max_unique_ids),
            required_buffer_size: stats.required_buffer_size.clone(),
            dropped: stats.dropped(),
        };
        let rows = self.rows.entry(stack.to_string()).or_default();
        rows.push(row);
        let mut bytes: usize = rows.iter().map(Row::bytes).sum();
        while rows.len() > 2 && bytes > ROWS_CAP_BYTES {
            let second = rows.remove(1);
            bytes -= second.bytes();
            rows[0].fold(&second);
        }
    }

    /// Write every row recorded so far (atomically, and never through a link
    /// planted at the file's name: [`crate::files::write_replace`]).
    pub fn publish(&mut self) -> Result<PathBuf, String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create `{}`: {e}", self.dir.display()))?;
        let dest = self
            .dir
            .join(format!("fdo_stats_{}_{}.npz", self.process, now_ns()));
        let cannot = |e: String| format!("cannot write `{}`: {e}", dest.display());
        let bytes = crate::arrays::npz_of_ints(&self.arrays()).map_err(cannot)?;
        crate::files::write_replace(&dest, &bytes).map_err(|e| cannot(e.to_string()))?;
        Ok(dest)
    }

    /// The arrays a publish writes: per stack, its four keys.
    fn arrays(&self) -> Vec<(String, Vec<usize>, Ints)> {
        let i32s = |v: &mut dyn Iterator<Item = i64>| -> Vec<i32> {
            v.map(|x| x.clamp(0, i32::MAX as i64) as i32).collect()
        };
        let mut out = Vec::new();
        for (stack, rows) in &self.rows {
            let steps = rows.len();
            let w = rows.iter().map(|r| r.max_ids.len()).max().unwrap_or(0);
            let s = rows
                .iter()
                .map(|r| r.required_buffer_size.len())
                .max()
                .unwrap_or(0);
            let padded = |f: fn(&Row) -> &Vec<i64>, w: usize| -> Vec<i32> {
                i32s(&mut rows.iter().flat_map(|r| {
                    let v = f(r);
                    (0..w).map(move |i| v.get(i).copied().unwrap_or(0))
                }))
            };
            out.push((
                format!("{stack}_max_ids"),
                vec![steps, w],
                Ints::I32(padded(|r| &r.max_ids, w)),
            ));
            out.push((
                format!("{stack}_max_unique_ids"),
                vec![steps, w],
                Ints::I32(padded(|r| &r.max_unique_ids, w)),
            ));
            out.push((
                format!("{stack}_required_buffer_size"),
                vec![steps, s],
                Ints::I32(padded(|r| &r.required_buffer_size, s)),
            ));
            out.push((
                format!("{stack}_id_drop_counters"),
                vec![steps, 1],
                Ints::I64(rows.iter().map(|r| r.dropped.max(0)).collect()),
            ));
        }
        out
    }
}

/// What a run knows its statistics files must look like, per stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The stack's partitions: the length of the older layout's rows, and of
    /// each device's part of the per-step rows.
    pub partitions: usize,
    /// Devices over which the stack's ids are spread (the rows are
    /// `devices × partitions` long).
    pub devices: usize,
    /// The most ids one SparseCore can send a partition in a step (its share of
    /// the batch times the valency, summed over the stack's features).
    pub max_ids: Option<i64>,
}

/// One stack's statistics in one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Rows (steps) in the file; `None` for the older running-maximum layout
    /// (one value per partition, no steps).
    pub steps: Option<usize>,
    /// Devices of each row (1 for the older layout, whose values are maxima over
    /// all SparseCores).
    pub devices: usize,
    pub partitions: usize,
    /// Maxima over the rows: per partition, per device and partition, per
    /// SparseCore; the older layout's per-partition drop counters.
    pub stats: Stats,
    /// Input ids dropped in each step (the per-step layout).
    pub dropped_per_step: Vec<i64>,
}

impl FileStats {
    /// Input ids dropped over the file's steps.
    pub fn dropped(&self) -> i64 {
        self.dropped_per_step.iter().sum::<i64>() + self.stats.dropped()
    }
}

/// The statistics of a directory of FDO files.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Per stack, merged by element-wise maximum over the files used (what sets
    /// the limits).
    pub stats: BTreeMap<String, Stats>,
    /// The files used (each process's newest), with their statistics per stack.
    pub files: Vec<PathBuf>,
    pub per_file: Vec<BTreeMap<String, FileStats>>,
    /// Files passed over, and why: named with a time in the future, or holding
    /// statistics that fail the sanity checks.
    pub warnings: Vec<String>,
    /// Files whose statistics failed the sanity checks. A run keeps its limits
    /// when any was refused: the merge would miss that process.
    pub refused: Vec<PathBuf>,
}

/// The files of `dir` the library's client loads: names `fdo_stats_<P>_<T>.npz`
/// (P, T decimal), grouped by the process string P, the one with the largest
/// T of each group. Files named more than [`CLOCK_SKEW_NS`] after `now` are
/// left out first (returned apart), so one forged name cannot be every round's
/// newest. Returns (the newest per process, the future-named with how far
/// ahead, how many names matched).
#[allow(clippy::type_complexity)]
pub fn newest_per_process(
    dir: &Path,
    now: u128,
) -> Result<(Vec<PathBuf>, Vec<(PathBuf, u128)>, usize), String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?;
    let mut newest: BTreeMap<String, (u128, PathBuf)> = BTreeMap::new();
    let mut future = Vec::new();
    let mut found = 0;
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().to_string();
        let Some((process, time)) = name
            .strip_prefix("fdo_stats_")
            .and_then(|r| r.strip_suffix(".npz"))
            .and_then(|r| r.split_once('_'))
        else {
            continue;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let Some(time) = (digits(process) && digits(time))
            .then(|| time.parse::<u128>().ok())
            .flatten()
        else {
            continue;
        };
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
    future.sort();
    Ok((newest.into_values().map(|x| x.1).collect(), future, found))
}

/// The newest file of every process in `dir`, merged by element-wise maximum,
/// per stack. A directory without FDO files, or an unreadable file, is an
/// error naming it.
pub fn load(dir: &Path) -> Result<Loaded, String> {
    load_expecting(dir, &BTreeMap::new())
}

/// [`load`], checking each stack in `expect` against what the run knows of it.
pub fn load_expecting(dir: &Path, expect: &BTreeMap<String, Expected>) -> Result<Loaded, String> {
    load_at(dir, expect, now_ns())
}

/// [`load_expecting`] as of `now` (nanoseconds since the epoch): files named
/// with a time past `now` + [`CLOCK_SKEW_NS`] are ignored with a warning, and
/// each file's statistics are sanity-checked before they are used.
pub fn load_at(
    dir: &Path,
    expect: &BTreeMap<String, Expected>,
    now: u128,
) -> Result<Loaded, String> {
    let (newest, future, found) = newest_per_process(dir, now)?;
    if found == 0 {
        return Err(format!(
            "`{}` holds no `fdo_stats_*.npz` files",
            dir.display()
        ));
    }
    let mut out = Loaded::default();
    for (path, ahead) in future {
        out.warnings.push(format!(
            "`{}` is named with a time {} s in the future (more than the {} s allowed for clock skew); ignored",
            path.display(),
            ahead / 1_000_000_000,
            CLOCK_SKEW_NS / 1_000_000_000
        ));
    }
    for path in newest {
        // Other processes write into this directory: a file that cannot be read
        // is skipped like one whose statistics fail their checks.
        let arrays = match read_file(&path) {
            Ok(a) => a,
            Err(why) => {
                out.warnings.push(format!(
                    "`{}` {why}; skipped, and the limits stay as they were",
                    path.display()
                ));
                out.refused.push(path);
                continue;
            }
        };
        match file_stats(&arrays, expect) {
            Ok(per) => {
                for (k, s) in &per {
                    out.stats.entry(k.clone()).or_default().merge_max(&s.stats);
                }
                out.files.push(path);
                out.per_file.push(per);
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

/// A statistics file's arrays, or why it cannot be used: a symbolic link (the
/// directory is shared; a link may lead anywhere), not a regular file, too big,
/// not an `.npz`, or none of the statistics in it.
fn read_file(path: &Path) -> Result<Vec<Array>, String> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err("is a symbolic link, not read".into());
    }
    let buf = crate::files::read_regular(path, FDO_CAP)
        .map_err(|e| format!("is not a readable FDO file: {e}"))?;
    let arrays = crate::arrays::npz_arrays(path, &buf, FDO_CAP)
        .map_err(|e| format!("is not a readable FDO file: {}", e.reason()))?;
    if !arrays.iter().any(|a| a.name.ends_with("_max_ids")) {
        return Err("holds no `<stack>_max_ids` arrays".into());
    }
    Ok(arrays)
}

/// One file's arrays per stack and key.
fn by_stack(arrays: &[Array]) -> BTreeMap<String, BTreeMap<&'static str, &Array>> {
    let mut per: BTreeMap<String, BTreeMap<&'static str, &Array>> = BTreeMap::new();
    for a in arrays {
        if let Some((stack, key)) = KEYS.iter().find_map(|k| {
            a.name
                .strip_suffix(&format!("_{k}"))
                .map(|s| (s.to_string(), *k))
        }) {
            per.entry(stack).or_default().insert(key, a);
        }
    }
    per
}

/// One file's statistics per stack, each sanity-checked: integer counts in
/// range, rows of one width, at most as many distinct ids as ids, not all zero
/// (a file that claims observations saw at least one id), and within what the
/// run knows of the stack (`expect`).
fn file_stats(
    arrays: &[Array],
    expect: &BTreeMap<String, Expected>,
) -> Result<BTreeMap<String, FileStats>, String> {
    let mut out = BTreeMap::new();
    for (stack, keys) in by_stack(arrays) {
        for a in keys.values() {
            let max = if a.name.ends_with("_id_drop_counters") {
                DROPS_MAX
            } else {
                COUNT_MAX
            };
            if !a.int || a.shape.len() > 2 {
                return Err(format!(
                    "stores `{}` as {} of shape {:?}; FDO counts are integers, one row per step",
                    a.name, a.dtype, a.shape
                ));
            }
            if let Some(v) = a.values.iter().find(|v| !(0.0..=max).contains(v)) {
                return Err(format!(
                    "holds the count {v} in `{}`; counts lie between 0 and {max}",
                    a.name
                ));
            }
        }
        let fs = one_stack(&stack, &keys, expect.get(&stack))?;
        out.insert(stack, fs);
    }
    Ok(out)
}

/// Rows × width of an array of at most two dimensions (a scalar is one value).
fn rows_of(a: &Array) -> (usize, usize) {
    match a.shape.as_slice() {
        [] => (1, 1),
        [w] => (1, *w),
        [r, w, ..] => (*r, *w),
    }
}

fn one_stack(
    stack: &str,
    keys: &BTreeMap<&'static str, &Array>,
    expect: Option<&Expected>,
) -> Result<FileStats, String> {
    let ids = keys
        .get("max_ids")
        .ok_or_else(|| format!("has no `{stack}_max_ids`"))?;
    let unique = keys
        .get("max_unique_ids")
        .ok_or_else(|| format!("has no `{stack}_max_unique_ids`"))?;
    let (rows, w) = rows_of(ids);
    if w == 0 || rows == 0 || ids.shape.is_empty() {
        return Err(format!("has no values in `{stack}_max_ids`"));
    }
    if unique.shape != ids.shape {
        return Err(format!(
            "has {w} partitions in `{stack}_max_ids` but {} in `{stack}_max_unique_ids`",
            rows_of(unique).1
        ));
    }
    let drops = keys.get("id_drop_counters");
    let buffer = keys.get("required_buffer_size");
    // The older layout: one running-maximum row per partition, its drop counters
    // one per partition too. The library never writes one-dimensional counters.
    let older = ids.shape.len() == 1 && drops.is_some_and(|d| d.shape.len() == 1);
    let s = buffer.map_or(0, |b| rows_of(b).1);
    let devices = match (older, expect) {
        (true, _) => 1,
        (false, Some(e)) => e.devices.max(1),
        // One host: rows are devices × partitions and the SparseCores are the
        // partitions, so the devices are the row over the SparseCores.
        (false, None) if s > 0 && w % s == 0 => w / s,
        (false, None) => 1,
    };
    let partitions = w / devices.max(1);
    if let Some(e) = expect {
        let want = if older {
            e.partitions
        } else {
            e.devices * e.partitions
        };
        if w != want && older {
            return Err(format!(
                "has {w} partitions for stack `{stack}`; the run's stack has {}",
                e.partitions
            ));
        }
        if w != want {
            return Err(format!(
                "has rows of {w} values for stack `{stack}`; the run's stack has {} device(s) × {} partitions",
                e.devices, e.partitions
            ));
        }
    }
    if w % devices.max(1) != 0 {
        return Err(format!(
            "has rows of {w} values for stack `{stack}`, not a whole number of devices"
        ));
    }
    if let Some(b) = buffer {
        if b.shape.len() == 2 && rows_of(b).0 != rows {
            return Err(format!(
                "has {rows} rows in `{stack}_max_ids` but {} in `{stack}_required_buffer_size`",
                rows_of(b).0
            ));
        }
    }
    let as_i = |v: &crate::arrays::Values| -> Vec<i64> { v.iter().map(|x| x as i64).collect() };
    let (iv, uv) = (as_i(&ids.values), as_i(&unique.values));
    if let Some(i) = (0..iv.len()).find(|&i| uv[i] > iv[i]) {
        return Err(format!(
            "claims {} distinct ids but {} ids in partition {} of stack `{stack}`",
            uv[i],
            iv[i],
            i % w % partitions.max(1)
        ));
    }
    if iv.iter().all(|&x| x == 0) {
        return Err(format!(
            "claims stack `{stack}` saw no ids in any of its {w} partitions (all zero), which would set its limits to the minimum"
        ));
    }
    if let Some(bound) = expect.and_then(|e| e.max_ids) {
        if let Some((i, m)) = iv.iter().enumerate().find(|(_, &m)| m > bound) {
            return Err(format!(
                "claims {m} ids in partition {} of stack `{stack}`, more than one SparseCore sends in a step ({bound})",
                i % w % partitions.max(1)
            ));
        }
    }
    let over_rows = |v: &[i64], w: usize| -> Vec<i64> {
        let mut m = vec![0; w];
        for row in v.chunks(w.max(1)) {
            m.iter_mut().zip(row).for_each(|(a, b)| *a = (*a).max(*b));
        }
        m
    };
    let (dev_ids, dev_unique) = (over_rows(&iv, w), over_rows(&uv, w));
    let per_partition = |d: &[i64]| over_rows(d, partitions);
    let mut stats = Stats {
        max_ids: per_partition(&dev_ids),
        max_unique_ids: per_partition(&dev_unique),
        required_buffer_size: buffer.map_or(Vec::new(), |b| over_rows(&as_i(&b.values), s)),
        ..Stats::default()
    };
    let mut dropped_per_step = Vec::new();
    if older {
        stats.id_drop_counters = drops.map_or(Vec::new(), |d| as_i(&d.values));
    } else {
        stats.device_max_ids = dev_ids;
        stats.device_max_unique_ids = dev_unique;
        dropped_per_step = drops.map_or(Vec::new(), |d| as_i(&d.values));
    }
    Ok(FileStats {
        steps: (!older).then_some(rows),
        devices,
        partitions,
        stats,
        dropped_per_step,
    })
}

/// `shardc fdo show`: each file's statistics per stack: per partition (maxima
/// over its steps and devices), per device and partition, the buffer and the
/// ids dropped; then the limits the files set together.
pub fn render(l: &Loaded) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (f, per) in l.files.iter().zip(&l.per_file) {
        let _ = writeln!(out, "from {}", f.display());
        for (stack, fs) in per {
            let s = &fs.stats;
            let steps = match fs.steps {
                Some(n) => format!("{n} step(s), {} device(s) × ", fs.devices),
                None => "running maxima (older layout, no steps), ".into(),
            };
            let _ = writeln!(
                out,
                "\nstack `{stack}`: {steps}{} partitions, {} SparseCores",
                fs.partitions,
                s.required_buffer_size.len()
            );
            let _ = writeln!(
                out,
                "  {:>9} {:>8} {:>15}",
                "partition", "max_ids", "max_unique_ids"
            );
            for p in 0..s.max_ids.len() {
                let g = |v: &Vec<i64>| v.get(p).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "  {:>9} {:>8} {:>15}",
                    p,
                    g(&s.max_ids),
                    g(&s.max_unique_ids)
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
            if fs.steps.is_some() {
                for (name, v) in [
                    ("max_ids", &s.device_max_ids),
                    ("max_unique_ids", &s.device_max_unique_ids),
                ] {
                    let _ = writeln!(
                        out,
                        "  {name} per device (rows) and partition (columns), the maximum over the device's SparseCores:"
                    );
                    for (d, row) in v.chunks(fs.partitions.max(1)).enumerate() {
                        let cells: Vec<String> = row.iter().map(|x| format!("{x:>3}")).collect();
                        let _ = writeln!(out, "  {d:>9} {}", cells.join(" "));
                    }
                }
            }
            let drops = match fs.steps {
                Some(_) => {
                    let worst = fs
                        .dropped_per_step
                        .iter()
                        .enumerate()
                        .max_by_key(|(i, v)| (**v, std::cmp::Reverse(*i)))
                        .filter(|(_, v)| **v > 0)
                        .map_or(String::new(), |(i, v)| {
                            format!(" (most in one step: {v}, row {i})")
                        });
                    format!("{} ids dropped in all{worst}", fs.dropped())
                }
                None => format!("{} ids dropped", fs.dropped()),
            };
            let _ = writeln!(
                out,
                "  required buffer: {} per SparseCore at most; {drops}",
                max(&s.required_buffer_size),
            );
        }
        out.push('\n');
    }
    for (stack, s) in &l.stats {
        let m = |v: &Vec<i64>| v.iter().copied().max().unwrap_or(0);
        let _ = writeln!(
            out,
            "limits loaded for stack `{stack}` (maxima over {} file(s)): max_ids_per_partition {}, max_unique_ids_per_partition {}",
            l.files.len(),
            m(&s.max_ids),
            m(&s.max_unique_ids)
        );
    }
    if !l.refused.is_empty() {
        let _ = writeln!(
            out,
            "skipped {} file(s) that could not be used (the warnings say why): {}",
            l.refused.len(),
            l.refused
                .iter()
                .map(|p| format!("`{}`", p.display()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out
}
