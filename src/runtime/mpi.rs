//! The multi-process backend: one device per MPI process, on one machine or
//! many (`mpirun -np 8 shardc run FILE --backend mpi`). It implements the same
//! [`Collectives`] as the in-process mesh, so the lowering and the executor do
//! not change, and it reduces in the same order: every element is added in rank
//! order within its group, so an MPI run's losses have the same bits as the
//! virtual mesh's. Open MPI picks the transport (shared memory, TCP,
//! InfiniBand); nothing here speaks to a network itself.

use super::mesh::Cluster;
use crate::mesh::{Collectives, Topology};
use candle_core::{DType, Result, Tensor, WithDType};
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;
use std::collections::HashMap;

fn err(msg: impl Into<String>) -> candle_core::Error {
    candle_core::Error::Msg(msg.into())
}

/// MPI, initialised for this process; finalised when dropped.
pub struct Mpi {
    // Dropping the universe finalises MPI: it must outlive every communicator.
    world: SimpleCommunicator,
    local: usize,
    _universe: Universe,
}

impl Mpi {
    /// Initialise MPI. Device threads make the calls (one at a time), so the
    /// library must allow calls from a thread other than the main one.
    pub fn init() -> std::result::Result<Mpi, String> {
        let (universe, got) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or("MPI was already initialised in this process")?;
        if got < Threading::Serialized {
            return Err(format!(
                "this MPI library gives thread support {got:?}; shardc needs calls from a worker thread (MPI_THREAD_SERIALIZED)"
            ));
        }
        let world = universe.world();
        // Made once here: splitting is a collective every process must join.
        let local = world.split_shared(world.rank()).size() as usize;
        Ok(Mpi {
            world,
            local,
            _universe: universe,
        })
    }

    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// Processes of this run on this machine (they share its memory).
    pub fn local_size(&self) -> usize {
        self.local
    }

    /// Stop every process of the run (after this one has said why).
    pub fn abort(&self) -> ! {
        self.world.abort(1)
    }
}

impl Cluster for Mpi {
    fn connect(&self, topo: &Topology) -> std::result::Result<Box<dyn Collectives + '_>, String> {
        if topo.devices() != self.size() {
            return Err(format!(
                "the mesh has {} devices but MPI started {} processes; start one process per device (`mpirun -np {} ...`)",
                topo.devices(),
                self.size(),
                topo.devices()
            ));
        }
        MpiComm::new(&self.world, topo.clone()).map(|c| Box::new(c) as Box<dyn Collectives>)
    }

    fn local_ranks(&self, _topo: &Topology) -> Vec<usize> {
        vec![self.rank()]
    }

    fn process(&self) -> (usize, usize) {
        (self.rank(), self.size())
    }

    fn host_barrier(&self) -> std::result::Result<(), String> {
        self.world.barrier();
        Ok(())
    }

    fn host_sum(&self, v: &mut [f64]) -> std::result::Result<(), String> {
        let mut all = vec![0.0f64; v.len() * self.size()];
        self.world.all_gather_into(&v[..], &mut all[..]);
        v.fill(0.0);
        for part in all.chunks(v.len().max(1)) {
            for (x, y) in v.iter_mut().zip(part) {
                *x += y;
            }
        }
        Ok(())
    }
}

/// The collectives over MPI. Every group a collective can name (the devices
/// that differ only along some mesh axes, ordered by their index along them) has
/// its communicator, made when the run starts: making one is itself a collective
/// over every process, and later the pipeline's stages no longer call
/// collectives in the same order.
pub struct MpiComm<'a> {
    topo: Topology,
    rank: usize,
    world: &'a SimpleCommunicator,
    groups: HashMap<Vec<String>, SimpleCommunicator>,
    /// Point-to-point sends not yet known to be complete, each with its
    /// buffer (see [`Collectives::send`]).
    sends: std::sync::Mutex<Vec<Box<dyn Sending>>>,
}

