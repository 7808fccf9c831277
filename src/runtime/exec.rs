//! Executing the SPMD program on one device: forward with local tensors, and exact
//! reverse mode on the same program.
//!
//! Cotangents follow the dual of each value's layout: a value split over an axis
//! has a split cotangent; a value replicated over an axis has a cotangent held as
//! addends (one per device, summing to the gradient); a partial value has a
//! replicated cotangent. The transposes of the collectives follow: psum ↔ psum,
//! all_gather ↔ psum_scatter, a local slice ↔ zero padding. Parameter gradients are
//! then summed over the axes their parameter is replicated over.

use crate::ast::BinOp;
use crate::mesh::Collectives;
use crate::spmd::{Op, Program};
use crate::types::TType;
use candle_core::{DType, Device, Tensor, D};

pub type R<T> = std::result::Result<T, String>;

fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

pub struct Exec<'a> {
    pub prog: &'a Program,
    pub comm: &'a dyn Collectives,
    pub rank: usize,
    pub dtype: DType,
    pub dev: Device,
    /// Per `lookup` node: 1 for each id of the current (global) batch that is
    /// looked up, 0 where the table's `overflow: drop` dropped it.
    pub keep: std::cell::RefCell<std::collections::HashMap<usize, Vec<f64>>>,
    /// Embedding tables' row placement, by parameter index.
    pub placements: std::collections::HashMap<usize, super::sparse::Placement>,
    /// Per table parameter: 1 for each local row this step looked up (the table's
    /// optimizer updates only those), accumulated over microbatches.
    pub touched: std::cell::RefCell<std::collections::HashMap<usize, Vec<f64>>>,
    /// A pipeline's stage axis and, per parameter, the stage holding it.
    pub stage: Option<(String, Vec<Option<usize>>)>,
}

/// A lookup's output and what its gradient needs: the ids, each id's final weight,
/// the sample count, each id's row, and which ids are valid (not padding or dropped).
struct Looked {
    y: Tensor,
    ids: Vec<i64>,
    weights: Vec<f64>,
    samples: usize,
    rows: Tensor,
    valid: Vec<f64>,
}

/// What forward keeps for backward: every node's local value.
pub struct Tape {
    pub vals: Vec<Tensor>,
    /// Dropout masks by node.
    pub masks: Vec<Option<Tensor>>,
}

