//! The in-process virtual mesh: N devices on `std::thread`s sharing one collective
//! interface. Reductions add the group's pieces in rank order, so results are
//! bit-identical from run to run.

use candle_core::{Result, Tensor};
use std::sync::{Condvar, Mutex};

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

/// Mesh axes (major first) and the coordinates of each rank (row-major).
#[derive(Clone, Debug)]
pub struct Topology {
    pub axes: Vec<(String, usize)>,
}

impl Topology {
    pub fn devices(&self) -> usize {
        self.axes.iter().map(|a| a.1).product()
    }
    pub fn size(&self, axis: &str) -> usize {
        self.axes.iter().find(|a| a.0 == axis).map_or(1, |a| a.1)
    }
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        let mut c = vec![0; self.axes.len()];
        let mut r = rank;
        for (i, (_, n)) in self.axes.iter().enumerate().rev() {
            c[i] = r % n;
            r /= n;
        }
        c
    }
    pub fn coord(&self, rank: usize, axis: &str) -> usize {
        let i = self.axes.iter().position(|a| a.0 == axis);
        i.map_or(0, |i| self.coords(rank)[i])
    }
    /// Index of `rank` among the devices that split a dimension over `axes`
    /// (major first), and how many pieces there are.
    pub fn shard_index(&self, rank: usize, axes: &[String]) -> (usize, usize) {
        let mut idx = 0;
        let mut n = 1;
        for a in axes {
            let s = self.size(a);
            idx = idx * s + self.coord(rank, a);
            n *= s;
        }
        (idx, n)
    }
    /// The ranks that differ from `rank` only along `axes`, ordered by their index
    /// along those axes.
    pub fn group(&self, rank: usize, axes: &[String]) -> Vec<usize> {
        let me = self.coords(rank);
        let mut out: Vec<(usize, usize)> = (0..self.devices())
            .filter(|&r| {
                let c = self.coords(r);
                self.axes
                    .iter()
                    .enumerate()
                    .all(|(i, (a, _))| axes.contains(a) || c[i] == me[i])
            })
            .map(|r| (self.shard_index(r, axes).0, r))
            .collect();
        out.sort();
        out.into_iter().map(|x| x.1).collect()
    }
}

/// Shared state for collectives: a slot per device and a barrier.
pub struct Comm {
    pub topo: Topology,
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

impl Comm {
    pub fn new(topo: Topology) -> Comm {
        let n = topo.devices();
        Comm {
            topo,
            slots: Mutex::new(vec![None; n]),
            barrier: Barrier::new(n),
        }
    }

    /// Every device posts its tensor; each gets the tensors of its group over
    /// `axes`, in group order. All devices must call this in the same order.
    pub fn exchange(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Vec<Tensor>> {
        if let Ok(mut s) = self.slots.lock() {
            s[rank] = Some(t.clone());
        }
        self.barrier.wait()?;
        let group = self.topo.group(rank, axes);
        let out: Vec<Tensor> = match self.slots.lock() {
            Ok(s) => group.iter().filter_map(|r| s[*r].clone()).collect(),
            Err(_) => vec![],
        };
        // Nobody overwrites a slot until everyone has read.
        self.barrier.wait()?;
        Ok(out)
    }

    /// A device failed: wake everyone waiting in a collective with an error.
    pub fn abort(&self) {
        self.barrier.abort();
    }

    pub fn psum(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor> {
        if axes.iter().all(|a| self.topo.size(a) == 1) {
            return Ok(t.clone());
        }
        let parts = self.exchange(rank, t, axes)?;
        let mut acc = parts[0].clone();
        for p in &parts[1..] {
            acc = (acc + p)?;
        }
        Ok(acc)
    }

    pub fn pmax(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor> {
        if axes.iter().all(|a| self.topo.size(a) == 1) {
            return Ok(t.clone());
        }
        let parts = self.exchange(rank, t, axes)?;
        let mut acc = parts[0].clone();
        for p in &parts[1..] {
            acc = acc.maximum(p)?;
        }
        Ok(acc)
    }

    /// Concatenate the group's pieces along `dim` (the inverse of splitting it).
    pub fn all_gather(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor> {
        if self.topo.size(axis) == 1 {
            return Ok(t.clone());
        }
        let parts = self.exchange(rank, t, &[axis.to_string()])?;
        Tensor::cat(&parts, dim)
    }

    /// Sum over the group, keep this device's piece of `dim`.
    pub fn psum_scatter(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor> {
        let n = self.topo.size(axis);
        if n == 1 {
            return Ok(t.clone());
        }
        let full = self.psum(rank, t, &[axis.to_string()])?;
        let len = full.dims()[dim] / n;
        full.narrow(dim, self.topo.coord(rank, axis) * len, len)
    }
}