/// An `MPI_Isend` in flight and the buffer it reads, which lives until it
/// completes.
trait Sending {
    /// Whether it has completed (then it may be dropped).
    fn done(&mut self) -> bool;
    /// Wait until it completes.
    fn wait(&mut self);
}

struct Sent<T: Wire> {
    request: Option<mpi::request::Request<'static, [T]>>,
    // Read by MPI through `request`; dropped only after it completes.
    _buf: Box<[T]>,
}

impl<T: Wire> Sending for Sent<T> {
    fn done(&mut self) -> bool {
        match self.request.take().map(|r| r.test()) {
            Some(Err(r)) => {
                self.request = Some(r);
                false
            }
            Some(Ok(_)) | None => true,
        }
    }
    fn wait(&mut self) {
        if let Some(r) = self.request.take() {
            r.wait();
        }
    }
}

impl Drop for MpiComm<'_> {
    /// A send still in flight keeps its buffer until it completes (MPI reads
    /// it; dropping the request unfinished would abort).
    fn drop(&mut self) {
        if let Ok(mut s) = self.sends.lock() {
            s.iter_mut().for_each(|x| x.wait());
        }
    }
}

/// Start sending `t` to member `to` of `g` with `tag`.
fn send_t<T: Wire>(
    g: &SimpleCommunicator,
    t: &Tensor,
    to: usize,
    tag: i32,
) -> Result<Box<dyn Sending>> {
    let buf: Box<[T]> = t.flatten_all()?.to_vec1::<T>()?.into_boxed_slice();
    // SAFETY: the slice lives in `buf`'s heap allocation, which does not move
    // when the box does and is dropped only after the request completes
    // (`Sent` is dropped once `done` says so, or after `wait`).
    let view: &'static [T] = unsafe { &*(buf.as_ref() as *const [T]) };
    let request =
        g.process_at_rank(to as i32)
            .immediate_send_with_tag(mpi::request::StaticScope, view, tag);
    Ok(Box::new(Sent {
        request: Some(request),
        _buf: buf,
    }))
}

/// Take the message member `from` of `g` sent with `tag`, shaped like `like`.
fn recv_t<T: Wire>(g: &SimpleCommunicator, like: &Tensor, from: usize, tag: i32) -> Result<Tensor> {
    let mut got = vec![T::zero(); like.elem_count()];
    g.process_at_rank(from as i32)
        .receive_into_with_tag(&mut got[..], tag);
    Tensor::from_vec(got, like.shape(), like.device())
}

// Communicators are handles into the MPI library, which was initialised for
// calls from any one thread at a time; this process runs one device, whose
// thread is the only one that calls.
unsafe impl Sync for MpiComm<'_> {}