impl<'a> Exec<'a> {
    /// The same device running `prog` (a reloaded program); the per-step state
    /// (kept ids, touched rows) starts empty.
    pub fn with_program<'b>(&self, prog: &'b Program) -> Exec<'b>
    where
        'a: 'b,
    {
        Exec {
            prog,
            comm: self.comm,
            rank: self.rank,
            dtype: self.dtype,
            dev: self.dev.clone(),
            keep: Default::default(),
            placements: self.placements.clone(),
            touched: Default::default(),
            stage: self.stage.clone(),
        }
    }

    fn size(&self, a: &str) -> usize {
        self.comm.topo().size(a)
    }

    /// Whether this device holds parameter `p` (a pipeline stage holds only its
    /// own layers').
    pub fn holds(&self, p: usize) -> bool {
        match &self.stage {
            Some((axis, of)) => of
                .get(p)
                .copied()
                .flatten()
                .is_none_or(|s| self.comm.topo().coord(self.rank, axis) == s),
            None => true,
        }
    }

    /// The axes parameter `p` is replicated over among the devices holding it,
    /// and how many copies that makes.
    pub fn replicas(&self, p: usize) -> (Vec<String>, usize) {
        let staged = match &self.stage {
            Some((axis, of)) if of.get(p).copied().flatten().is_some() => Some(axis.as_str()),
            _ => None,
        };
        self.comm
            .topo()
            .replication(&self.prog.params[p].stored, staged)
    }

    /// Global number of elements over `dims` of a value of type `t` (a mean's divisor).
    fn global_count(&self, t: &TType, dims: &[usize]) -> R<f64> {
        dims.iter()
            .map(|&d| {
                t.dims
                    .get(d)
                    .and_then(|x| x.size.substitute(&self.prog.bound))
                    .and_then(|p| p.as_const())
                    .map(|n| n as f64)
                    .ok_or_else(|| format!("the size of dim {d} of `{t}` is unknown"))
            })
            .product()
    }

    /// Move a local piece of dimension `dim` from layout `from` to layout `to`
    /// (gather the axes `to` lacks, minor first; slice for the ones it adds).
    fn relayout(&self, t: &Tensor, dim: usize, from: &[String], to: &[String]) -> R<Tensor> {
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
    fn relayout_t(&self, ct: &Tensor, dim: usize, from: &[String], to: &[String]) -> R<Tensor> {
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
    /// dims aligned from the right; broadcast dims (size 1) are left alone.
    fn align(
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
    fn unbroadcast(ct: &Tensor, shape: &[usize]) -> R<Tensor> {
        let mut ct = ct.clone();
        while ct.rank() > shape.len() {
            ct = ct.sum(0).map_err(ce)?;
        }
        for (i, &s) in shape.iter().enumerate() {
            if s == 1 && ct.dims()[i] != 1 {
                ct = ct.sum_keepdim(i).map_err(ce)?;
            }
        }
        Ok(ct)
    }

    pub fn forward(
        &self,
        params: &[Tensor],
        inputs: &[Tensor],
        dropout_seed: Option<u64>,
    ) -> R<Tape> {
        let mut tape = self.empty_tape(params, inputs)?;
        self.forward_range(&mut tape, 0..self.prog.nodes.len(), dropout_seed)?;
        Ok(tape)
    }

    /// A tape holding only the inputs and parameters (every other value empty):
    /// what `forward_range` starts from.
    pub fn empty_tape(&self, params: &[Tensor], inputs: &[Tensor]) -> R<Tape> {
        let n = self.prog.nodes.len();
        let empty = Tensor::zeros(0, self.dtype, &self.dev).map_err(ce)?;
        let mut vals = vec![empty; n];
        for (i, node) in self.prog.nodes.iter().enumerate() {
            match node.op {
                Op::Input(k) => {
                    if let Some(x) = inputs.get(k) {
                        vals[i] = x.clone();
                    }
                }
                Op::Param(p) => vals[i] = params.get(p).cloned().ok_or("missing parameter")?,
                _ => {}
            }
        }
        Ok(Tape {
            vals,
            masks: vec![None; n],
        })
    }

    /// Compute the nodes in `range` (a pipeline stage, say), reading earlier values
    /// from the tape.
    pub fn forward_range(
        &self,
        tape: &mut Tape,
        range: std::ops::Range<usize>,
        dropout_seed: Option<u64>,
    ) -> R<()> {
        let vals = &mut tape.vals;
        let masks = &mut tape.masks;
        for i in range {
            let node = &self.prog.nodes[i];
            if matches!(node.op, Op::Input(_) | Op::Param(_)) {
                continue;
            }
            let a = |k: usize| -> &Tensor { &vals[node.args[k] as usize] };
            let at = |k: usize| -> &TType { &self.prog.nodes[node.args[k] as usize].ty };
            let out = &node.ty;
            let v: Tensor = match &node.op {
                Op::Binary(op, Some(c)) => scalar_op(a(0), *op, *c, false)?,
                Op::ScalarLeft(op, c) => scalar_op(a(0), *op, *c, true)?,
                Op::Neg => a(0).neg().map_err(ce)?,
                Op::Binary(op, None) => {
                    let x = self.align(a(0), at(0), out, None)?;
                    let y = self.align(a(1), at(1), out, None)?;
                    match op {
                        BinOp::Add => x.broadcast_add(&y),
                        BinOp::Sub => x.broadcast_sub(&y),
                        BinOp::Mul => x.broadcast_mul(&y),
                        _ => x.broadcast_div(&y),
                    }
                    .map_err(ce)?
                }
                Op::MatMul => {
                    let (x, y) = self.matmul_operands(a(0), at(0), a(1), at(1), out)?;
                    matmul(&x, &y)?
                }
                Op::Collective(kind, axes, attrs) => {
                    self.collective(kind, axes, attrs, a(0), at(0), out)?
                }
                Op::Reshard => self.reshard(a(0), at(0), out)?,
                Op::Builtin(name, attrs) => {
                    let args: Vec<&Tensor> = node.args.iter().map(|k| &vals[*k as usize]).collect();
                    let types: Vec<&TType> = node
                        .args
                        .iter()
                        .map(|k| &self.prog.nodes[*k as usize].ty)
                        .collect();
                    let (v, m) = self.builtin(name, attrs, &args, &types, out, i, dropout_seed)?;
                    masks[i] = m;
                    v
                }
                Op::Input(_) | Op::Param(_) => continue,
            };
            vals[i] = v;
        }
        Ok(())
    }

    /// The relayouts a matmul's operands need, in order: (operand, dim, from, to).
    /// The contraction takes whichever side is split (the checker made them agree);
    /// batch and row dims follow the result.
    fn matmul_plan(
        xt: &TType,
        yt: &TType,
        out: &TType,
    ) -> Vec<(usize, usize, Vec<String>, Vec<String>)> {
        let kx = &xt.dims[xt.rank() - 1].axes;
        let ky_i = if yt.rank() == 1 { 0 } else { yt.rank() - 2 };
        let ky = &yt.dims[ky_i].axes;
        let k = if kx.is_empty() {
            ky.clone()
        } else {
            kx.clone()
        };
        let mut plan = vec![(0, xt.rank() - 1, kx.clone(), k.clone())];
        for i in 0..xt.rank() - 1 {
            let o = &out.dims[i + out.rank() + usize::from(yt.rank() == 1) - xt.rank()];
            if xt.dims[i].axes != o.axes && xt.dims[i].size.as_const() != Some(1) {
                plan.push((0, i, xt.dims[i].axes.clone(), o.axes.clone()));
            }
        }
        plan.push((1, ky_i, ky.clone(), k));
        if yt.rank() >= 2 {
            let last = yt.rank() - 1;
            let o = &out.dims[out.rank() - 1];
            if yt.dims[last].axes != o.axes {
                plan.push((1, last, yt.dims[last].axes.clone(), o.axes.clone()));
            }
        }
        plan
    }

    fn matmul_operands(
        &self,
        x: &Tensor,
        xt: &TType,
        y: &Tensor,
        yt: &TType,
        out: &TType,
    ) -> R<(Tensor, Tensor)> {
        let mut ops = [x.clone(), y.clone()];
        for (k, dim, from, to) in Self::matmul_plan(xt, yt, out) {
            ops[k] = self.relayout(&ops[k], dim, &from, &to)?;
        }
        let [x, y] = ops;
        Ok((x, y))
    }

    fn collective(
        &self,
        kind: &str,
        axes: &[String],
        attrs: &[(String, String)],
        x: &Tensor,
        xt: &TType,
        out: &TType,
    ) -> R<Tensor> {
        match kind {
            "reduce" | "psum" => self.comm.psum(self.rank, x, axes).map_err(ce),
            "pmean" => {
                let n: usize = axes.iter().map(|a| self.size(a)).product();
                (self.comm.psum(self.rank, x, axes).map_err(ce)? / n as f64).map_err(ce)
            }
            "pmax" => self.comm.pmax(self.rank, x, axes).map_err(ce),
            "pmin" => self
                .comm
                .pmax(self.rank, &x.neg().map_err(ce)?, axes)
                .and_then(|t| t.neg())
                .map_err(ce),
            "all_to_all" => match Self::moved_axis(xt, out) {
                Some((a, from, to)) => self.comm.all_to_all(self.rank, x, &a, to, from).map_err(ce),
                None => self.reshard(x, xt, out),
            },
            "ppermute" => {
                let shift = Self::shift(attrs)?;
                let a = axes.first().ok_or("`ppermute` without an axis")?;
                self.comm.ppermute(self.rank, x, a, shift).map_err(ce)
            }
            "all_gather" | "psum_scatter" => self.reshard(x, xt, out),
            other => Err(format!("the runtime does not implement `{other}` yet")),
        }
    }

    /// For an all-to-all with nothing pending: the axis, the dim that loses it
    /// (its minor axis) and the dim that gains it (as its minor axis).
    fn moved_axis(xt: &TType, out: &TType) -> Option<(String, usize, usize)> {
        if !xt.pending.is_empty() || xt.rank() != out.rank() {
            return None;
        }
        let from = (0..xt.rank()).find(|&i| xt.dims[i].axes.len() == out.dims[i].axes.len() + 1)?;
        let to = (0..xt.rank()).find(|&i| out.dims[i].axes.len() == xt.dims[i].axes.len() + 1)?;
        let a = xt.dims[from].axes.last()?.clone();
        (out.dims[to].axes.last() == Some(&a)).then_some((a, from, to))
    }

    /// `ppermute`'s `shift` (default 1).
    fn shift(attrs: &[(String, String)]) -> R<i64> {
        match attrs.iter().find(|a| a.0 == "shift") {
            None => Ok(1),
            Some((_, v)) => v
                .trim()
                .parse::<i64>()
                .map_err(|_| format!("`ppermute` needs an integer literal `shift`, not `{v}`")),
        }
    }

    /// A layout change between two types of the same shape: reduce what is pending,
    /// then move every dimension's axes.
    fn reshard(&self, x: &Tensor, xt: &TType, out: &TType) -> R<Tensor> {
        let mut t = x.clone();
        let owed: Vec<String> = xt
            .pending
            .keys()
            .filter(|a| !out.pending.contains_key(*a))
            .cloned()
            .collect();
        if !owed.is_empty() {
            // Reduce-scatter into a dim that gains the axis, else all-reduce.
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

    fn reshard_t(&self, ct: &Tensor, xt: &TType, out: &TType) -> R<Tensor> {
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
        let owed: Vec<String> = xt
            .pending
            .keys()
            .filter(|a| !out.pending.contains_key(*a))
            .cloned()
            .collect();
        if !owed.is_empty() {
            t = self.comm.psum(self.rank, &t, &owed).map_err(ce)?;
        }
        Ok(t)
    }

    #[allow(clippy::too_many_arguments)]
    fn builtin(
        &self,
        name: &str,
        attrs: &[(String, String)],
        a: &[&Tensor],
        ts: &[&TType],
        out: &TType,
        node: usize,
        dropout_seed: Option<u64>,
    ) -> R<(Tensor, Option<Tensor>)> {
        if name == "axis_index" {
            let axis = attrs.first().map(|a| a.1.clone()).unwrap_or_default();
            let i = self.comm.topo().coord(self.rank, &axis) as f64;
            let t = Tensor::new(&[i], &self.dev)
                .and_then(|t| t.to_dtype(self.dtype))
                .map_err(ce)?;
            return Ok((t, None));
        }
        let x = a.first().copied().ok_or("missing operand")?;
        // A normalization over a split dim gathers it first (the checker's note).
        let gathered;
        let x = if NORMALIZING.contains(&name) {
            gathered = self.reshard(x, ts[0], out)?;
            &gathered
        } else {
            x
        };
        let v = match name {
            "relu" => x.relu(),
            "gelu" => x.gelu(),
            "silu" => x.silu(),
            "tanh" => x.tanh(),
            "exp" => x.exp(),
            "log" => x.log(),
            "sqrt" => x.sqrt(),
            "square" => x.sqr(),
            "abs" => x.abs(),
            "sigmoid" => sigmoid(x),
            "stop_gradient" | "cast" => Ok(x.clone()),
            "dropout" => {
                let rate = attrs
                    .iter()
                    .find(|(k, _)| k.is_empty() || k == "rate")
                    .and_then(|(_, v)| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
                match dropout_seed {
                    Some(seed) if rate > 0.0 => {
                        let mask = self.dropout_mask(
                            ts[0],
                            seed ^ (node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                            rate,
                        )?;
                        let y = x.broadcast_mul(&mask).map_err(ce)?;
                        return Ok((y, Some(mask)));
                    }
                    _ => Ok(x.clone()),
                }
            }
            "layer_norm" => {
                let (y, _) = layer_norm(x, a[1], a[2], eps(attrs))?;
                return Ok((y, None));
            }
            "rms_norm" => {
                let (y, _) = rms_norm(x, a[1], eps(attrs))?;
                return Ok((y, None));
            }
            "rsqrt" => x.sqrt().and_then(|t| t.recip()),
            "softmax" => softmax(x, one_dim(attrs, ts[0].rank())?),
            "log_softmax" => log_softmax(x, one_dim(attrs, ts[0].rank())?),
            "one_hot" => return Ok((self.one_hot(x, out)?, None)),

            "einsum" => {
                let spec = attrs
                    .first()
                    .map(|s| s.1.trim_matches('"').to_string())
                    .ok_or("einsum spec")?;
                let (x2, y2) = self.einsum_operands(&spec, a, ts, out)?;
                return Ok((einsum(&spec, &x2, &y2)?, None));
            }
            "causal_attention" => {
                let (y, _) = attention(a[0], a[1], a[2])?;
                return Ok((y, None));
            }
            "embed" => {
                let (y, _, _) = self.embed(a[0], ts[0], a[1])?;
                return Ok((y, None));
            }
            "reshape" => {
                let shape: Vec<usize> = self
                    .prog
                    .local_shape(out)?
                    .iter()
                    .map(|x| *x as usize)
                    .collect();
                x.reshape(shape)
            }
            "transpose" => x.permute(perm_of(attrs)?).and_then(|t| t.contiguous()),
            "sum" | "mean" | "max" | "min" => {
                // Over a split dim this is the local part; the type says what
                // reduction is still pending across devices.
                let dims = reduce_dims(attrs, ts[0].rank())?;
                let mut t = x.clone();
                for &d in dims.iter().rev() {
                    t = match name {
                        "max" => t.max(d),
                        "min" => t.min(d),
                        _ => t.sum(d),
                    }
                    .map_err(ce)?;
                }
                if name == "mean" {
                    t / self.global_count(ts[0], &dims)?
                } else {
                    Ok(t)
                }
            }
            "lookup" => {
                let l = self.lookup(a[0], a[1], a.get(2).copied(), ts[1], attrs, out, node)?;
                return Ok((l.y, None));
            }
            "index" => {
                let sl = attrs.first().map(|s| s.1.clone()).unwrap_or_default();
                let k: usize = sl
                    .trim_matches(|c| c == '[' || c == ']')
                    .trim()
                    .parse()
                    .map_err(|_| {
                        format!("the runtime only supports `x[k]` indexing, not `{sl}`")
                    })?;
                x.get(k)
            }
            other => return Err(format!("the runtime does not implement `{other}` yet")),
        }
        .map_err(ce)?;
        Ok((v, None))
    }

    fn einsum_operands(
        &self,
        spec: &str,
        a: &[&Tensor],
        ts: &[&TType],
        out: &TType,
    ) -> R<(Tensor, Tensor)> {
        let (ins, o) = spec.split_once("->").ok_or("einsum spec")?;
        let ins: Vec<&str> = ins.split(',').collect();
        // Target layout of each letter: the output's, else whichever operand is split.
        let want = einsum_layout(&ins, o, ts, out);
        let mut res = Vec::new();
        for ((s, t), x) in ins.iter().zip(ts).zip(a) {
            let mut x = (*x).clone();
            for (i, (c, d)) in s.chars().zip(&t.dims).enumerate() {
                let w = want.get(&c).cloned().unwrap_or_default();
                if d.axes != w {
                    x = self.relayout(&x, i, &d.axes, &w)?;
                }
            }
            res.push(x);
        }
        if res.len() != 2 {
            return Err("the runtime supports two-operand einsums".into());
        }
        Ok((res[0].clone(), res[1].clone()))
    }

    /// `lookup(feature, ids)`: each id's row of the table (operand 0), weighted by
    /// the combiner (`sum`, `mean`, `sqrtn`; 0 for ids `overflow: drop` dropped)
    /// and summed over each sample's valency. Returns the output, the ids, the
    /// per-id weights and the sample count.
    #[allow(clippy::too_many_arguments)]
    fn lookup(
        &self,
        table: &Tensor,
        ids: &Tensor,
        id_weights: Option<&Tensor>,
        ids_t: &TType,
        attrs: &[(String, String)],
        out: &TType,
        node: usize,
    ) -> R<Looked> {
        let n = self.prog.local_shape(out)?.first().copied().unwrap_or(1) as usize;
        let flat: Vec<i64> = ids
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::I64))
            .and_then(|t| t.to_vec1::<i64>())
            .map_err(ce)?;
        let vocab = self.table_vocab(node)?;
        // Negative ids pad ragged samples.
        if let Some(bad) = flat.iter().find(|i| **i >= vocab as i64) {
            return Err(format!(
                "id {bad} is outside the table's vocabulary (0..{vocab})"
            ));
        }
        let valency = flat.len() / n.max(1);
        // Valid ids: not padding (negative), not dropped by `overflow: drop`; this
        // device's ids are its block of the batch's.
        let mut valid: Vec<f64> = flat
            .iter()
            .map(|id| f64::from(u8::from(*id >= 0)))
            .collect();
        if let Some(keep) = self.keep.borrow().get(&node) {
            let axes = ids_t
                .dims
                .first()
                .map(|d| d.axes.clone())
                .unwrap_or_default();
            let (i, _) = self.comm.topo().shard_index(self.rank, &axes);
            let l = flat.len();
            let k = keep
                .get(i * l..(i + 1) * l)
                .ok_or("the drop mask does not cover this device's ids")?;
            valid.iter_mut().zip(k).for_each(|(v, k)| *v *= k);
        }
        let given: Vec<f64> = match id_weights {
            Some(t) => t
                .flatten_all()
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .map_err(ce)?,
            None => vec![1.0; flat.len()],
        };
        // Per sample, over its valid ids with weights w: sum Σ w·row, mean
        // Σ w·row / Σ w, sqrtn Σ w·row / √Σ w² (as TensorFlow and SparseCore).
        let combiner = attrs
            .iter()
            .find(|a| a.0 == "combiner")
            .map_or("sum", |a| a.1.as_str());
        let mut weights = vec![0.0; flat.len()];
        for sample in 0..n {
            let r = sample * valency..(sample + 1) * valency;
            let eff: Vec<f64> = r.clone().map(|k| valid[k] * given[k]).collect();
            let c = match combiner {
                "mean" => 1.0 / eff.iter().sum::<f64>(),
                "sqrtn" => 1.0 / eff.iter().map(|x| x * x).sum::<f64>().sqrt(),
                _ => 1.0,
            };
            let c = if c.is_finite() { c } else { 0.0 };
            for (k, e) in r.zip(eff) {
                weights[k] = e * c;
            }
        }
        let base = valid;
        let rows = self.fetch_rows(node, table, &flat, &base)?;
        let scale = Tensor::from_vec(weights.clone(), (flat.len(), 1), &self.dev)
            .and_then(|t| t.to_dtype(table.dtype()))
            .map_err(ce)?;
        let d = table.dims()[1];
        let y = rows
            .broadcast_mul(&scale)
            .and_then(|r| r.reshape((n, valency, d)))
            .and_then(|r| r.sum(1))
            .map_err(ce)?;
        Ok(Looked {
            y,
            ids: flat,
            weights,
            samples: n,
            rows,
            valid: base,
        })
    }

    /// The table parameter behind a lookup node, and its placement.
    fn table_of(&self, node: usize) -> (Option<usize>, Option<super::sparse::Placement>) {
        let arg = self.prog.nodes[node].args.first().copied();
        match arg.map(|a| &self.prog.nodes[a as usize].op) {
            Some(Op::Param(p)) => (Some(*p), self.placements.get(p).copied()),
            _ => (None, None),
        }
    }

    fn table_vocab(&self, node: usize) -> R<usize> {
        let a = self.prog.nodes[node]
            .args
            .first()
            .copied()
            .ok_or("lookup without a table")?;
        self.prog.nodes[a as usize]
            .ty
            .dims
            .first()
            .and_then(|d| d.size.as_const())
            .map(|v| v as usize)
            .ok_or_else(|| "the table's size is unknown".to_string())
    }

    /// This device's requests: the distinct live ids (weight ≠ 0), and for each id
    /// position its index among them (dropped ids point one past the end).
    fn requests(ids: &[i64], weights: &[f64]) -> (Vec<i64>, Vec<u32>) {
        let mut uniq: Vec<i64> = ids
            .iter()
            .zip(weights)
            .filter(|(_, w)| **w != 0.0)
            .map(|(i, _)| *i)
            .collect();
        uniq.sort_unstable();
        uniq.dedup();
        let inv = ids
            .iter()
            .zip(weights)
            .map(|(i, w)| {
                if *w == 0.0 {
                    uniq.len() as u32
                } else {
                    uniq.binary_search(i).unwrap_or(0) as u32
                }
            })
            .collect();
        (uniq, inv)
    }

    /// Exchange of requests along the table's axis: every member's padded request
    /// list, in group order ([members × m], -1 for padding), and m.
    fn gather_requests(&self, axis: &str, uniq: &[i64]) -> R<(Vec<i64>, usize)> {
        let ax = [axis.to_string()];
        let count = Tensor::new(&[uniq.len() as f64], &self.dev).map_err(ce)?;
        let m = self
            .comm
            .pmax(self.rank, &count, &ax)
            .and_then(|t| t.to_vec1::<f64>())
            .map_err(ce)?
            .first()
            .copied()
            .unwrap_or(0.0)
            .max(1.0) as usize;
        let mut req: Vec<f64> = uniq.iter().map(|i| *i as f64).collect();
        req.resize(m, -1.0);
        let req = Tensor::from_vec(req, m, &self.dev).map_err(ce)?;
        let all = self
            .comm
            .all_gather(self.rank, &req, axis, 0)
            .and_then(|t| t.to_vec1::<f64>())
            .map_err(ce)?;
        Ok((all.iter().map(|x| *x as i64).collect(), m))
    }

    /// Where each requested id lives on this device: (local row, 1) for ids it
    /// owns, (0, 0) otherwise.
    fn serve(&self, pl: &super::sparse::Placement, me: usize, all: &[i64]) -> (Vec<u32>, Vec<f64>) {
        all.iter()
            .map(|&q| match (q >= 0).then(|| pl.locate(q as u64)) {
                Some((o, r)) if o == me => (r as u32, 1.0),
                _ => (0, 0.0),
            })
            .unzip()
    }

    /// Rows [ids, D] for logical ids from the table operand: in place when this
    /// device holds the whole table, else fetched from their owners along the
    /// table's axis (requests all-gathered, rows returned by one all-to-all).
    fn fetch_rows(&self, node: usize, table: &Tensor, ids: &[i64], weights: &[f64]) -> R<Tensor> {
        let (pi, pl) = self.table_of(node);
        let tt = &self.prog.nodes[self.prog.nodes[node].args[0] as usize].ty;
        let axes = tt.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
        let (me, n) = self.comm.topo().shard_index(self.rank, &axes);
        let d = table.dims()[1];
        let (uniq, inv) = Self::requests(ids, weights);
        let inv = Tensor::from_vec(inv, ids.len(), &self.dev).map_err(ce)?;
        let zero = Tensor::zeros((1, d), table.dtype(), &self.dev).map_err(ce)?;
        let mine = if n <= 1 {
            let rows: Vec<u32> = uniq
                .iter()
                .map(|&q| pl.map_or(q as usize, |pl| pl.locate(q as u64).1) as u32)
                .collect();
            let k = rows.len();
            if let Some(pi) = pi {
                self.touch(pi, table.dims()[0], rows.iter().map(|r| (*r, 1.0)));
            }
            let idx = Tensor::from_vec(rows, k, &self.dev).map_err(ce)?;
            table.index_select(&idx, 0).map_err(ce)?
        } else {
            let (Some(pl), [axis]) = (pl, axes.as_slice()) else {
                return Err("a table split over several axes, or without a placement, cannot be looked up yet".into());
            };
            let (all, m) = self.gather_requests(axis, &uniq)?;
            let (rows, mask) = self.serve(&pl, me, &all);
            if let Some(pi) = pi {
                self.touch(
                    pi,
                    table.dims()[0],
                    rows.iter().copied().zip(mask.iter().copied()),
                );
            }
            let (served, _, _) = self.masked_rows(table, rows, mask)?;
            let recv = self
                .comm
                .all_to_all(self.rank, &served, axis, 0, 0)
                .map_err(ce)?;
            recv.reshape((n, m, d))
                .and_then(|t| t.sum(0))
                .and_then(|t| t.narrow(0, 0, uniq.len()))
                .map_err(ce)?
        };
        Tensor::cat(&[&mine, &zero], 0)
            .and_then(|t| t.index_select(&inv, 0))
            .map_err(ce)
    }

    /// Transpose of `fetch_rows`: the table's local gradient for row cotangents
    /// `g` [ids, D], each returned to the row's owner.
    fn fetch_rows_t(
        &self,
        node: usize,
        table: &Tensor,
        ids: &[i64],
        weights: &[f64],
        g: &Tensor,
    ) -> R<Tensor> {
        let (_, pl) = self.table_of(node);
        let tt = &self.prog.nodes[self.prog.nodes[node].args[0] as usize].ty;
        let axes = tt.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
        let (me, n) = self.comm.topo().shard_index(self.rank, &axes);
        let d = table.dims()[1];
        let (uniq, inv) = Self::requests(ids, weights);
        let k = uniq.len();
        let inv = Tensor::from_vec(inv, ids.len(), &self.dev).map_err(ce)?;
        // Per distinct id (plus the dropped slot, discarded).
        let gu = Tensor::zeros((k + 1, d), g.dtype(), &self.dev)
            .and_then(|z| z.index_add(&inv, g, 0))
            .and_then(|t| t.narrow(0, 0, k))
            .map_err(ce)?;
        if n <= 1 {
            let rows: Vec<u32> = uniq
                .iter()
                .map(|&q| pl.map_or(q as usize, |pl| pl.locate(q as u64).1) as u32)
                .collect();
            let idx = Tensor::from_vec(rows, k, &self.dev).map_err(ce)?;
            return table
                .zeros_like()
                .and_then(|z| z.index_add(&idx, &gu, 0))
                .map_err(ce);
        }
        let (Some(pl), [axis]) = (pl, axes.as_slice()) else {
            return Err(
                "a table split over several axes, or without a placement, cannot be looked up yet"
                    .into(),
            );
        };
        let (all, m) = self.gather_requests(axis, &uniq)?;
        let gu = gu.pad_with_zeros(0, 0, m - k).map_err(ce)?;
        // One block per owner: the gradients of the ids it owns.
        let mut blocks = Vec::with_capacity(n);
        for o in 0..n {
            let mut mask: Vec<f64> = uniq
                .iter()
                .map(|&q| f64::from(u8::from(pl.locate(q as u64).0 == o)))
                .collect();
            mask.resize(m, 0.0);
            let mask = Tensor::from_vec(mask, (m, 1), &self.dev)
                .and_then(|t| t.to_dtype(g.dtype()))
                .map_err(ce)?;
            blocks.push(gu.broadcast_mul(&mask).map_err(ce)?);
        }
        let send = Tensor::cat(&blocks, 0).map_err(ce)?;
        let recv = self
            .comm
            .all_to_all(self.rank, &send, axis, 0, 0)
            .map_err(ce)?;
        let (rows, mask) = self.serve(&pl, me, &all);
        let len = rows.len();
        let idx = Tensor::from_vec(rows, len, &self.dev).map_err(ce)?;
        let mask = Tensor::from_vec(mask, (len, 1), &self.dev)
            .and_then(|t| t.to_dtype(g.dtype()))
            .map_err(ce)?;
        table
            .zeros_like()
            .and_then(|z| z.index_add(&idx, &recv.broadcast_mul(&mask)?, 0))
            .map_err(ce)
    }

    /// Rows `rows` of `table`, each times its mask (0 or 1), with the index and
    /// mask tensors.
    fn masked_rows(
        &self,
        table: &Tensor,
        rows: Vec<u32>,
        mask: Vec<f64>,
    ) -> R<(Tensor, Tensor, Tensor)> {
        let n = rows.len();
        let idx = Tensor::from_vec(rows, n, &self.dev).map_err(ce)?;
        let m = Tensor::from_vec(mask, (n, 1), &self.dev)
            .and_then(|t| t.to_dtype(table.dtype()))
            .map_err(ce)?;
        let out = table
            .index_select(&idx, 0)
            .and_then(|r| r.broadcast_mul(&m))
            .map_err(ce)?;
        Ok((out, idx, m))
    }

    /// Mark local rows of table parameter `pi` as looked up this step.
    fn touch(&self, pi: usize, rows: usize, hits: impl Iterator<Item = (u32, f64)>) {
        let mut t = self.touched.borrow_mut();
        let m = t.entry(pi).or_insert_with(|| vec![0.0; rows]);
        for (r, on) in hits {
            if on > 0.0 {
                if let Some(x) = m.get_mut(r as usize) {
                    *x = 1.0;
                }
            }
        }
    }

    /// Vocab-parallel embedding: rows outside this device's window give zeros.
    fn embed(&self, w: &Tensor, wt: &TType, ids: &Tensor) -> R<(Tensor, Tensor, Tensor)> {
        let (idx, _) = self.comm.topo().shard_index(self.rank, &wt.dims[0].axes);
        let vloc = w.dims()[0];
        let off = (idx * vloc) as i64;
        let flat: Vec<i64> = ids
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::I64))
            .and_then(|t| t.to_vec1::<i64>())
            .map_err(ce)?;
        let mut local = Vec::with_capacity(flat.len());
        let mut mask = Vec::with_capacity(flat.len());
        for id in flat {
            let l = id - off;
            let inside = l >= 0 && (l as usize) < vloc;
            local.push(if inside { l as u32 } else { 0 });
            mask.push(if inside { 1.0f64 } else { 0.0 });
        }
        let (rows, li, m) = self.masked_rows(w, local, mask)?;
        let mut shape = ids.dims().to_vec();
        shape.push(w.dims()[1]);
        Ok((rows.reshape(shape).map_err(ce)?, li, m))
    }

    /// `one_hot(ids, N)`: this device's window of the classes when the class dim
    /// is split (as a vocabulary-parallel head would want it).
    fn one_hot(&self, ids: &Tensor, out: &TType) -> R<Tensor> {
        let last = out.dims.last().ok_or("one_hot of a scalar")?;
        let local = self.prog.local_shape(out)?;
        let n = *local.last().ok_or("one_hot of a scalar")? as usize;
        let (idx, _) = self.comm.topo().shard_index(self.rank, &last.axes);
        let off = (idx * n) as i64;
        let flat: Vec<i64> = ids
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::I64))
            .and_then(|t| t.to_vec1::<i64>())
            .map_err(ce)?;
        let mut v = vec![0f64; flat.len() * n];
        for (r, id) in flat.iter().enumerate() {
            let l = id - off;
            if (0..n as i64).contains(&l) {
                v[r * n + l as usize] = 1.0;
            }
        }
        let shape: Vec<usize> = local.iter().map(|x| *x as usize).collect();
        Tensor::from_vec(v, shape, &self.dev)
            .and_then(|t| t.to_dtype(self.dtype))
            .map_err(ce)
    }

    fn dropout_mask(&self, t: &TType, seed: u64, rate: f64) -> R<Tensor> {
        let idx = self.global_indices(t)?;
        let keep = 1.0 / (1.0 - rate);
        let v: Vec<f64> = idx
            .iter()
            .map(|g| {
                if crate::init::uniform(seed, *g) < rate {
                    0.0
                } else {
                    keep
                }
            })
            .collect();
        let shape = self.prog.local_shape(t).map_err(|e| e.to_string())?;
        let shape: Vec<usize> = shape.iter().map(|x| *x as usize).collect();
        Tensor::from_vec(v, shape, &self.dev)
            .and_then(|t| t.to_dtype(self.dtype))
            .map_err(ce)
    }

    /// Global row-major index of each local element of a value of type `t`.
    pub fn global_indices(&self, t: &TType) -> R<Vec<u64>> {
        crate::init::global_indices(self.comm.topo(), self.rank, t, &self.prog.bound)
    }

    /// Reverse pass. `ct_out` is the output's cotangent; returns each parameter's
    /// gradient in its stored layout, still partial over the axes it is replicated on.
    pub fn backward(&self, tape: &Tape, ct_out: Tensor) -> R<Vec<Option<Tensor>>> {
        let out = self.prog.output.ok_or("no output")? as usize;
        let mut grads = vec![None; self.prog.params.len()];
        self.backward_range(tape, &[(out, ct_out)], 0..self.prog.nodes.len(), &mut grads)?;
        Ok(grads)
    }

    /// Reverse mode over the nodes in `range`, from cotangents `seeds` at nodes
    /// in it; parameter gradients add into `grads`. Returns every node's cotangent,
    /// including those of values the range read from before it (a stage's input).
    pub fn backward_range(
        &self,
        tape: &Tape,
        seeds: &[(usize, Tensor)],
        range: std::ops::Range<usize>,
        grads: &mut [Option<Tensor>],
    ) -> R<Vec<Option<Tensor>>> {
        let n = self.prog.nodes.len();
        let mut ct: Vec<Option<Tensor>> = vec![None; n];
        for (i, g) in seeds {
            ct[*i] = Some(g.clone());
        }
        let add = |slot: &mut Option<Tensor>, g: Tensor| -> R<()> {
            *slot = Some(match slot.take() {
                Some(s) => (s + g).map_err(ce)?,
                None => g,
            });
            Ok(())
        };
        for i in range.rev() {
            // Collectives must run on every device in the same order, even when a
            // device's cotangent happens to be absent: use zeros.
            let node = &self.prog.nodes[i];
            let g = match ct[i].take() {
                Some(g) => g,
                None if matches!(node.op, Op::Collective(..) | Op::Reshard)
                    || node.op == Op::MatMul
                    || matches!(node.op, Op::Builtin(..)) =>
                {
                    tape.vals[i].zeros_like().map_err(ce)?
                }
                None => continue,
            };
            let v = |k: usize| -> &Tensor { &tape.vals[node.args[k] as usize] };
            let vt = |k: usize| -> &TType { &self.prog.nodes[node.args[k] as usize].ty };
            let arg = |k: usize| node.args[k] as usize;
            let out_t = &node.ty;
            match &node.op {
                Op::Input(_) => {}
                Op::Param(p) => add(&mut grads[*p], g)?,
                Op::Neg => add(&mut ct[arg(0)], g.neg().map_err(ce)?)?,
                Op::Binary(op, Some(c)) => {
                    let d = match op {
                        BinOp::Mul => (g * *c).map_err(ce)?,
                        BinOp::Div => (g / *c).map_err(ce)?,
                        _ => g,
                    };
                    add(&mut ct[arg(0)], d)?
                }
                Op::ScalarLeft(op, c) => {
                    let x = v(0);
                    let d = match op {
                        BinOp::Sub => g.neg().map_err(ce)?,
                        BinOp::Mul => (g * *c).map_err(ce)?,
                        // d(c/x) = -c/x²
                        BinOp::Div => g
                            .mul(
                                &(x.sqr().and_then(|s| s.recip()).map_err(ce)? * (-c))
                                    .map_err(ce)?,
                            )
                            .map_err(ce)?,
                        _ => g,
                    };
                    add(&mut ct[arg(0)], d)?
                }
                Op::Binary(op, None) => {
                    let x = self.align(v(0), vt(0), out_t, None)?;
                    let y = self.align(v(1), vt(1), out_t, None)?;
                    let (gx, gy) = match op {
                        BinOp::Add => (g.clone(), g.clone()),
                        BinOp::Sub => (g.clone(), g.neg().map_err(ce)?),
                        BinOp::Mul => (
                            g.broadcast_mul(&y).map_err(ce)?,
                            g.broadcast_mul(&x).map_err(ce)?,
                        ),
                        _ => {
                            let gx = g.broadcast_div(&y).map_err(ce)?;
                            let gy = g
                                .broadcast_mul(&x)
                                .and_then(|t| t.broadcast_div(&y.sqr()?))
                                .and_then(|t| t.neg())
                                .map_err(ce)?;
                            (gx, gy)
                        }
                    };
                    let gx = Self::unbroadcast(&gx, x.dims())?;
                    let gy = Self::unbroadcast(&gy, y.dims())?;
                    let gx = self.align(v(0), vt(0), out_t, Some(&gx))?;
                    let gy = self.align(v(1), vt(1), out_t, Some(&gy))?;
                    add(&mut ct[arg(0)], gx)?;
                    add(&mut ct[arg(1)], gy)?;
                }
                Op::MatMul => {
                    let (x, y) = self.matmul_operands(v(0), vt(0), v(1), vt(1), out_t)?;
                    let (gx, gy) = matmul_vjp(&x, &y, &g)?;
                    let (gx, gy) = self.matmul_operands_t(vt(0), vt(1), out_t, gx, gy)?;
                    add(&mut ct[arg(0)], gx)?;
                    add(&mut ct[arg(1)], gy)?;
                }
                Op::Collective(kind, axes, attrs) => {
                    let d = match kind.as_str() {
                        "reduce" | "psum" => self.comm.psum(self.rank, &g, axes).map_err(ce)?,
                        "pmean" => {
                            let k: usize = axes.iter().map(|a| self.size(a)).product();
                            (self.comm.psum(self.rank, &g, axes).map_err(ce)? / k as f64)
                                .map_err(ce)?
                        }
                        // The whole cotangent of the (replicated) result goes to the
                        // devices holding the extremum, split evenly between ties.
                        "pmax" | "pmin" => {
                            let mask = v(0)
                                .eq(&tape.vals[i])
                                .and_then(|m| m.to_dtype(g.dtype()))
                                .map_err(ce)?;
                            let count = self.comm.psum(self.rank, &mask, axes).map_err(ce)?;
                            let total = self.comm.psum(self.rank, &g, axes).map_err(ce)?;
                            (total * mask).and_then(|t| t / count).map_err(ce)?
                        }
                        // A permutation's transpose is its inverse.
                        "ppermute" => {
                            let a = axes.first().ok_or("`ppermute` without an axis")?;
                            self.comm
                                .ppermute(self.rank, &g, a, -Self::shift(attrs)?)
                                .map_err(ce)?
                        }
                        "all_to_all" => match Self::moved_axis(vt(0), out_t) {
                            Some((a, from, to)) => self
                                .comm
                                .all_to_all(self.rank, &g, &a, from, to)
                                .map_err(ce)?,
                            None => self.reshard_t(&g, vt(0), out_t)?,
                        },
                        "all_gather" | "psum_scatter" => self.reshard_t(&g, vt(0), out_t)?,
                        other => return Err(format!("no gradient for `{other}` yet")),
                    };
                    add(&mut ct[arg(0)], d)?
                }
                Op::Reshard => add(&mut ct[arg(0)], self.reshard_t(&g, vt(0), out_t)?)?,
                Op::Builtin(name, attrs) => {
                    let ds = self.builtin_vjp(name, attrs, node, tape, i, &g)?;
                    for (k, d) in ds.into_iter().enumerate() {
                        if let Some(d) = d {
                            add(&mut ct[arg(k)], d)?;
                        }
                    }
                }
            }
        }
        Ok(ct)
    }

    /// Transpose of `matmul_operands`, applied to the operands' cotangents.
    fn matmul_operands_t(
        &self,
        xt: &TType,
        yt: &TType,
        out: &TType,
        gx: Tensor,
        gy: Tensor,
    ) -> R<(Tensor, Tensor)> {
        let mut gs = [gx, gy];
        for (k, dim, from, to) in Self::matmul_plan(xt, yt, out).into_iter().rev() {
            gs[k] = self.relayout_t(&gs[k], dim, &from, &to)?;
        }
        let [gx, gy] = gs;
        Ok((gx, gy))
    }

    fn builtin_vjp(
        &self,
        name: &str,
        attrs: &[(String, String)],
        node: &crate::spmd::Node,
        tape: &Tape,
        i: usize,
        g: &Tensor,
    ) -> R<Vec<Option<Tensor>>> {
        if NORMALIZING.contains(&name) && ty_of(self.prog, node, 0).dims != node.ty.dims {
            // Differentiate in the gathered layout, then transpose the gather.
            let x = self.reshard(
                &tape.vals[node.args[0] as usize],
                ty_of(self.prog, node, 0),
                &node.ty,
            )?;
            let mut vals = tape.vals.clone();
            let id = node.args[0] as usize;
            vals[id] = x;
            let gathered_t = node.ty.clone();
            let local = Tape {
                vals,
                masks: tape.masks.clone(),
            };
            let mut ds = self.builtin_vjp_in(name, attrs, node, &local, i, g, Some(&gathered_t))?;
            if let Some(Some(d)) = ds.first_mut().map(Option::take) {
                ds[0] = Some(self.reshard_t(&d, ty_of(self.prog, node, 0), &node.ty)?);
            }
            return Ok(ds);
        }
        self.builtin_vjp_in(name, attrs, node, tape, i, g, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn builtin_vjp_in(
        &self,
        name: &str,
        attrs: &[(String, String)],
        node: &crate::spmd::Node,
        tape: &Tape,
        i: usize,
        g: &Tensor,
        first_t: Option<&TType>,
    ) -> R<Vec<Option<Tensor>>> {
        let v = |k: usize| -> &Tensor { &tape.vals[node.args[k] as usize] };
        let ty = |k: usize| -> &TType {
            match (k, first_t) {
                (0, Some(t)) => t,
                _ => &self.prog.nodes[node.args[k] as usize].ty,
            }
        };
        let y = &tape.vals[i];
        let one = |t: candle_core::Result<Tensor>| -> R<Vec<Option<Tensor>>> {
            Ok(vec![Some(t.map_err(ce)?)])
        };
        match name {
            "relu" => one(v(0)
                .ge(0.0)
                .and_then(|m| m.to_dtype(g.dtype()))
                .and_then(|m| g.mul(&m))),
            "tanh" => one(y
                .sqr()
                .and_then(|s| s.affine(-1.0, 1.0))
                .and_then(|d| g.mul(&d))),
            "exp" => one(g.mul(y)),
            "log" => one(g.div(v(0))),
            "sqrt" => one(g.div(&(y * 2.0).map_err(ce)?)),
            "square" => one(g.mul(&(v(0) * 2.0).map_err(ce)?)),
            "abs" => one(v(0)
                .ge(0.0)
                .and_then(|m| m.to_dtype(g.dtype()))
                .and_then(|m| m.affine(2.0, -1.0))
                .and_then(|s| g.mul(&s))),
            "sigmoid" => one(y
                .affine(-1.0, 1.0)
                .and_then(|d| d.mul(y))
                .and_then(|d| g.mul(&d))),
            "silu" => {
                let x = v(0);
                let s = sigmoid(x).map_err(ce)?;
                // σ(x)(1 + x(1 − σ(x)))
                one(s
                    .affine(-1.0, 1.0)
                    .and_then(|d| d.mul(x))
                    .and_then(|d| d.affine(1.0, 1.0))
                    .and_then(|d| d.mul(&s))
                    .and_then(|d| g.mul(&d)))
            }
            "gelu" => one(gelu_tanh_grad(v(0)).and_then(|d| g.mul(&d))),
            "stop_gradient" => Ok(vec![None]),
            "cast" => Ok(vec![Some(g.clone())]),
            "dropout" => match &tape.masks[i] {
                Some(m) => one(g.broadcast_mul(m)),
                None => Ok(vec![Some(g.clone())]),
            },
            "rsqrt" => one(y
                .powf(3.0)
                .and_then(|t| t.affine(-0.5, 0.0))
                .and_then(|d| g.mul(&d))),
            "softmax" => {
                let d = one_dim(attrs, ty(0).rank())?;
                one(g
                    .mul(y)
                    .and_then(|t| t.sum_keepdim(d))
                    .and_then(|s| g.broadcast_sub(&s))
                    .and_then(|t| t.mul(y)))
            }
            "log_softmax" => {
                let d = one_dim(attrs, ty(0).rank())?;
                one(g
                    .sum_keepdim(d)
                    .and_then(|s| y.exp()?.broadcast_mul(&s))
                    .and_then(|t| g.sub(&t)))
            }
            "rms_norm" => {
                let (_, (xhat, inv)) = rms_norm(v(0), v(1), eps(attrs))?;
                let dxhat = g.broadcast_mul(v(1)).map_err(ce)?;
                let m = dxhat
                    .mul(&xhat)
                    .and_then(|t| t.mean_keepdim(D::Minus1))
                    .map_err(ce)?;
                let dx = dxhat
                    .sub(&xhat.broadcast_mul(&m).map_err(ce)?)
                    .and_then(|t| t.broadcast_mul(&inv))
                    .map_err(ce)?;
                let mut dw = g.mul(&xhat).map_err(ce)?;
                for _ in 0..g.rank() - 1 {
                    dw = dw.sum(0).map_err(ce)?;
                }
                Ok(vec![Some(dx), Some(dw)])
            }
            "one_hot" | "axis_index" => Ok(vec![None; node.args.len()]),
            "layer_norm" => {
                let (_, (xhat, inv)) = layer_norm(v(0), v(1), v(2), eps(attrs))?;
                let w = v(1);
                let dxhat = g.broadcast_mul(w).map_err(ce)?;
                let m1 = dxhat.mean_keepdim(D::Minus1).map_err(ce)?;
                let m2 = dxhat
                    .mul(&xhat)
                    .and_then(|t| t.mean_keepdim(D::Minus1))
                    .map_err(ce)?;
                let dx = dxhat
                    .broadcast_sub(&m1)
                    .and_then(|t| t.broadcast_sub(&xhat.broadcast_mul(&m2)?))
                    .and_then(|t| t.broadcast_mul(&inv))
                    .map_err(ce)?;
                let lead = g.rank() - 1;
                let mut dw = g.mul(&xhat).map_err(ce)?;
                let mut db = g.clone();
                for _ in 0..lead {
                    dw = dw.sum(0).map_err(ce)?;
                    db = db.sum(0).map_err(ce)?;
                }
                Ok(vec![Some(dx), Some(dw), Some(db)])
            }
            "einsum" => {
                let spec = attrs
                    .first()
                    .map(|s| s.1.trim_matches('"').to_string())
                    .ok_or("einsum spec")?;
                let a: Vec<&Tensor> = vec![v(0), v(1)];
                let ts: Vec<&TType> = vec![ty(0), ty(1)];
                let (x2, y2) = self.einsum_operands(&spec, &a, &ts, &node.ty)?;
                let (ins, o) = spec.split_once("->").ok_or("einsum spec")?;
                let (sa, sb) = ins.split_once(',').ok_or("einsum spec")?;
                for c in sa.chars().chain(sb.chars()) {
                    if !(o.contains(c) || sa.contains(c) && sb.contains(c)) {
                        return Err(format!(
                            "no gradient yet for an einsum that sums out `{c}` from one operand"
                        ));
                    }
                }
                let ga = einsum(&format!("{o},{sb}->{sa}"), g, &y2)?;
                let gb = einsum(&format!("{o},{sa}->{sb}"), g, &x2)?;
                // Transpose the operand relayouts.
                let want = einsum_layout(&[sa, sb], o, &[ty(0), ty(1)], &node.ty);
                let mut out = Vec::new();
                for (gk, (s, t)) in [(ga, (sa, ty(0))), (gb, (sb, ty(1)))] {
                    let mut gk = gk;
                    for (j, (c, d)) in s.chars().zip(&t.dims).enumerate() {
                        let w = want.get(&c).cloned().unwrap_or_default();
                        if d.axes != w {
                            gk = self.relayout_t(&gk, j, &d.axes, &w)?;
                        }
                    }
                    out.push(Some(gk));
                }
                Ok(out)
            }
            "causal_attention" => {
                let (_, p) = attention(v(0), v(1), v(2))?;
                let (dq, dk, dv) = attention_vjp(v(0), v(1), v(2), &p, g)?;
                Ok(vec![Some(dq), Some(dk), Some(dv)])
            }
            "embed" => {
                let (_, li, m) = self.embed(v(0), ty(0), v(1))?;
                let d = v(0).dims()[1];
                let rows = g
                    .reshape(((), d))
                    .and_then(|r| r.broadcast_mul(&m))
                    .map_err(ce)?;
                let dw = v(0)
                    .zeros_like()
                    .and_then(|z| z.index_add(&li, &rows, 0))
                    .map_err(ce)?;
                Ok(vec![Some(dw), None])
            }
            "reshape" => Ok(vec![Some(g.reshape(v(0).dims()).map_err(ce)?)]),
            "sum" | "mean" | "max" | "min" => {
                let dims = reduce_dims(attrs, ty(0).rank())?;
                let (mut gb, mut yb) = (g.clone(), y.clone());
                for &d in &dims {
                    gb = gb.unsqueeze(d).map_err(ce)?;
                    yb = yb.unsqueeze(d).map_err(ce)?;
                }
                let gb = gb.broadcast_as(v(0).dims()).map_err(ce)?;
                match name {
                    "sum" => one(Ok(gb)),
                    "mean" => one(gb / self.global_count(ty(0), &dims)?),
                    // To the elements equal to the extremum, split evenly between ties.
                    _ => {
                        let mask = v(0)
                            .broadcast_eq(&yb)
                            .and_then(|m| m.to_dtype(g.dtype()))
                            .map_err(ce)?;
                        let mut count = mask.clone();
                        for &d in dims.iter().rev() {
                            count = count.sum_keepdim(d).map_err(ce)?;
                        }
                        one(gb.mul(&mask).and_then(|t| t.broadcast_div(&count)))
                    }
                }
            }
            "transpose" => {
                let p = perm_of(attrs)?;
                let mut inv = vec![0; p.len()];
                for (i, &k) in p.iter().enumerate() {
                    inv[k] = i;
                }
                Ok(vec![Some(
                    g.permute(inv).and_then(|t| t.contiguous()).map_err(ce)?,
                )])
            }
            "lookup" => {
                let w_in = node.args.get(2).map(|k| &tape.vals[*k as usize]);
                let Looked {
                    ids,
                    weights,
                    samples: n,
                    rows,
                    valid: base,
                    ..
                } = self.lookup(v(0), v(1), w_in, ty(1), attrs, &node.ty, i)?;
                // Each id's row gets its sample's cotangent (times its weight).
                let d = v(0).dims()[1];
                let valency = ids.len() / n.max(1);
                let scale = Tensor::from_vec(weights.clone(), (ids.len(), 1), &self.dev)
                    .and_then(|t| t.to_dtype(g.dtype()))
                    .map_err(ce)?;
                let gr = g
                    .unsqueeze(1)
                    .and_then(|t| t.broadcast_as((n, valency, d)))
                    .and_then(|t| t.reshape((n * valency, d)))
                    .and_then(|t| t.broadcast_mul(&scale))
                    .map_err(ce)?;
                let dt = self.fetch_rows_t(i, v(0), &ids, &base, &gr)?;
                // d/d weight, per combiner (y the sample's output, g its cotangent,
                // c its factor): sum g·r; mean c·(g·r − g·y); sqrtn c·g·r − c²·w·(g·y).
                let dw = match w_in {
                    Some(w) => {
                        let given: Vec<f64> = w
                            .flatten_all()
                            .and_then(|t| t.to_dtype(DType::F64))
                            .and_then(|t| t.to_vec1::<f64>())
                            .map_err(ce)?;
                        let gs = g
                            .unsqueeze(1)
                            .and_then(|t| t.broadcast_as((n, valency, d)))
                            .and_then(|t| t.reshape((n * valency, d)))
                            .map_err(ce)?;
                        let as_f64 = |t: Tensor| -> R<Vec<f64>> {
                            t.flatten_all()
                                .and_then(|t| t.to_dtype(DType::F64))
                                .and_then(|t| t.to_vec1::<f64>())
                                .map_err(ce)
                        };
                        let gr_dot = as_f64(rows.mul(&gs).and_then(|t| t.sum(1)).map_err(ce)?)?;
                        let gy_dot =
                            as_f64(tape.vals[i].mul(g).and_then(|t| t.sum(1)).map_err(ce)?)?;
                        let combiner = attrs
                            .iter()
                            .find(|a| a.0 == "combiner")
                            .map_or("sum", |a| a.1.as_str());
                        let dw: Vec<f64> = (0..ids.len())
                            .map(|k| {
                                let s = k / valency.max(1);
                                let (v, wk) = (base[k], given[k]);
                                // c = weight / (valid · given) where nonzero.
                                let c = if v * wk != 0.0 {
                                    weights[k] / (v * wk)
                                } else {
                                    let r = s * valency..(s + 1) * valency;
                                    let eff: Vec<f64> = r.map(|j| base[j] * given[j]).collect();
                                    let c = match combiner {
                                        "mean" => 1.0 / eff.iter().sum::<f64>(),
                                        "sqrtn" => {
                                            1.0 / eff.iter().map(|x| x * x).sum::<f64>().sqrt()
                                        }
                                        _ => 1.0,
                                    };
                                    if c.is_finite() {
                                        c
                                    } else {
                                        0.0
                                    }
                                };
                                v * match combiner {
                                    "mean" => c * (gr_dot[k] - gy_dot[s]),
                                    "sqrtn" => c * gr_dot[k] - c * c * wk * gy_dot[s],
                                    _ => gr_dot[k],
                                }
                            })
                            .collect();
                        Some(
                            Tensor::from_vec(dw, w.shape(), &self.dev)
                                .and_then(|t| t.to_dtype(g.dtype()))
                                .map_err(ce)?,
                        )
                    }
                    None => None,
                };
                Ok(vec![Some(dt), None, dw])
            }
            "index" => {
                let sl = attrs.first().map(|s| s.1.clone()).unwrap_or_default();
                let k: usize = sl
                    .trim_matches(|c| c == '[' || c == ']')
                    .trim()
                    .parse()
                    .map_err(|_| "index".to_string())?;
                let n = v(0).dims()[0];
                let d = g
                    .unsqueeze(0)
                    .and_then(|t| t.pad_with_zeros(0, k, n - 1 - k))
                    .map_err(ce)?;
                Ok(vec![Some(d)])
            }
            other => Err(format!("no gradient for `{other}` yet")),
        }
    }
}

/// The dims a `sum`/`mean`/`max`/`min` reduces (ascending; all when none is given).
fn reduce_dims(attrs: &[(String, String)], rank: usize) -> R<Vec<usize>> {
    let Some((_, t)) = attrs.iter().find(|a| a.0.is_empty() || a.0 == "dim") else {
        return Ok((0..rank).collect());
    };
    let mut dims = t
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|x| {
            let k = x
                .trim()
                .parse::<i64>()
                .map_err(|_| format!("the runtime needs integer dims, not `{t}`"))?;
            let k = if k < 0 { k + rank as i64 } else { k };
            (0..rank as i64)
                .contains(&k)
                .then_some(k as usize)
                .ok_or_else(|| format!("dim `{t}` out of range"))
        })
        .collect::<R<Vec<usize>>>()?;
    dims.sort_unstable();
    dims.dedup();
    Ok(dims)
}

fn perm_of(attrs: &[(String, String)]) -> R<Vec<usize>> {
    let t = attrs
        .iter()
        .find(|a| a.0.is_empty() && a.1.starts_with('['))
        .map(|a| a.1.clone())
        .ok_or("transpose needs a permutation")?;
    t.trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad permutation `{t}`"))
        })
        .collect()
}

