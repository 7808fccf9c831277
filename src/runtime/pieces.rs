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
    let Some(pl) = pl else {
        return init::global_indices(topo, rank, &p.stored, &prog.bound)
            .map_err(crate::fault::Fault::Shape);
    };
    let shape = prog.local_shape(&p.stored)?;
    let (rows, d) = (
        shape[0] as usize,
        shape.get(1).copied().unwrap_or(1) as usize,
    );
    let owner = topo.shard_index(rank, &p.stored.dims[0].axes).0;
    let mut idx = Vec::with_capacity(rows * d);
    for r in 0..rows {
        let id = pl.id_at(owner, r);
        idx.extend((0..d as u64).map(|c| id * d as u64 + c));
    }
    Ok(idx)
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
