//! The in-process virtual mesh: N devices on `std::thread`s sharing one collective
//! interface. Reductions add the group's pieces in rank order, so results are
//! bit-identical from run to run.

use super::precision::widen as wide;
use crate::mesh::{Collectives, Topology};
use candle_core::{Result, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How many times a device arriving at a barrier yields before it sleeps.
const YIELDS: usize = 50;

/// A barrier that a failing device can break, so the others return an error
/// instead of waiting forever.
struct Barrier {
    n: usize,
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
}

impl Barrier {
    fn new(n: usize) -> Barrier {
        Barrier {
            n,
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
        }
    }
    fn wait(&self) -> Result<()> {
        let Ok(mut s) = self.state.lock() else {
            return Err(candle_core::Error::Msg("mesh lock poisoned".into()));
        };
        if s.2 {
            return Err(candle_core::Error::Msg("another device stopped".into()));
        }
        let gen = s.1;
        s.0 += 1;
        if s.0 == self.n {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        // Give the cores to the devices still on their way a few times before
        // sleeping: with more devices than cores, a sleep and its wake-up
        // cost more than the wait itself.
        for _ in 0..YIELDS {
            if s.1 != gen || s.2 {
                break;
            }
            drop(s);
            std::thread::yield_now();
            s = match self.state.lock() {
                Ok(s) => s,
                Err(_) => return Err(candle_core::Error::Msg("mesh lock poisoned".into())),
            };
        }
        while s.1 == gen && !s.2 {
            s = match self.cv.wait(s) {
                Ok(s) => s,
                Err(_) => return Err(candle_core::Error::Msg("mesh lock poisoned".into())),
            };
        }
        if s.1 == gen {
            return Err(candle_core::Error::Msg("another device stopped".into()));
        }
        Ok(())
    }
    fn abort(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.2 = true;
        }
        self.cv.notify_all();
    }
}

/// Each device's share of the cores this process gets (`available_parallelism`:
/// its CPU affinity and cgroup quota): the devices of a mesh already run at
/// once (on 2 cores, 8 devices with 2 threads each ran 2-3× slower than with
/// 1). A `RAYON_NUM_THREADS` the user set is kept. Called before this process
/// starts threads.
///
/// A device that gets several threads splits its products from 2²¹
/// multiply-adds over shardc's worker pool (`prim::matmul_split`,
/// [`crate::pool`]), which never waits for a helper that has not started.
/// candle's own pool is left without workers (`CANDLE_NUM_THREADS=1` unless
/// set): it waits for every worker to check in, and beside a busy process a
/// worker on the busy core held each op up for its time slice (1-device steps
/// 1.9-2.0× slower, against 1.1× on shardc's pool). gemm's own threads stay
/// off below 2²⁴ for the products that do not pass there: they wake through
/// rayon, and the classifier's [32, 784] @ [784, 512] took 82-164 µs on 2 of
/// them against a steady 110 µs on 1.
pub fn share_cores(devices_here: usize) {
    gemm::set_threading_threshold(ONE_THREAD_BELOW);
    let set = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0);
    let each = set.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / devices_here.max(1)).max(1)
    });
    if set.is_none() {
        std::env::set_var("RAYON_NUM_THREADS", each.to_string());
    }
    crate::pool::set_threads(each);
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// Multiply-adds per gemm block (rows × a column panel × a depth panel) below
/// which a product stays on the calling thread.
const ONE_THREAD_BELOW: usize = 1 << 24;

/// Where a run's devices live: which of them this process runs, the collectives
/// they speak, and how the run's processes meet for host-side work (FDO files).
/// The in-process mesh runs every device here; the MPI backend one per process.
pub trait Cluster {
    /// The collectives of a mesh with this topology.
    fn connect(&self, topo: &Topology) -> std::result::Result<Box<dyn Collectives + '_>, String>;
    /// The devices (ranks) this process runs.
    fn local_ranks(&self, topo: &Topology) -> Vec<usize>;
    /// This process's index among the run's processes, and how many there are.
    fn process(&self) -> (usize, usize) {
        (0, 1)
    }
    /// Every process of the run arrives before any goes on.
    fn host_barrier(&self) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Every process's `v` (all of one length), added element by element in
    /// process order, into `v` on each: host-side figures of the whole run
    /// (a profile's node times). One process: `v` as it is.
    fn host_sum(&self, _v: &mut [f64]) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Every device of the mesh on a thread of this process (the default).
pub struct InProcess;

impl Cluster for InProcess {
    fn connect(&self, topo: &Topology) -> std::result::Result<Box<dyn Collectives + '_>, String> {
        Ok(Box::new(Comm::new(topo.clone())))
    }
    fn local_ranks(&self, topo: &Topology) -> Vec<usize> {
        (0..topo.devices()).collect()
    }
}