/// The layout each einsum letter is computed in: the output's, else (for a
/// contracted letter) whichever operand splits it.
fn einsum_layout(
    ins: &[&str],
    o: &str,
    ts: &[&TType],
    out: &TType,
) -> std::collections::HashMap<char, Vec<String>> {
    let mut want: std::collections::HashMap<char, Vec<String>> = Default::default();
    for (c, d) in o.chars().zip(&out.dims) {
        want.insert(c, d.axes.clone());
    }
    for (s, t) in ins.iter().zip(ts) {
        for (c, d) in s.chars().zip(&t.dims) {
            let e = want.entry(c).or_default();
            if e.is_empty() && !d.axes.is_empty() && !o.contains(c) {
                *e = d.axes.clone();
            }
        }
    }
    want
}

fn scalar_op(x: &Tensor, op: BinOp, c: f64, left: bool) -> R<Tensor> {
    match (op, left) {
        (BinOp::Add, _) => x.affine(1.0, c),
        (BinOp::Sub, false) => x.affine(1.0, -c),
        (BinOp::Sub, true) => x.affine(-1.0, c),
        (BinOp::Mul, _) => x.affine(c, 0.0),
        (BinOp::Div, false) => x.affine(1.0 / c, 0.0),
        (BinOp::Div, true) => x.recip().and_then(|r| r.affine(c, 0.0)),
        (BinOp::MatMul, _) => return Err("matmul by a scalar".into()),
    }
    .map_err(ce)
}

