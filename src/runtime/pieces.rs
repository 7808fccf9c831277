//! Local pieces of global values, and what the devices of one process share
//! while they train: each device holds only its piece of every parameter,
//! input and label (by the value's layout, or a table's SparseCore placement);
//! replicas of a parameter piece compute it once ([`PieceCache`]) and, when
//! their optimizer steps in place, share its slots ([`SlotCache`]); each
//! step's global batch is formed once for every device here ([`StepBatches`]).

use super::data::Batch;
use super::exec::R;
use crate::ast::DType as SDType;
use crate::init;
use crate::mesh::Topology;
use crate::spmd::Program;
use crate::types::TType;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::Arc;

fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
}

/// Local piece of a global array (row-major `values`) for a value of type `t`.
pub(crate) fn local_piece(
    topo: &Topology,
    rank: usize,
    t: &TType,
    prog: &Program,
    values: &[f64],
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
    // Split along the first dimension only (a batch), or not at all: the
    // piece is one contiguous run of the global array.
    if t.dims.iter().skip(1).all(|d| d.axes.is_empty()) {
        let shape: Vec<usize> = prog.local_shape(t)?.iter().map(|x| *x as usize).collect();
        let len: usize = shape.iter().product();
        let first = t
            .dims
            .first()
            .map_or((0, 1), |d| topo.shard_index(rank, &d.axes));
        let start = first.0 * len;
        if let Some(run) = values.get(start..start + len) {
            return piece_tensor(run.to_vec(), t, shape, dtype, dev);
        }
    }
    let idx = init::global_indices(topo, rank, t, &prog.bound)?;
    local_piece_at(&idx, t, prog, values, dtype, dev)
}

/// Global element indices of a parameter's local piece: a table's rows in its
/// SparseCore placement, anything else by its layout.
pub(crate) fn param_indices(
    topo: &Topology,
    rank: usize,
    p: &crate::spmd::Param,
    pl: Option<&super::sparse::Placement>,
    prog: &Program,
) -> R<Vec<u64>> {
    let (starts, len) = param_runs(topo, rank, p, pl, prog)?;
    let mut idx = Vec::with_capacity(starts.len() * len);
    for s in starts {
        idx.extend(s..s + len as u64);
    }
    Ok(idx)
}

/// [`param_indices`] as runs of consecutive indices: each run's first, in
/// local order, and their length (as [`init::global_runs`]).
pub(crate) fn param_runs(
    topo: &Topology,
    rank: usize,
    p: &crate::spmd::Param,
    pl: Option<&super::sparse::Placement>,
    prog: &Program,
) -> R<(Vec<u64>, usize)> {
    let Some(pl) = pl else {
        return init::global_runs(topo, rank, &p.stored, &prog.bound)
            .map_err(crate::fault::Fault::Shape);
    };
    let shape = prog.local_shape(&p.stored)?;
    let (rows, d) = (
        shape[0] as usize,
        shape.get(1).copied().unwrap_or(1) as usize,
    );
    let owner = topo.shard_index(rank, &p.stored.dims[0].axes).0;
    let starts = (0..rows).map(|r| pl.id_at(owner, r) * d as u64).collect();
    Ok((starts, d))
}

/// Work per element of [`piece_from`], in [`crate::pool::PART_WORK`]'s units
/// (a normal draw: two hashes, a logarithm and a cosine).
const DRAW_WORK: usize = 16;

/// A float piece of `shape` in `dtype` whose element at global index `i` (in
/// the runs `starts`, each `len` long) is `values.at(i)`, rounded from f64 as
/// `Tensor::to_dtype` rounds it (the same bits), without an f64 copy and over
/// the pool's threads (each element depends on its index alone).
pub(crate) fn piece_from(
    (starts, len): (&[u64], usize),
    shape: Vec<usize>,
    dtype: DType,
    dev: &Device,
    values: &dyn init::Values,
) -> R<Tensor> {
    fn fill<T: Send>(
        starts: &[u64],
        len: usize,
        run: &(dyn Fn(u64, &mut [MaybeUninit<T>]) + Sync),
    ) -> R<Vec<T>> {
        crate::pool::rows_into(starts.len(), len, len * DRAW_WORK, &|first, n, out| {
            if len == 0 {
                return;
            }
            // Runs that continue one another are made as one (a whole
            // row-major piece is one run).
            let runs = starts.get(first..first + n).unwrap_or_default();
            let (mut at, mut from) = (0, 0);
            while at < runs.len() {
                let mut end = at + 1;
                while end < runs.len() && runs[end] == runs[end - 1].wrapping_add(len as u64) {
                    end += 1;
                }
                if let Some(o) = out.get_mut(from..from + (end - at) * len) {
                    run(runs[at], o);
                }
                from += (end - at) * len;
                at = end;
            }
        })
        .ok_or_else(|| "a thread making an initial value failed".into())
    }
    fn each<T>(out: &mut [MaybeUninit<T>], first: u64, f: impl Fn(u64) -> T) {
        for (k, o) in out.iter_mut().enumerate() {
            o.write(f(first.wrapping_add(k as u64)));
        }
    }
    let t = match dtype {
        DType::F32 => {
            let v = fill(starts, len, &|s, o| values.run_f32(s, o))?;
            Tensor::from_vec(v, shape, dev)
        }
        DType::BF16 => {
            let v = fill(starts, len, &|s, o| {
                each(o, s, |i| half::bf16::from_f64(values.at(i)))
            })?;
            Tensor::from_vec(v, shape, dev)
        }
        DType::F16 => {
            let v = fill(starts, len, &|s, o| {
                each(o, s, |i| half::f16::from_f64(values.at(i)))
            })?;
            Tensor::from_vec(v, shape, dev)
        }
        _ => {
            let v = fill(starts, len, &|s, o| each(o, s, |i| values.at(i)))?;
            Tensor::from_vec(v, shape, dev).and_then(|t| t.to_dtype(dtype))
        }
    };
    t.map_err(ce)
}

