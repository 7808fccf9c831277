//! The mesh as every stage after resolution sees it: its axes and device
//! coordinates ([`Topology`]), and the collective interface ([`Collectives`])
//! that kernels speak and that each backend (the in-process virtual mesh, MPI)
//! implements. The checker, `shardc show`, the editor server and the primitives'
//! kernels all use it; the implementations live in `runtime`.

use candle_core::{Result, Tensor};

/// Mesh axes (major first) and the coordinates of each rank (row-major).
#[derive(Clone, Debug)]
pub struct Topology {
    pub axes: Vec<(String, usize)>,
}

impl Topology {
    /// The topology of a program's mesh (`(axis, size)`, major first).
    pub fn of(mesh: &[(String, i64)]) -> Topology {
        Topology {
            axes: mesh.iter().map(|(a, n)| (a.clone(), *n as usize)).collect(),
        }
    }
    pub fn devices(&self) -> usize {
        self.axes
            .iter()
            .fold(1usize, |acc, a| acc.saturating_mul(a.1))
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
    /// The mesh axes (size > 1) a value of type `t` is replicated over, leaving out
    /// `except` (a pipeline's stage axis), and how many copies that makes.
    pub fn replication(
        &self,
        t: &crate::types::TType,
        except: Option<&str>,
    ) -> (Vec<String>, usize) {
        let used = t.all_axes();
        let axes: Vec<String> = self
            .axes
            .iter()
            .filter(|(a, n)| *n > 1 && !used.contains(&a.as_str()) && Some(a.as_str()) != except)
            .map(|a| a.0.clone())
            .collect();
        let n = axes
            .iter()
            .fold(1usize, |acc, a| acc.saturating_mul(self.size(a)));
        (axes, n)
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

/// The collective interface the executor speaks, and all it needs from a mesh.
/// Every call is made by every device of the mesh in the same order (the SPMD
/// program has no device-dependent control flow), with `rank` the caller. The
/// in-process mesh below implements it with shared memory; an MPI or NCCL backend
/// implements the same calls over processes or GPUs, and neither the lowering nor
/// the executor changes. Implementations must reduce in a fixed order (rank order
/// within the group) so that one seed gives bit-identical results.
/// The largest tag [`Collectives::send`] takes (MPI guarantees tags up to
/// 32767).
pub const MAX_TAG: u32 = 32_000;

pub trait Collectives: Sync {
    fn topo(&self) -> &Topology;
    /// Sum over the devices that differ only along `axes`; every one gets the sum.
    fn psum(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor>;
    /// Element-wise maximum over the group.
    fn pmax(&self, rank: usize, t: &Tensor, axes: &[String]) -> Result<Tensor>;
    /// Concatenate the group's pieces along `dim`, in group order.
    fn all_gather(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor>;
    /// Sum over the group; keep this device's piece of `dim`.
    fn psum_scatter(&self, rank: usize, t: &Tensor, axis: &str, dim: usize) -> Result<Tensor>;
    /// Split `split` into group-size pieces, send piece j to member j, and
    /// concatenate what arrives along `concat`, in group order.
    fn all_to_all(
        &self,
        rank: usize,
        t: &Tensor,
        axis: &str,
        split: usize,
        concat: usize,
    ) -> Result<Tensor>;
    /// Member i's tensor goes to member (i + shift) mod n along `axis`.
    fn ppermute(&self, rank: usize, t: &Tensor, axis: &str, shift: i64) -> Result<Tensor>;
    /// Point to point, for a pipeline's stages: `t` goes to member `to` of
    /// this device's group along `axis`, labelled `tag` (below
    /// [`MAX_TAG`]); returns without waiting for the receiver, which takes
    /// it with [`Collectives::recv`] whenever it is ready. Unlike the calls
    /// above, the two ends need not call at the same time or in the same
    /// order: a message is matched by sender and tag.
    fn send(&self, rank: usize, t: &Tensor, axis: &str, to: usize, tag: u32) -> Result<()>;
    /// Wait for the tensor member `from` of this device's group along
    /// `axis` sent with `tag`; `like` has its shape and type.
    fn recv(&self, rank: usize, like: &Tensor, axis: &str, from: usize, tag: u32)
        -> Result<Tensor>;
    /// Every device's tensor, in rank order, on rank 0 (`None` elsewhere): for
    /// writing checkpoints without a global copy on every device.
    fn gather_to_first(&self, rank: usize, t: &Tensor) -> Result<Option<Vec<Tensor>>>;
    /// Wait until every device arrives.
    fn barrier(&self) -> Result<()>;
    /// A device failed: every device waiting in a collective returns an error.
    fn abort(&self);
}