fn sigmoid(x: &Tensor) -> candle_core::Result<Tensor> {
    x.neg()?.exp()?.affine(1.0, 1.0)?.recip()
}

/// d/dx of candle's tanh-approximated GELU, with the constants in full precision.
fn gelu_tanh_grad(x: &Tensor) -> candle_core::Result<Tensor> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let x2 = x.sqr()?;
    let inner = x.mul(&x2.affine(0.044715, 1.0)?)?.affine(c, 0.0)?;
    let t = inner.tanh()?;
    let dinner = x2.affine(3.0 * 0.044715 * c, c)?;
    let left = t.affine(0.5, 0.5)?;
    let right = x
        .mul(&t.sqr()?.affine(-1.0, 1.0)?)?
        .mul(&dinner)?
        .affine(0.5, 0.0)?;
    left + right
}

/// Batched matmul with broadcasting of the leading dims, and `[..., K] @ [K]`.
fn matmul(x: &Tensor, y: &Tensor) -> R<Tensor> {
    if y.rank() == 1 {
        return x
            .broadcast_matmul(&y.unsqueeze(1).map_err(ce)?)
            .and_then(|t| t.squeeze(D::Minus1))
            .map_err(ce);
    }
    if y.rank() == 2 && x.rank() > 2 {
        // Fold the leading dims into rows: one big GEMM.
        let mut shape = x.dims().to_vec();
        let k = shape.pop().unwrap_or(1);
        let rows: usize = shape.iter().product();
        let out = x
            .contiguous()
            .and_then(|x| x.reshape((rows, k)))
            .and_then(|x| x.matmul(y))
            .map_err(ce)?;
        shape.push(y.dims()[1]);
        return out.reshape(shape).map_err(ce);
    }
    x.broadcast_matmul(y).map_err(ce)
}