/// The local piece at the given global indices.
pub(crate) fn local_piece_at(
    idx: &[u64],
    t: &TType,
    prog: &Program,
    values: &[f64],
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
    let v: Vec<f64> = idx
        .iter()
        .map(|i| values.get(*i as usize).copied().unwrap_or(0.0))
        .collect();
    let shape: Vec<usize> = prog.local_shape(t)?.iter().map(|x| *x as usize).collect();
    piece_tensor(v, t, shape, dtype, dev)
}

/// A local piece's values as a tensor of `t`'s kind: integers as i64, floats
/// in `dtype`.
fn piece_tensor(
    v: Vec<f64>,
    t: &TType,
    shape: Vec<usize>,
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
    if matches!(t.dtype, SDType::I32 | SDType::I64) {
        let iv: Vec<i64> = v.iter().map(|x| *x as i64).collect();
        return Tensor::from_vec(iv, shape, dev).map_err(ce);
    }
    Tensor::from_vec(v, shape, dev)
        .and_then(|t| t.to_dtype(dtype))
        .map_err(ce)
}

/// The parameters as the passes use them: 16-bit copies of the master
/// weights under mixed precision, else the master weights themselves.
pub(crate) fn working(params: &[Tensor], dtype: DType) -> R<Vec<Tensor>> {
    // `to_dtype` to a tensor's own dtype is the tensor itself.
    params
        .iter()
        .map(|p| p.to_dtype(dtype).map_err(ce))
        .collect()
}

/// A pass's parameter gradients in the master weights' dtype (zeros where a
/// parameter got none).
pub(crate) fn master_grads(grads: Vec<Option<Tensor>>, params: &[Tensor]) -> R<Vec<Tensor>> {
    grads
        .into_iter()
        .zip(params)
        .map(|(g, p)| match g {
            Some(g) => g.to_dtype(p.dtype()).map_err(ce),
            None => p.zeros_like().map_err(ce),
        })
        .collect()
}

/// Each step's global batch, formed once by the first device that reaches the
/// step and dropped when every device of this process has taken it: the run
/// holds only the steps in flight, and devices do not repeat the work.
pub(crate) struct StepBatches {
    /// Devices of this process that take each batch.
    pub takers: usize,
    /// The source gives one batch for every step: keep it for the run.
    pub same: bool,
    pub slots: std::sync::Mutex<HashMap<usize, (Arc<Batch>, usize)>>,
    /// Batches the prefetch thread formed ahead, in step order (see
    /// [`StepBatches::prefetch`]); dropped when the devices are done, which
    /// ends that thread.
    pub ahead: std::sync::Mutex<Option<Ahead>>,
}

/// The receiving end of the prefetch thread: each step with its batch.
pub(crate) type Ahead = std::sync::mpsc::Receiver<(usize, Result<Batch, String>)>;

/// How many batches the prefetch thread forms ahead of the devices.
pub(crate) const AHEAD: usize = 2;

impl StepBatches {
    pub fn get(&self, step: usize, make: &dyn Fn(usize) -> Result<Batch, String>) -> R<Arc<Batch>> {
        let key = if self.same { 0 } else { step };
        let mut m = self.slots.lock().map_err(|_| "a device panicked")?;
        let slot = match m.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let b = self.prefetched(step).unwrap_or_else(|| make(step));
                v.insert((
                    Arc::new(b.map_err(|e| format!("step {}: {e}", step + 1))?),
                    0,
                ))
            }
        };
        slot.1 += 1;
        let b = slot.0.clone();
        if slot.1 == self.takers && !self.same {
            m.remove(&key);
        }
        Ok(b)
    }

    /// Step `step`'s batch from the prefetch thread, when it formed it.
    fn prefetched(&self, step: usize) -> Option<Result<Batch, String>> {
        let ahead = self.ahead.lock().ok()?;
        let rx = ahead.as_ref()?;
        loop {
            match rx.recv() {
                Ok((s, b)) if s == step => return Some(b),
                Ok((s, _)) if s < step => continue,
                _ => return None,
            }
        }
    }

    /// Form the batches of `steps`, in order, [`AHEAD`] ahead of the devices
    /// on a thread of `scope`, so reading a stream overlaps the steps.
    pub fn prefetch<'s, 'e: 's>(
        &'e self,
        scope: &'s std::thread::Scope<'s, 'e>,
        steps: std::ops::Range<usize>,
        make: impl Fn(usize) -> Result<Batch, String> + Send + 's,
    ) {
        if self.same || steps.is_empty() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(AHEAD);
        if let Ok(mut a) = self.ahead.lock() {
            *a = Some(rx);
        }
        scope.spawn(move || {
            for s in steps {
                let b = make(s);
                let failed = b.is_err();
                // The devices are done (the receiver is gone), or a batch
                // failed: the step that reads it reports it.
                if tx.send((s, b)).is_err() || failed {
                    break;
                }
            }
        });
    }

    /// The devices are done: the prefetch thread stops.
    pub fn stop(&self) {
        if let Ok(mut a) = self.ahead.lock() {
            a.take();
        }
    }
}