/// Every ordering of every subset of `axes`.
fn arrangements(axes: &[String]) -> Vec<Vec<String>> {
    let mut out = vec![vec![]];
    let mut frontier = vec![vec![]];
    for _ in 0..axes.len() {
        let mut next = Vec::new();
        for a in &frontier {
            for x in axes {
                if !a.contains(x) {
                    let mut b: Vec<String> = a.clone();
                    b.push(x.clone());
                    next.push(b);
                }
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}

impl<'a> MpiComm<'a> {
    fn new(world: &'a SimpleCommunicator, topo: Topology) -> std::result::Result<Self, String> {
        let rank = world.rank() as usize;
        // Axes of size 1 do not change a group.
        let live: Vec<String> = topo
            .axes
            .iter()
            .filter(|a| a.1 > 1)
            .map(|a| a.0.clone())
            .collect();
        let mut groups = HashMap::new();
        for axes in arrangements(&live).into_iter().filter(|a| !a.is_empty()) {
            // The group's colour: its lowest rank; its order: the index along `axes`.
            let members = topo.group(rank, &axes);
            let color = members.iter().copied().min().unwrap_or(rank) as i32;
            let key = topo.shard_index(rank, &axes).0 as i32;
            let c = world
                .split_by_color_with_key(Color::with_value(color), key)
                .ok_or("MPI did not make a communicator for a group of devices")?;
            groups.insert(axes, c);
        }
        Ok(MpiComm {
            topo,
            rank,
            world,
            groups,
            sends: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The communicator of `axes` (in that order), or `None` when every axis
    /// has size 1 (the group is this device alone).
    fn group(&self, axes: &[String]) -> Result<Option<&SimpleCommunicator>> {
        let live: Vec<String> = axes
            .iter()
            .filter(|a| self.topo.size(a) > 1)
            .cloned()
            .collect();
        if live.is_empty() {
            return Ok(None);
        }
        self.groups
            .get(&live)
            .map(Some)
            .ok_or_else(|| err(format!("no communicator for the axes {live:?}")))
    }

    /// The communicator of `axis` and the MPI tag of a point-to-point
    /// message labelled `tag` (shifted by one: tag 0 stays with
    /// `ppermute`'s exchanges).
    fn peers(&self, axis: &str, tag: u32) -> Result<(&SimpleCommunicator, i32)> {
        let g = self.group(&[axis.to_string()])?.ok_or_else(|| {
            err(format!(
                "no other device on the axis {axis} to exchange with"
            ))
        })?;
        let tag = tag
            .checked_add(1)
            .and_then(|t| i32::try_from(t).ok())
            .ok_or_else(|| err("a message tag is too large"))?;
        Ok((g, tag))
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank == self.rank {
            Ok(())
        } else {
            Err(err(format!(
                "device {rank} asked MPI process {} to communicate for it",
                self.rank
            )))
        }
    }
}

fn count(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| err(format!("{n} elements are too many for one MPI message")))
}

/// Prefix sums: where each of `counts` starts.
fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// The element types that cross processes.
trait Wire: WithDType + Equivalence {}
impl Wire for f32 {}
impl Wire for f64 {}
impl Wire for i64 {}
impl Wire for u32 {}
impl Wire for u8 {}

/// A 16-bit float tensor (mixed precision) as f32 for the wire, where sums
/// also accumulate; `None` for a type that crosses as it is.
fn widened(t: &Tensor) -> Result<Option<Tensor>> {
    if super::precision::is_half(t.dtype()) {
        super::precision::widen(t).map(Some)
    } else {
        Ok(None)
    }
}

/// Run `f` with `T` the Rust type of `dt`.
macro_rules! by_dtype {
    ($dt:expr, $f:ident ( $($arg:expr),* )) => {
        match $dt {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::U32 => $f::<u32>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            other => Err(err(format!("the MPI backend does not move {other:?} tensors"))),
        }
    };
}

/// Every member's flat tensor, in group order (each the same length).
fn gather_all<T: Wire>(g: &SimpleCommunicator, t: &Tensor) -> Result<Vec<Tensor>> {
    let mine: Vec<T> = t.flatten_all()?.to_vec1()?;
    let n = g.size() as usize;
    if mine.is_empty() {
        // Every member's piece has this (empty) shape too.
        return Ok(vec![t.clone(); n]);
    }
    let mut all = vec![T::zero(); mine.len() * n];
    g.all_gather_into(&mine[..], &mut all[..]);
    let dev = t.device();
    all.chunks(mine.len())
        .map(|c| Tensor::from_vec(c.to_vec(), t.shape(), dev))
        .collect()
}

/// Send piece j of `pieces` to member j; what arrives from each member, in
/// group order (pieces may differ in length; counts are exchanged first).
fn exchange<T: Wire>(g: &SimpleCommunicator, pieces: &[Tensor]) -> Result<Vec<Vec<T>>> {
    let flat: Vec<Vec<T>> = pieces
        .iter()
        .map(|p| p.flatten_all().and_then(|f| f.to_vec1()))
        .collect::<Result<_>>()?;
    let send_counts: Vec<i32> = flat.iter().map(|p| count(p.len())).collect::<Result<_>>()?;
    let mut recv_counts = vec![0i32; send_counts.len()];
    g.all_to_all_into(&send_counts[..], &mut recv_counts[..]);
    let send: Vec<T> = flat.concat();
    let mut recv = vec![T::zero(); recv_counts.iter().map(|c| *c as usize).sum()];
    {
        let sd = displs(&send_counts);
        let rd = displs(&recv_counts);
        let sp = Partition::new(&send[..], &send_counts[..], &sd[..]);
        let mut rp = PartitionMut::new(&mut recv[..], &recv_counts[..], &rd[..]);
        g.all_to_all_varcount_into(&sp, &mut rp);
    }
    let mut out = Vec::with_capacity(recv_counts.len());
    let mut at = 0;
    for c in recv_counts {
        out.push(recv[at..at + c as usize].to_vec());
        at += c as usize;
    }
    Ok(out)
}

/// Ordered sum over the group: each member adds its own slice of every member's
/// tensor (in group order), then the slices are gathered. Element by element
/// this is the same sum, in the same order, as the in-process mesh's.
fn psum_t<T: Wire>(g: &SimpleCommunicator, me: usize, t: &Tensor) -> Result<Tensor> {
    let n = g.size() as usize;
    let total = t.elem_count();
    let flat = t.flatten_all()?;
    let bounds: Vec<(usize, usize)> = (0..n)
        .map(|j| (j * total / n, (j + 1) * total / n))
        .collect();
    let pieces: Vec<Tensor> = bounds
        .iter()
        .map(|(a, b)| flat.narrow(0, *a, b - a))
        .collect::<Result<_>>()?;
    let got = exchange::<T>(g, &pieces)?;
    let dev = t.device();
    let mut acc: Option<Tensor> = None;
    for v in got {
        let len = v.len();
        let p = Tensor::from_vec(v, len, dev)?;
        acc = Some(match acc {
            None => p,
            Some(a) => (a + p)?,
        });
    }
    let mine: Vec<T> = match acc {
        Some(a) => a.to_vec1()?,
        None => vec![],
    };
    let counts: Vec<i32> = bounds
        .iter()
        .map(|(a, b)| count(b - a))
        .collect::<Result<_>>()?;
    let d = displs(&counts);
    let mut whole = vec![T::zero(); total];
    if mine.len() != counts[me] as usize {
        return Err(err("a reduced slice has the wrong length"));
    }
    {
        let mut rp = PartitionMut::new(&mut whole[..], &counts[..], &d[..]);
        g.all_gather_varcount_into(&mine[..], &mut rp);
    }
    Tensor::from_vec(whole, t.shape(), dev)
}

fn pmax_t<T: Wire>(g: &SimpleCommunicator, t: &Tensor) -> Result<Tensor> {
    let parts = gather_all::<T>(g, t)?;
    let mut acc = parts[0].clone();
    for p in &parts[1..] {
        acc = acc.maximum(p)?;
    }
    Ok(acc)
}

fn all_gather_t<T: Wire>(g: &SimpleCommunicator, t: &Tensor, dim: usize) -> Result<Tensor> {
    let parts = gather_all::<T>(g, &t.contiguous()?)?;
    Tensor::cat(&parts, dim)
}

/// Split `dim` into group-size pieces, piece j to member j; the pieces that
/// arrive, in group order, shaped like this device's piece `me`.
fn scatter_pieces<T: Wire>(g: &SimpleCommunicator, t: &Tensor, dim: usize) -> Result<Vec<Tensor>> {
    let n = g.size() as usize;
    let len = t.dims()[dim] / n;
    let pieces: Vec<Tensor> = (0..n)
        .map(|j| t.narrow(dim, j * len, len))
        .collect::<Result<_>>()?;
    let shape = pieces[0].shape().clone();
    let dev = t.device();
    exchange::<T>(g, &pieces)?
        .into_iter()
        .map(|v| Tensor::from_vec(v, &shape, dev))
        .collect()
}

fn psum_scatter_t<T: Wire>(g: &SimpleCommunicator, t: &Tensor, dim: usize) -> Result<Tensor> {
    let parts = scatter_pieces::<T>(g, t, dim)?;
    let mut acc = parts[0].clone();
    for p in &parts[1..] {
        acc = (acc + p)?;
    }
    Ok(acc)
}

fn all_to_all_t<T: Wire>(
    g: &SimpleCommunicator,
    t: &Tensor,
    split: usize,
    concat: usize,
) -> Result<Tensor> {
    let parts = scatter_pieces::<T>(g, t, split)?;
    Tensor::cat(&parts, concat)
}

fn ppermute_t<T: Wire>(
    g: &SimpleCommunicator,
    t: &Tensor,
    to: usize,
    from: usize,
) -> Result<Tensor> {
    let mine: Vec<T> = t.flatten_all()?.to_vec1()?;
    let mut got = vec![T::zero(); mine.len()];
    mpi::point_to_point::send_receive_into(
        &mine[..],
        &g.process_at_rank(to as i32),
        &mut got[..],
        &g.process_at_rank(from as i32),
    );
    Tensor::from_vec(got, t.shape(), t.device())
}

/// Every rank's tensor on rank 0, whatever their shapes (a pipeline stage holds
/// an empty piece of another stage's parameter).
fn gather_first_t<T: Wire>(w: &SimpleCommunicator, t: &Tensor) -> Result<Option<Vec<Tensor>>> {
    const MAX_RANK: usize = 8;
    if t.rank() > MAX_RANK {
        return Err(err(
            "the MPI backend gathers tensors of at most 8 dimensions",
        ));
    }
    let mut head = vec![t.rank() as u64];
    head.extend(t.dims().iter().map(|d| *d as u64));
    head.resize(MAX_RANK + 1, 0);
    let mine: Vec<T> = t.flatten_all()?.to_vec1()?;
    let root = w.process_at_rank(0);
    if w.rank() != 0 {
        root.gather_into(&head[..]);
        root.gather_varcount_into(&mine[..]);
        return Ok(None);
    }
    let n = w.size() as usize;
    let mut heads = vec![0u64; n * (MAX_RANK + 1)];
    root.gather_into_root(&head[..], &mut heads[..]);
    let shapes: Vec<Vec<usize>> = heads
        .chunks(MAX_RANK + 1)
        .map(|h| h[1..=h[0] as usize].iter().map(|d| *d as usize).collect())
        .collect();
    let counts: Vec<i32> = shapes
        .iter()
        .map(|s| count(s.iter().product()))
        .collect::<Result<_>>()?;
    let d = displs(&counts);
    let mut all = vec![T::zero(); counts.iter().map(|c| *c as usize).sum()];
    {
        let mut rp = PartitionMut::new(&mut all[..], &counts[..], &d[..]);
        root.gather_varcount_into_root(&mine[..], &mut rp);
    }
    let dev = t.device();
    shapes
        .iter()
        .zip(counts.iter().zip(&d))
        .map(|(s, (c, at))| {
            let (c, at) = (*c as usize, *at as usize);
            Tensor::from_vec(all[at..at + c].to_vec(), s.as_slice(), dev)
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

impl Collectives for MpiComm<'_> {
    fn topo(&self) -> &Topology {
        &self.topo
    }

    fn psum(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self.psum(rank, &w, axes)?.to_dtype(t.dtype());
        }
        let Some(g) = self.group(axes)? else {
            return Ok(t.clone());
        };
        let me = self.topo.shard_index(rank, axes).0;
        by_dtype!(t.dtype(), psum_t(g, me, t))
    }

    fn pmax(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self.pmax(rank, &w, axes)?.to_dtype(t.dtype());
        }
        let Some(g) = self.group(axes)? else {
            return Ok(t.clone());
        };
        by_dtype!(t.dtype(), pmax_t(g, t))
    }

    fn all_gather(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self.all_gather(rank, &w, axis, dim)?.to_dtype(t.dtype());
        }
        let Some(g) = self.group(&[axis.to_string()])? else {
            return Ok(t.clone());
        };
        by_dtype!(t.dtype(), all_gather_t(g, t, dim))
    }

    fn psum_scatter(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self.psum_scatter(rank, &w, axis, dim)?.to_dtype(t.dtype());
        }
        let Some(g) = self.group(&[axis.to_string()])? else {
            return Ok(t.clone());
        };
        by_dtype!(t.dtype(), psum_scatter_t(g, t, dim))
    }

    fn all_to_all(
        &self,
        rank: usize,
        t: &Tensor,
        axis: &str,
        split: usize,
        concat: usize,
    ) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self
                .all_to_all(rank, &w, axis, split, concat)?
                .to_dtype(t.dtype());
        }
        let Some(g) = self.group(&[axis.to_string()])? else {
            return Ok(t.clone());
        };
        by_dtype!(t.dtype(), all_to_all_t(g, t, split, concat))
    }

    fn ppermute(&self, rank: usize, t: &Tensor, axis: &str, shift: i64) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self.ppermute(rank, &w, axis, shift)?.to_dtype(t.dtype());
        }
        let Some(g) = self.group(&[axis.to_string()])? else {
            return Ok(t.clone());
        };
        let n = self.topo.size(axis) as i64;
        let i = self.topo.coord(rank, axis) as i64;
        let to = (i + shift).rem_euclid(n) as usize;
        let from = (i - shift).rem_euclid(n) as usize;
        by_dtype!(t.dtype(), ppermute_t(g, t, to, from))
    }

    fn send(&self, rank: usize, t: &Tensor, axis: &str, to: usize, tag: u32) -> Result<()> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self.send(rank, &w, axis, to, tag);
        }
        let (g, tag) = self.peers(axis, tag)?;
        let sending = by_dtype!(t.dtype(), send_t(g, t, to, tag))?;
        let mut s = self
            .sends
            .lock()
            .map_err(|_| err("the MPI send list's lock is poisoned"))?;
        s.retain_mut(|x| !x.done());
        s.push(sending);
        Ok(())
    }

    fn recv(
        &self,
        rank: usize,
        like: &Tensor,
        axis: &str,
        from: usize,
        tag: u32,
    ) -> Result<Tensor> {
        self.check_rank(rank)?;
        if let Some(w) = widened(like)? {
            return self.recv(rank, &w, axis, from, tag)?.to_dtype(like.dtype());
        }
        let (g, tag) = self.peers(axis, tag)?;
        by_dtype!(like.dtype(), recv_t(g, like, from, tag))
    }

    fn gather_to_first(&self, rank: usize, t: &Tensor) -> Result<Option<Vec<Tensor>>> {
        self.check_rank(rank)?;
        if let Some(w) = widened(t)? {
            return self
                .gather_to_first(rank, &w)?
                .map(|v| v.iter().map(|x| x.to_dtype(t.dtype())).collect())
                .transpose();
        }
        by_dtype!(t.dtype(), gather_first_t(self.world, t))
    }

    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }

    /// A failing process says why, then stops the run with `MPI_Abort` (the
    /// command line does both); nothing to break here.
    fn abort(&self) {}
}

#[cfg(test)]
mod tests {
    use super::arrangements;

    #[test]
    fn every_ordering_of_every_subset() {
        let axes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let all = arrangements(&axes);
        // 1 empty + 3 + 6 + 6
        assert_eq!(all.len(), 16);
        assert!(all.contains(&vec!["c".to_string(), "a".to_string()]));
    }
}