fn matmul_vjp(x: &Tensor, y: &Tensor, g: &Tensor) -> R<(Tensor, Tensor)> {
    if y.rank() == 1 {
        let g1 = g.unsqueeze(D::Minus1).map_err(ce)?;
        let gx = g1.broadcast_mul(y).map_err(ce)?;
        let mut gy = x.broadcast_mul(&g1).map_err(ce)?;
        while gy.rank() > 1 {
            gy = gy.sum(0).map_err(ce)?;
        }
        return Ok((gx, gy));
    }
    let yt = y.t().map_err(ce)?;
    let gx = matmul(g, &yt.contiguous().map_err(ce)?)?;
    let gy = if y.rank() == 2 {
        let k = x.dims()[x.rank() - 1];
        let n = g.dims()[g.rank() - 1];
        let xf = x
            .contiguous()
            .and_then(|t| t.reshape(((), k)))
            .map_err(ce)?;
        let gf = g
            .contiguous()
            .and_then(|t| t.reshape(((), n)))
            .map_err(ce)?;
        xf.t().and_then(|t| t.matmul(&gf)).map_err(ce)?
    } else {
        x.t()
            .and_then(|t| t.contiguous())
            .and_then(|t| t.broadcast_matmul(g))
            .map_err(ce)?
    };
    Ok((gx, gy))
}