/// Initial parameter pieces by (parameter, shard index and count per dimension),
/// computed once and shared by the replicas that hold the same piece, and how
/// many of them have taken it (the last removes it).
pub(crate) type PieceCache =
    std::sync::Mutex<HashMap<PieceKey, (Arc<std::sync::OnceLock<Result<Tensor, String>>>, usize)>>;

/// A parameter piece: the parameter, and its shard index and count per
/// dimension on a device (replicas of the piece have the same key).
pub(crate) type PieceKey = (usize, Vec<(usize, usize)>);

pub(crate) fn piece_key(
    topo: &Topology,
    rank: usize,
    pi: usize,
    p: &crate::spmd::Param,
) -> PieceKey {
    (
        pi,
        p.stored
            .dims
            .iter()
            .map(|d| topo.shard_index(rank, &d.axes))
            .collect(),
    )
}

/// Optimizer slots (first and second moment) by parameter piece, shared by
/// the replicas that step it in place.
pub(crate) type SlotCache = std::sync::Mutex<HashMap<PieceKey, (Option<Tensor>, Option<Tensor>)>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{Given, Init, Values};
    use crate::types::{Dim, Poly, TType};

    /// What `piece_from` replaced: every element in f64, then `to_dtype`.
    fn old_way(v: &dyn Values, idx: &[u64], shape: &[usize], dtype: DType) -> Tensor {
        let all: Vec<f64> = idx.iter().map(|i| v.at(*i)).collect();
        let t = Tensor::from_vec(all, shape.to_vec(), &Device::Cpu).and_then(|t| t.to_dtype(dtype));
        t.expect("a tensor")
    }

    fn bits(t: &Tensor) -> Vec<u64> {
        let t = t
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::F64))
            .expect("f64");
        t.to_vec1::<f64>()
            .expect("values")
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// A piece made run by run, over two pool threads, has the bits of the
    /// f64 path for every initializer, every float dtype and a given array:
    /// runs that skip (a sharded last dimension), runs that continue one
    /// another (made as one), none, and runs of nothing.
    #[test]
    fn pieces_from_runs_have_the_bits_of_f64_then_cast() {
        crate::pool::set_threads(2);
        let t = TType::new(
            crate::ast::DType::F32,
            vec![
                Dim::replicated(Poly::constant(96)),
                Dim::replicated(Poly::constant(700)),
            ],
        );
        let given: Vec<f64> = (0..96 * 700).map(|k| (k as f64).sin() * 0.3).collect();
        // Rows 10..58 of columns 100..450: 48 runs of 350; rows 3..50 whole.
        same_bits_on(
            &t,
            &(10..58u64).map(|r| r * 700 + 100).collect::<Vec<_>>(),
            350,
            &given,
        );
        same_bits_on(
            &t,
            &(3..50u64).map(|r| r * 700).collect::<Vec<_>>(),
            700,
            &given,
        );
        same_bits_on(&t, &[5, 6, 7, 20, 21], 1, &given);
        same_bits_on(&t, &[], 5, &given);
        same_bits_on(&t, &[3, 9], 0, &given);
    }

    fn same_bits_on(t: &TType, starts: &[u64], len: usize, given: &[f64]) {
        let bound = Default::default();
        let idx: Vec<u64> = starts.iter().flat_map(|s| *s..*s + len as u64).collect();
        let shape = [starts.len(), len];
        let inits = [
            Init::Normal(0.02),
            Init::TruncatedNormal(1.5),
            Init::Lecun,
            Init::Xavier,
            Init::Uniform(0.1),
            Init::Zeros,
            Init::Constant(-0.25),
        ];
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let gens: Vec<_> = inits.iter().map(|i| i.generator(t, 77, &bound)).collect();
            let mut all: Vec<&dyn Values> = gens.iter().map(|g| g as &dyn Values).collect();
            let given = Given(given);
            all.push(&given);
            for v in all {
                let new = piece_from((starts, len), shape.to_vec(), dtype, &Device::Cpu, v);
                let new = new.expect("a piece");
                let old = old_way(v, &idx, &shape, dtype);
                assert_eq!(
                    bits(&new),
                    bits(&old),
                    "{dtype:?}, {} runs of {len}",
                    starts.len()
                );
                assert_eq!(new.dtype(), dtype);
            }
        }
    }
}