/// A group's shared result and how many members have yet to take it.
type Shared = (Option<Tensor>, usize);

/// Shared state for collectives: a slot per device, and a barrier per group of
/// devices that communicate, so that groups proceed independently (the stages
/// of a pipeline run different layers at the same time).
pub struct Comm {
    pub topo: Topology,
    slots: Mutex<Vec<Option<Tensor>>>,
    barriers: Mutex<HashMap<Vec<usize>, Arc<Barrier>>>,
    /// Per group, the result its first member computed for everyone (see
    /// [`Comm::shared`]; `None` when that computation failed) and how many
    /// members have yet to take it (the last removes it, so a result, which
    /// may be a whole gradient, lives no longer than its users hold it).
    results: Mutex<HashMap<Vec<usize>, Shared>>,
    aborted: AtomicBool,
    /// Point-to-point messages not yet taken, keyed by (receiver, sender,
    /// tag); `mail_cv` wakes a receiver when one arrives or a device fails.
    mail: Mutex<HashMap<(usize, usize, u32), Tensor>>,
    mail_cv: Condvar,
}

impl Comm {
    pub fn new(topo: Topology) -> Comm {
        let n = topo.devices();
        Comm {
            topo,
            slots: Mutex::new(vec![None; n]),
            barriers: Mutex::new(HashMap::new()),
            results: Mutex::new(HashMap::new()),
            aborted: AtomicBool::new(false),
            mail: Mutex::new(HashMap::new()),
            mail_cv: Condvar::new(),
        }
    }

    fn barrier_of(&self, group: &[usize]) -> Result<Arc<Barrier>> {
        let mut m = self
            .barriers
            .lock()
            .map_err(|_| candle_core::Error::Msg("mesh lock poisoned".into()))?;
        let b = m
            .entry(group.to_vec())
            .or_insert_with(|| Arc::new(Barrier::new(group.len())))
            .clone();
        if self.aborted.load(Ordering::SeqCst) {
            b.abort();
        }
        Ok(b)
    }

    /// Post a tensor, then read what `pick` selects from the group's posts (a
    /// view of the slots, in group order), then release the slots.
    fn with_group<T>(
        &self,
        rank: usize,
        t: &Tensor,
        axes: &[String],
        pick: impl FnOnce(&[&Tensor]) -> Result<T>,
    ) -> Result<T> {
        let group = self.topo.group(rank, axes);
        let barrier = self.barrier_of(&group)?;
        self.post(rank, Some(t.clone()));
        barrier.wait()?;
        // Only this group reads these slots, and nobody in it overwrites one until
        // everyone has read (the second wait).
        let out = self.read_posts(&group, pick);
        barrier.wait()?;
        // Everyone has read this device's post: release it (it may be a whole
        // gradient) instead of holding it until this device's next collective.
        self.post(rank, None);
        out
    }