/// LayerNorm over the last dim (eps 1e-5, as Haiku): output, and (x̂, 1/σ) for backward.
/// Built-ins that need their normalized dim whole on every device.
const NORMALIZING: &[&str] = &["softmax", "log_softmax", "layer_norm", "rms_norm"];

fn ty_of<'p>(prog: &'p crate::spmd::Program, node: &crate::spmd::Node, k: usize) -> &'p TType {
    &prog.nodes[node.args[k] as usize].ty
}

/// `eps:` of a normalization (default 1e-5, as flax and PyTorch).
fn eps(attrs: &[(String, String)]) -> f64 {
    attrs
        .iter()
        .find(|a| a.0 == "eps")
        .and_then(|a| a.1.trim().parse::<f64>().ok())
        .unwrap_or(1e-5)
}

/// The one dim of a `softmax`/`log_softmax` (default the last).
fn one_dim(attrs: &[(String, String)], rank: usize) -> R<usize> {
    match attrs.iter().find(|a| a.0.is_empty() || a.0 == "dim") {
        None => Ok(rank.saturating_sub(1)),
        Some(_) => reduce_dims(attrs, rank)?
            .first()
            .copied()
            .ok_or_else(|| "a dim".to_string()),
    }
}

fn softmax(x: &Tensor, d: usize) -> candle_core::Result<Tensor> {
    let e = x.broadcast_sub(&x.max_keepdim(d)?)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(d)?)
}

