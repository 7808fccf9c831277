//! What a kernel sees of the device it runs on ([`Kernel`]): its rank, the
//! mesh's collectives, the dtype and candle device, and the bound sizes; and
//! the layout moves kernels share — a dimension gathered or sliced between two
//! layouts, a value resharded between two types, and their transposes.
//!
//! Cotangents follow the dual of each value's layout: a value split over an
//! axis has a split cotangent; a value replicated over an axis has a cotangent
//! held as addends (one per device, summing to the gradient); a partial value
//! has a replicated cotangent. So the transpose of a gather is a
//! reduce-scatter, of a local slice a zero padding, and of an all-reduce an
//! all-reduce.

use super::lookup::SparseState;
use super::R;
use crate::fault::Fault;
use crate::mesh::{Collectives, Topology};
use crate::types::{Poly, TType};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;

/// A candle error as a [`crate::fault::Fault`] of its kind.
pub fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
}

/// One device running one node of the program.
pub struct Kernel<'a> {
    pub comm: &'a dyn Collectives,
    pub rank: usize,
    /// The float dtype of the run (f32, or f64 to check numerics).
    pub dtype: DType,
    pub dev: &'a Device,
    /// Values of the symbolic sizes (the batch).
    pub bound: &'a BTreeMap<String, Poly>,
    /// The node's index in the program (dropout streams and lookups are keyed by it).
    pub node: usize,
    /// Dropout's seed for this step and microbatch (`None`: no dropout, as in eval).
    pub dropout_seed: Option<u64>,
    /// Embedding tables' placement and this step's bookkeeping.
    pub sparse: &'a SparseState,
    /// The parameter behind operand 0, when it is one (a lookup's table).
    pub table: Option<usize>,
    /// A pipeline's stage axis: a value is computed on one stage only, so it
    /// is not replicated over this axis.
    pub stage_axis: Option<&'a str>,
    /// The targets that count per microbatch when the loss has an
    /// `ignore_index` (see `Exec::counted`): the loss's denominator.
    pub counted: Option<f64>,
    /// A `step_total`'s value per microbatch, when the runtime computed it
    /// over the whole step before the passes (see [`super::total`]).
    pub total: Option<f64>,
}