    /// The rank of member `i` of `rank`'s group along `axis`.
    fn member(&self, rank: usize, axis: &str, i: usize) -> Result<usize> {
        let group = self.topo.group(rank, &[axis.to_string()]);
        group.get(i).copied().ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "no member {i} on the axis {axis} ({} devices)",
                group.len()
            ))
        })
    }

    /// Put (or clear) this device's post in its slot.
    fn post(&self, rank: usize, t: Option<Tensor>) {
        if let Ok(mut s) = self.slots.lock() {
            s[rank] = t;
        }
    }

    /// `f` of the group's posts, in group order.
    fn read_posts<T>(&self, group: &[usize], f: impl FnOnce(&[&Tensor]) -> Result<T>) -> Result<T> {
        let posted: Vec<Tensor> = match self.slots.lock() {
            Ok(s) => group.iter().filter_map(|r| s[*r].clone()).collect(),
            Err(_) => vec![],
        };
        let refs: Vec<&Tensor> = posted.iter().collect();
        if refs.len() == group.len() {
            f(&refs)
        } else {
            Err(candle_core::Error::Msg("a device's slot was lost".into()))
        }
    }

    /// As [`Comm::with_group`] for a result that is the same on every member (a
    /// gather, a sum): the group's first member computes it once and the others
    /// take the same tensor, instead of each computing identical bits (tensors
    /// are immutable; nothing in a step writes into a collective's result).
    fn shared(
        &self,
        rank: usize,
        t: &Tensor,
        axes: &[String],
        compute: impl FnOnce(&[&Tensor]) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let poisoned = || candle_core::Error::Msg("mesh lock poisoned".into());
        let group = self.topo.group(rank, axes);
        let barrier = self.barrier_of(&group)?;
        self.post(rank, Some(t.clone()));
        barrier.wait()?;
        let leader = group.first() == Some(&rank);
        let mut failure = None;
        if leader {
            // Every member has taken this group's previous result: each has
            // posted for this collective.
            let kept = match self.read_posts(&group, compute) {
                Ok(y) => Some(y),
                Err(e) => {
                    failure = Some(e);
                    None
                }
            };
            self.results
                .lock()
                .map_err(|_| poisoned())?
                .insert(group.clone(), (kept, group.len()));
        }
        barrier.wait()?;
        self.post(rank, None);
        let got = {
            let mut m = self.results.lock().map_err(|_| poisoned())?;
            let (got, last) = match m.get_mut(&group) {
                Some((y, left)) => {
                    *left = left.saturating_sub(1);
                    (y.clone(), *left == 0)
                }
                None => (None, false),
            };
            if last {
                m.remove(&group);
            }
            got
        };
        if let Some(e) = failure {
            return Err(e);
        }
        got.ok_or_else(|| candle_core::Error::Msg("another device's collective failed".into()))
    }
}

fn poisoned() -> candle_core::Error {
    candle_core::Error::Msg("mesh lock poisoned".into())
}

/// From this many elements up, `psum` reduces in chunks (each member adds its
/// own slice of every member's tensor, then the slices are gathered): 1/n of the
/// additions and of the temporaries, for one more exchange.
const CHUNKED_PSUM_MIN: usize = 1 << 16;

impl Collectives for Comm {
    fn topo(&self) -> &Topology {
        &self.topo
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        if let Ok(m) = self.barriers.lock() {
            for b in m.values() {
                b.abort();
            }
        }
        // Taking the lock orders the flag before a receiver's next check.
        drop(self.mail.lock());
        self.mail_cv.notify_all();
    }

    fn send(&self, rank: usize, t: &Tensor, axis: &str, to: usize, tag: u32) -> Result<()> {
        let to = self.member(rank, axis, to)?;
        let mut m = self.mail.lock().map_err(|_| poisoned())?;
        if m.insert((to, rank, tag), t.clone()).is_some() {
            return Err(candle_core::Error::Msg(format!(
                "device {rank} sent message {tag} to device {to} twice"
            )));
        }
        drop(m);
        self.mail_cv.notify_all();
        Ok(())
    }