fn log_softmax(x: &Tensor, d: usize) -> candle_core::Result<Tensor> {
    let m = x.max_keepdim(d)?;
    let lse = x.broadcast_sub(&m)?.exp()?.sum_keepdim(d)?.log()?.add(&m)?;
    x.broadcast_sub(&lse)
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> R<(Tensor, (Tensor, Tensor))> {
    let inv = x
        .sqr()
        .and_then(|s| s.mean_keepdim(D::Minus1))
        .and_then(|v| v.affine(1.0, eps))
        .and_then(|v| v.sqrt())
        .and_then(|s| s.recip())
        .map_err(ce)?;
    let xhat = x.broadcast_mul(&inv).map_err(ce)?;
    let y = xhat.broadcast_mul(w).map_err(ce)?;
    Ok((y, (xhat, inv)))
}

fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> R<(Tensor, (Tensor, Tensor))> {
    let mu = x.mean_keepdim(D::Minus1).map_err(ce)?;
    let xc = x.broadcast_sub(&mu).map_err(ce)?;
    let var = xc
        .sqr()
        .and_then(|s| s.mean_keepdim(D::Minus1))
        .map_err(ce)?;
    let inv = var
        .affine(1.0, eps)
        .and_then(|v| v.sqrt())
        .and_then(|s| s.recip())
        .map_err(ce)?;
    let xhat = xc.broadcast_mul(&inv).map_err(ce)?;
    let y = xhat
        .broadcast_mul(w)
        .and_then(|t| t.broadcast_add(b))
        .map_err(ce)?;
    Ok((y, (xhat, inv)))
}

/// Two-operand einsum through permute + reshape + one batched matmul.
pub fn einsum(spec: &str, a: &Tensor, b: &Tensor) -> R<Tensor> {
    let (ins, o) = spec.split_once("->").ok_or("einsum spec")?;
    let (sa, sb) = ins.split_once(',').ok_or("einsum spec")?;
    let size = |c: char| -> usize {
        if let Some(i) = sa.find(c) {
            a.dims()[i]
        } else if let Some(i) = sb.find(c) {
            b.dims()[i]
        } else {
            1
        }
    };
    let batch: Vec<char> = o
        .chars()
        .filter(|c| sa.contains(*c) && sb.contains(*c))
        .collect();
    let contr: Vec<char> = sa
        .chars()
        .filter(|c| sb.contains(*c) && !o.contains(*c))
        .collect();
    let af: Vec<char> = sa.chars().filter(|c| !sb.contains(*c)).collect();
    let bf: Vec<char> = sb.chars().filter(|c| !sa.contains(*c)).collect();
    if af.iter().chain(&bf).any(|c| !o.contains(*c)) {
        return Err("the runtime's einsum needs every single-operand letter in the output".into());
    }
    let perm = |s: &str, order: &[char]| -> Vec<usize> {
        order.iter().filter_map(|c| s.find(*c)).collect()
    };
    let prod = |cs: &[char]| -> usize { cs.iter().map(|c| size(*c)).product() };
    let mut ao: Vec<char> = batch.clone();
    ao.extend(&af);
    ao.extend(&contr);
    let mut bo: Vec<char> = batch.clone();
    bo.extend(&contr);
    bo.extend(&bf);
    let a2 = a
        .permute(perm(sa, &ao))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((prod(&batch), prod(&af), prod(&contr))))
        .map_err(ce)?;
    let b2 = b
        .permute(perm(sb, &bo))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((prod(&batch), prod(&contr), prod(&bf))))
        .map_err(ce)?;
    let c = a2.matmul(&b2).map_err(ce)?;
    let mut co: Vec<char> = batch.clone();
    co.extend(&af);
    co.extend(&bf);
    let shape: Vec<usize> = co.iter().map(|c| size(*c)).collect();
    let c = c.reshape(shape).map_err(ce)?;
    let p: Vec<usize> = o
        .chars()
        .filter_map(|ch| co.iter().position(|x| *x == ch))
        .collect();
    c.permute(p).and_then(|t| t.contiguous()).map_err(ce)
}