impl Kernel<'_> {
    pub fn topo(&self) -> &Topology {
        self.comm.topo()
    }

    pub fn size(&self, a: &str) -> usize {
        self.comm.topo().size(a)
    }

    /// Per-device shape of a value of type `t`.
    pub fn local_shape(&self, t: &TType) -> R<Vec<usize>> {
        let mut out = Vec::new();
        for (i, d) in t.dims.iter().enumerate() {
            let size = d
                .size
                .substitute(self.bound)
                .and_then(|p| p.as_const())
                .ok_or_else(|| {
                    Fault::Shape(format!("dimension {i} has symbolic size {}", d.size))
                })?;
            let n: usize = d.axes.iter().map(|a| self.size(a)).product();
            out.push(size as usize / n.max(1));
        }
        Ok(out)
    }

    /// Global number of elements over `dims` of a value of type `t` (a mean's divisor).
    pub fn global_count(&self, t: &TType, dims: &[usize]) -> R<f64> {
        dims.iter()
            .map(|&d| {
                t.dims
                    .get(d)
                    .and_then(|x| x.size.substitute(self.bound))
                    .and_then(|p| p.as_const())
                    .map(|n| n as f64)
                    .ok_or_else(|| Fault::Shape(format!("the size of dim {d} of `{t}` is unknown")))
            })
            .product()
    }

    /// Global row-major index of each local element of a value of type `t`.
    pub fn global_indices(&self, t: &TType) -> R<Vec<u64>> {
        crate::init::global_indices(self.topo(), self.rank, t, self.bound).map_err(Fault::Shape)
    }

    /// This device's elements of a value of type `t` as runs of consecutive
    /// global indices along the last dimension ([`crate::init::global_runs`]).
    pub fn global_runs(&self, t: &TType) -> R<(Vec<u64>, usize)> {
        crate::init::global_runs(self.topo(), self.rank, t, self.bound).map_err(Fault::Shape)
    }

    /// A tensor of this run's float dtype from f64 values.
    pub fn floats(&self, v: Vec<f64>, shape: &[usize]) -> R<Tensor> {
        Tensor::from_vec(v, shape, self.dev)
            .and_then(|t| t.to_dtype(self.dtype))
            .map_err(ce)
    }

    /// Move a local piece of dimension `dim` from layout `from` to layout `to`
    /// (gather the axes `to` lacks, minor first; slice for the ones it adds).
    pub fn relayout(&self, t: &Tensor, dim: usize, from: &[String], to: &[String]) -> R<Tensor> {
        let mut cur = from.to_vec();
        let mut t = t.clone();
        while !to.starts_with(&cur) {
            let a = cur.pop().unwrap_or_default();
            t = self.comm.all_gather(self.rank, &t, &a, dim).map_err(ce)?;
        }
        for a in &to[cur.len()..] {
            let n = self.size(a);
            let len = t.dims()[dim] / n;
            t = t
                .narrow(dim, self.comm.topo().coord(self.rank, a) * len, len)
                .map_err(ce)?;
        }
        Ok(t)
    }

    /// Transpose of `relayout`: pad where it sliced, reduce-scatter where it gathered.
    pub fn relayout_t(&self, ct: &Tensor, dim: usize, from: &[String], to: &[String]) -> R<Tensor> {
        let mut cur = from.to_vec();
        let mut gathered = Vec::new();
        while !to.starts_with(&cur) {
            gathered.push(cur.pop().unwrap_or_default());
        }
        let mut ct = ct.clone();
        for a in to[cur.len()..].iter().rev() {
            let n = self.size(a);
            let len = ct.dims()[dim];
            let i = self.comm.topo().coord(self.rank, a);
            ct = ct
                .pad_with_zeros(dim, i * len, (n - 1 - i) * len)
                .map_err(ce)?;
        }
        for a in gathered.iter().rev() {
            ct = self.comm.psum_scatter(self.rank, &ct, a, dim).map_err(ce)?;
        }
        Ok(ct)
    }

    /// Bring operand `x` (type `xt`) to the layout of `out` for an elementwise op,
    /// dims aligned from the right; broadcast dims (size 1) are left alone. With
    /// `transpose_ct`, the transpose of that move applied to a cotangent.
    pub fn align(
        &self,
        x: &Tensor,
        xt: &TType,
        out: &TType,
        transpose_ct: Option<&Tensor>,
    ) -> R<Tensor> {
        let off = out.rank() - xt.rank();
        let mut t = transpose_ct.cloned().unwrap_or_else(|| x.clone());
        for i in 0..xt.rank() {
            let (f, o) = (&xt.dims[i], &out.dims[i + off]);
            if f.axes == o.axes || f.size.as_const() == Some(1) && o.size.as_const() != Some(1) {
                continue;
            }
            t = if transpose_ct.is_some() {
                self.relayout_t(&t, i, &f.axes, &o.axes)?
            } else {
                self.relayout(&t, i, &f.axes, &o.axes)?
            };
        }
        Ok(t)
    }

    /// Sum a cotangent of broadcast shape back to the operand's local shape.
    pub fn unbroadcast(ct: &Tensor, shape: &[usize]) -> R<Tensor> {
        let mut ct = ct.clone();
        while ct.rank() > shape.len() {
            ct = super::reduce_fast::sum(&ct, 0).map_err(ce)?;
        }
        for (i, &s) in shape.iter().enumerate() {
            if s == 1 && ct.dims()[i] != 1 {
                ct = super::reduce_fast::sum_keepdim(&ct, i).map_err(ce)?;
            }
        }
        Ok(ct)
    }

    /// A layout change between two types of the same shape: reduce what is pending,
    /// then move every dimension's axes.
    pub fn reshard(&self, x: &Tensor, xt: &TType, out: &TType) -> R<Tensor> {
        let mut t = x.clone();
        let owed = owed(xt, out);
        if !owed.is_empty() {
            t = self.comm.psum(self.rank, &t, &owed).map_err(ce)?;
            let mut cur = xt.clone();
            cur.pending.clear();
            return self.reshard_dims(&t, &cur, out);
        }
        self.reshard_dims(&t, xt, out)
    }

    fn reshard_dims(&self, x: &Tensor, xt: &TType, out: &TType) -> R<Tensor> {
        let mut t = x.clone();
        // Gather first (so a dim that loses an axis is whole), then slice.
        for i in 0..xt.rank() {
            let (f, o) = (&xt.dims[i].axes, &out.dims[i].axes);
            if f != o {
                let keep: Vec<String> = f.iter().take_while(|a| o.contains(a)).cloned().collect();
                t = self.relayout(&t, i, f, &keep)?;
            }
        }
        for i in 0..xt.rank() {
            let (f, o) = (&xt.dims[i].axes, &out.dims[i].axes);
            if f != o {
                let keep: Vec<String> = f.iter().take_while(|a| o.contains(a)).cloned().collect();
                t = self.relayout(&t, i, &keep, o)?;
            }
        }
        Ok(t)
    }

    /// Transpose of `reshard`, applied to a cotangent of the `out` layout.
    pub fn reshard_t(&self, ct: &Tensor, xt: &TType, out: &TType) -> R<Tensor> {
        let mut t = ct.clone();
        for i in 0..xt.rank() {
            let (f, o) = (&xt.dims[i].axes, &out.dims[i].axes);
            if f != o {
                let keep: Vec<String> = f.iter().take_while(|a| o.contains(a)).cloned().collect();
                t = self.relayout_t(&t, i, &keep, o)?;
            }
        }
        for i in 0..xt.rank() {
            let (f, o) = (&xt.dims[i].axes, &out.dims[i].axes);
            if f != o {
                let keep: Vec<String> = f.iter().take_while(|a| o.contains(a)).cloned().collect();
                t = self.relayout_t(&t, i, f, &keep)?;
            }
        }
        let owed = owed(xt, out);
        if !owed.is_empty() {
            t = self.comm.psum(self.rank, &t, &owed).map_err(ce)?;
        }
        Ok(t)
    }

    /// Integer values of a tensor (ids).
    pub fn ints(t: &Tensor) -> R<Vec<i64>> {
        crate::kernels::host::read::<i64>(t).map_err(ce)
    }

    /// Values of a tensor as f64.
    pub fn f64s(t: &Tensor) -> R<Vec<f64>> {
        crate::kernels::host::read::<f64>(t).map_err(ce)
    }
}

/// The axes `from` owes sums over that `to` does not.
fn owed(from: &TType, to: &TType) -> Vec<String> {
    from.pending
        .keys()
        .filter(|a| !to.pending.contains_key(*a))
        .cloned()
        .collect()
}