    fn recv(
        &self,
        rank: usize,
        _like: &Tensor,
        axis: &str,
        from: usize,
        tag: u32,
    ) -> Result<Tensor> {
        let from = self.member(rank, axis, from)?;
        let mut m = self.mail.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(t) = m.remove(&(rank, from, tag)) {
                return Ok(t);
            }
            if self.aborted.load(Ordering::SeqCst) {
                return Err(candle_core::Error::Msg("another device stopped".into()));
            }
            m = self.mail_cv.wait(m).map_err(|_| poisoned())?;
        }
    }

    fn barrier(&self) -> Result<()> {
        let all: Vec<usize> = (0..self.topo.devices()).collect();
        self.barrier_of(&all)?.wait()
    }

    fn gather_to_first(&self, rank: usize, t: &Tensor) -> Result<Option<Vec<Tensor>>> {
        let all: Vec<String> = self.topo.axes.iter().map(|a| a.0.clone()).collect();
        self.with_group(rank, t, &all, |parts| {
            // The group over every axis is every rank, in rank order.
            Ok((rank == 0).then(|| parts.iter().map(|p| (*p).clone()).collect()))
        })
    }

    fn psum(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor> {
        if axes.iter().all(|a| self.topo.size(a) == 1) {
            return Ok(t.clone());
        }
        let group = self.topo.group(rank, axes);
        let (n, total) = (group.len(), t.elem_count());
        if total >= CHUNKED_PSUM_MIN && total >= n {
            // Every element is still added in group order, so the result has
            // the same bits as the whole-tensor sum below.
            let me = group
                .iter()
                .position(|r| *r == rank)
                .ok_or_else(|| candle_core::Error::Msg("device outside its group".into()))?;
            let (a, b) = (me * total / n, (me + 1) * total / n);
            let flat = t.flatten_all()?;
            let mine = self.with_group(rank, &flat, axes, |parts| {
                let mut acc = wide(&parts[0].narrow(0, a, b - a)?)?;
                for p in &parts[1..] {
                    acc = (acc + wide(&p.narrow(0, a, b - a)?)?)?;
                }
                acc.to_dtype(t.dtype())
            })?;
            let whole = self.shared(rank, &mine, axes, |parts| Tensor::cat(parts, 0))?;
            return whole.reshape(t.shape());
        }
        self.shared(rank, t, axes, |parts| {
            let mut acc = wide(parts[0])?;
            for p in &parts[1..] {
                acc = (acc + wide(p)?)?;
            }
            acc.to_dtype(t.dtype())
        })
    }

    fn pmax(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor> {
        if axes.iter().all(|a| self.topo.size(a) == 1) {
            return Ok(t.clone());
        }
        self.shared(rank, t, axes, |parts| {
            let mut acc = parts[0].clone();
            for p in &parts[1..] {
                acc = acc.maximum(*p)?;
            }
            Ok(acc)
        })
    }

    fn all_gather(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor> {
        if self.topo.size(axis) == 1 {
            return Ok(t.clone());
        }
        self.shared(rank, t, &[axis.to_string()], |parts| {
            Tensor::cat(parts, dim)
        })
    }

    fn psum_scatter(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor> {
        let n = self.topo.size(axis);
        if n == 1 {
            return Ok(t.clone());
        }
        // Chunked: each device adds only its own piece of every member's tensor
        // (1/n of the work of an all-reduce), in rank order.
        let i = self.topo.coord(rank, axis);
        self.with_group(rank, t, &[axis.to_string()], |parts| {
            let len = parts[0].dims()[dim] / n;
            let mut acc = wide(&parts[0].narrow(dim, i * len, len)?)?;
            for p in &parts[1..] {
                acc = (acc + wide(&p.narrow(dim, i * len, len)?)?)?;
            }
            acc.to_dtype(t.dtype())
        })
    }

    fn all_to_all(
        &self,
        rank: usize,
        t: &Tensor,
        axis: &str,
        split: usize,
        concat: usize,
    ) -> Result<Tensor> {
        let n = self.topo.size(axis);
        if n == 1 {
            return Ok(t.clone());
        }
        // Take piece i (this device's index) of every member's tensor.
        let i = self.topo.coord(rank, axis);
        self.with_group(rank, t, &[axis.to_string()], |parts| {
            let len = parts[0].dims()[split] / n;
            let mine: Vec<Tensor> = parts
                .iter()
                .map(|p| p.narrow(split, i * len, len))
                .collect::<Result<_>>()?;
            Tensor::cat(&mine, concat)
        })
    }

    fn ppermute(&self, rank: usize, t: &Tensor, axis: &str, shift: i64) -> Result<Tensor> {
        let n = self.topo.size(axis) as i64;
        if n == 1 {
            return Ok(t.clone());
        }
        let i = self.topo.coord(rank, axis) as i64;
        let from = (i - shift).rem_euclid(n) as usize;
        self.with_group(
            rank,
            t,
            &[axis.to_string()],
            |parts| Ok(parts[from].clone()),
        )
    }
}