/// Causal softmax attention on [B, T, H, E]; returns the output and the weights [B, H, T, T].
fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> R<(Tensor, Tensor)> {
    let e = q.dims()[3] as f64;
    let t = q.dims()[1];
    let s = einsum("bthe,bshe->bhts", q, k)?;
    let s = (s / e.sqrt()).map_err(ce)?;
    let mask: Vec<f64> = (0..t * t)
        .map(|i| if i % t > i / t { -1e10 } else { 0.0 })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), q.device())
        .and_then(|m| m.to_dtype(q.dtype()))
        .map_err(ce)?;
    let s = s.broadcast_add(&mask).map_err(ce)?;
    let mx = s.max_keepdim(D::Minus1).map_err(ce)?;
    let ex = s.broadcast_sub(&mx).and_then(|x| x.exp()).map_err(ce)?;
    let p = ex
        .broadcast_div(&ex.sum_keepdim(D::Minus1).map_err(ce)?)
        .map_err(ce)?;
    let out = einsum("bhts,bshe->bthe", &p, v)?;
    Ok((out, p))
}

fn attention_vjp(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &Tensor,
    g: &Tensor,
) -> R<(Tensor, Tensor, Tensor)> {
    let e = q.dims()[3] as f64;
    let dv = einsum("bhts,bthe->bshe", p, g)?;
    let dp = einsum("bthe,bshe->bhts", g, v)?;
    let dot = dp
        .mul(p)
        .and_then(|x| x.sum_keepdim(D::Minus1))
        .map_err(ce)?;
    let ds = dp.broadcast_sub(&dot).and_then(|x| x.mul(p)).map_err(ce)?;
    let ds = (ds / e.sqrt()).map_err(ce)?;
    let dq = einsum("bhts,bshe->bthe", &ds, k)?;
    let dk = einsum("bhts,bthe->bshe", &ds, q)?;
    Ok((dq, dk, dv))
}
