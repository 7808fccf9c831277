//! `lookup(feature, ids, weights?)`: an embedding-table lookup with SparseCore
//! semantics. The table's rows are MOD-placed over the devices of its axis and
//! their SparseCores; each device asks the rows' owners for the ids it holds
//! (request lists all-gathered, rows returned by one all-to-all) and combines
//! each sample's rows (`sum`, `mean`, `sqrtn`, over its valid ids: padding ids
//! are negative, ids `overflow: drop` dropped count as absent). The derivative
//! returns each row's gradient to its owner the same way, and marks the rows
//! looked up (the table's optimizer updates only those).

use super::cost::{CommCost, Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{DType as SDType, ExprKind};
use crate::diag::{did_you_mean, Problem};
use crate::embed::{Combiner, Placement};
use crate::types::{Dim, Poly, TType};
use candle_core::Tensor;
use std::cell::RefCell;
use std::collections::HashMap;

pub const DEFS: &[Def] = &[Def {
    name: "lookup",
    kind: Kind::Function,
    signature: "lookup(feature, ids, weights)",
    rule: "embedding-table lookup (see [tables](#embedding-tables-and-features)): the ids hold the feature's `[samples, valency]` (E0402); optional float per-id weights shaped and split like the ids; the result is `f32[samples, dim]`, samples split like the ids",
    check: Some(check),
    examples: &[],
    differentiable: true,
    same_on_one_device: true,
}];

/// A lookup: the table it reads and how it combines a sample's rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    pub table: String,
    pub combiner: Combiner,
}

/// Embedding tables' placement, and what a step's lookups record: the ids
/// `overflow: drop` dropped, and the rows looked up.
#[derive(Clone, Debug, Default)]
pub struct SparseState {
    /// Per `lookup` node: 1 for each id of the current (global) batch that is
    /// looked up, 0 where the table's `overflow: drop` dropped it.
    pub keep: RefCell<HashMap<usize, Vec<f64>>>,
    /// Embedding tables' row placement, by parameter index.
    pub placements: HashMap<usize, Placement>,
    /// Per table parameter: 1 for each local row this step looked up (the table's
    /// optimizer updates only those), accumulated over microbatches.
    pub touched: RefCell<HashMap<usize, Vec<f64>>>,
}

impl SparseState {
    /// The same placements, with a new step's bookkeeping.
    pub fn fresh(&self) -> SparseState {
        SparseState {
            placements: self.placements.clone(),
            ..SparseState::default()
        }
    }
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 3) {
        return None;
    }
    let ExprKind::Name(fname) = &c.pos[0].kind else {
        cx.report(Problem::WrongKind {
            span: c.pos[0].span,
            expected: "a feature name".into(),
            found: "an expression".into(),
        });
        return None;
    };
    let feat = cx.feature(fname, c.pos[0].span)?;
    let ids = cx.tensor(c.pos[1], "the ids of `lookup`")?;
    if ids.dtype.is_float() {
        cx.report(Problem::DType {
            span: c.pos[1].span,
            expected: feat.ty.dtype.name().into(),
            found: ids.dtype.name().into(),
            other: Some(feat.dtype_span),
        });
        return None;
    }
    // Optional per-id weights, shaped and laid out like the ids.
    if let Some(we) = c.pos.get(2) {
        let w = cx.tensor(we, "the weights of `lookup`")?;
        if !w.dtype.is_float() || w.dims != ids.dims {
            cx.report(Problem::Mismatch {
                span: we.span,
                expected: format!("f32{}", &ids.to_string()[ids.dtype.name().len()..]),
                found: w.to_string(),
                decl: None,
                detail: "per-id weights are floats shaped and split like the ids".into(),
            });
            return None;
        }
    }
    let table = feat.table;
    let dim = table.dim?;
    // The feature's declared input: [samples, valency]; ids must hold exactly that many.
    let ft = &feat.ty;
    let want = ft.numel().and_then(|p| p.substitute(cx.bound()));
    let have = ids.numel().and_then(|p| p.substitute(cx.bound()));
    if let (Some(w), Some(h)) = (&want, &have) {
        if w != h {
            cx.report_traced(Problem::FeatureTable { span: c.pos[1].span, message: format!("`{fname}` takes {w} ids per batch (`{ft}`), but these ids hold {h} (`{ids}`)"), label: "these ids", table: (feat.span, "feature declared here") }, c.pos[1]);
            return None;
        }
    }
    let samples = ft
        .dims
        .first()
        .map(|d| d.size.clone())
        .unwrap_or(Poly::constant(1));
    let axes = ids.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
    cx.table_operand(&table);
    let out = TType::new(
        SDType::F32,
        vec![
            Dim {
                size: samples,
                axes,
            },
            Dim::replicated(Poly::constant(dim)),
        ],
    );
    Typed::new(
        out,
        Lookup {
            table: table.name.clone(),
            combiner: table.combiner,
        },
    )
}

/// Did-you-mean for an unknown feature.
pub fn unknown_feature(name: &str, span: crate::source::Span, known: Vec<&str>) -> Problem {
    Problem::UnknownName {
        span,
        name: name.to_string(),
        what: "feature",
        suggestion: did_you_mean(name, known),
    }
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
    /// Each id's given weight, 0 for padding.
    present: Vec<f64>,
    /// Each sample's combiner factor (over its present ids).
    factors: Vec<f64>,
}

impl Lookup {
    /// Each id's row of the table (operand 0), weighted by the combiner (0 for
    /// dropped ids) and summed over each sample's valency.
    fn run(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Looked> {
        let (table, ids, ids_t) = (x[0], x[1], ts[1]);
        let n = k.local_shape(out)?.first().copied().unwrap_or(1);
        let flat = Kernel::ints(ids)?;
        let vocab = ts[0]
            .dims
            .first()
            .and_then(|d| d.size.as_const())
            .ok_or("the table's size is unknown")? as usize;
        // Negative ids pad ragged samples.
        if let Some(bad) = flat.iter().find(|i| **i >= vocab as i64) {
            return Err(crate::fault::Fault::Data(format!(
                "id {bad} is outside the table's vocabulary (0..{vocab})"
            )));
        }
        let valency = flat.len() / n.max(1);
        // Valid ids: not padding (negative), not dropped by `overflow: drop`; this
        // device's ids are its block of the batch's.
        let mut valid: Vec<f64> = flat
            .iter()
            .map(|id| f64::from(u8::from(*id >= 0)))
            .collect();
        if let Some(keep) = k.sparse.keep.borrow().get(&k.node) {
            let axes = ids_t
                .dims
                .first()
                .map(|d| d.axes.clone())
                .unwrap_or_default();
            let (i, _) = k.topo().shard_index(k.rank, &axes);
            let l = flat.len();
            let kk = keep
                .get(i * l..(i + 1) * l)
                .ok_or("the drop mask does not cover this device's ids")?;
            valid.iter_mut().zip(kk).for_each(|(v, k)| *v *= k);
        }
        let given: Vec<f64> = match x.get(2) {
            Some(t) => Kernel::f64s(t)?,
            None => vec![1.0; flat.len()],
        };
        // As jax-tpu-embedding: a sample's normaliser is over all its present
        // ids (padding excluded), dropped ones included; only kept ids add rows.
        let present: Vec<f64> = flat
            .iter()
            .zip(&given)
            .map(|(id, w)| if *id >= 0 { *w } else { 0.0 })
            .collect();
        let kept: Vec<bool> = valid.iter().map(|v| *v != 0.0).collect();
        let mut weights = vec![0.0; flat.len()];
        let mut factors = vec![0.0; n];
        for (sample, f) in factors.iter_mut().enumerate() {
            let r = sample * valency..(sample + 1) * valency;
            *f = self.combiner.factor(&present[r.clone()]);
            let gains = self.combiner.gains(&present[r.clone()], &kept[r.clone()]);
            weights[r].copy_from_slice(&gains);
        }
        let rows = fetch_rows(k, table, ts[0], &flat, &valid)?;
        let scale = Tensor::from_vec(weights.clone(), (flat.len(), 1), k.dev)
            .and_then(|t| t.to_dtype(table.dtype()))
            .map_err(ce)?;
        let d = table.dims()[1];
        let y = rows
            .broadcast_mul(&scale)
            .and_then(|r| r.reshape((n, valency, d)))
            .and_then(|r| super::reduce_fast::sum(&r, 1))
            .map_err(ce)?;
        Ok(Looked {
            y,
            ids: flat,
            weights,
            samples: n,
            rows,
            valid,
            present,
            factors,
        })
    }
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
fn gather_requests(k: &Kernel, axis: &str, uniq: &[i64]) -> R<(Vec<i64>, usize)> {
    let ax = [axis.to_string()];
    let count = Tensor::new(&[uniq.len() as f64], k.dev).map_err(ce)?;
    let m = k
        .comm
        .pmax(k.rank, &count, &ax)
        .and_then(|t| crate::kernels::host::read_ids(&t))
        .map_err(ce)?
        .first()
        .copied()
        .unwrap_or(0)
        .max(1) as usize;
    let mut req: Vec<f64> = uniq.iter().map(|i| *i as f64).collect();
    req.resize(m, -1.0);
    let req = Tensor::from_vec(req, m, k.dev).map_err(ce)?;
    let all = k
        .comm
        .all_gather(k.rank, &req, axis, 0)
        .and_then(|t| crate::kernels::host::read_ids(&t))
        .map_err(ce)?;
    Ok((all, m))
}

/// Where each requested id lives on this device: (local row, 1) for ids it
/// owns, (0, 0) otherwise.
fn serve(pl: &Placement, me: usize, all: &[i64]) -> (Vec<u32>, Vec<f64>) {
    all.iter()
        .map(|&q| match (q >= 0).then(|| pl.locate(q as u64)) {
            Some((o, r)) if o == me => (r as u32, 1.0),
            _ => (0, 0.0),
        })
        .unzip()
}

/// Rows `rows` of `table`, each times its mask (0 or 1).
fn masked_rows(k: &Kernel, table: &Tensor, rows: Vec<u32>, mask: Vec<f64>) -> R<Tensor> {
    let n = rows.len();
    let idx = Tensor::from_vec(rows, n, k.dev).map_err(ce)?;
    let m = Tensor::from_vec(mask, (n, 1), k.dev)
        .and_then(|t| t.to_dtype(table.dtype()))
        .map_err(ce)?;
    table
        .index_select(&idx, 0)
        .and_then(|r| r.broadcast_mul(&m))
        .map_err(ce)
}

/// Mark local rows of table parameter `pi` as looked up this step.
fn touch(k: &Kernel, pi: usize, rows: usize, hits: impl Iterator<Item = (u32, f64)>) {
    let mut t = k.sparse.touched.borrow_mut();
    let m = t.entry(pi).or_insert_with(|| vec![0.0; rows]);
    for (r, on) in hits {
        if on > 0.0 {
            if let Some(x) = m.get_mut(r as usize) {
                *x = 1.0;
            }
        }
    }
}

/// Rows [ids, D] for logical ids from the table operand: in place when this
/// device holds the whole table, else fetched from their owners along the
/// table's axis (requests all-gathered, rows returned by one all-to-all).
fn fetch_rows(k: &Kernel, table: &Tensor, tt: &TType, ids: &[i64], weights: &[f64]) -> R<Tensor> {
    let pi = k.table;
    let pl = pi.and_then(|p| k.sparse.placements.get(&p).copied());
    let axes = tt.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
    let (me, n) = k.topo().shard_index(k.rank, &axes);
    let d = table.dims()[1];
    let (uniq, inv) = requests(ids, weights);
    let inv = Tensor::from_vec(inv, ids.len(), k.dev).map_err(ce)?;
    let zero = Tensor::zeros((1, d), table.dtype(), k.dev).map_err(ce)?;
    let mine = if n <= 1 {
        let rows: Vec<u32> = uniq
            .iter()
            .map(|&q| pl.map_or(q as usize, |pl| pl.locate(q as u64).1) as u32)
            .collect();
        let len = rows.len();
        if let Some(pi) = pi {
            touch(k, pi, table.dims()[0], rows.iter().map(|r| (*r, 1.0)));
        }
        let idx = Tensor::from_vec(rows, len, k.dev).map_err(ce)?;
        table.index_select(&idx, 0).map_err(ce)?
    } else {
        let (Some(pl), [axis]) = (pl, axes.as_slice()) else {
            return Err(
                "a table split over several axes, or without a placement, cannot be looked up yet"
                    .into(),
            );
        };
        let (all, m) = gather_requests(k, axis, &uniq)?;
        let (rows, mask) = serve(&pl, me, &all);
        if let Some(pi) = pi {
            touch(
                k,
                pi,
                table.dims()[0],
                rows.iter().copied().zip(mask.iter().copied()),
            );
        }
        let served = masked_rows(k, table, rows, mask)?;
        let recv = k.comm.all_to_all(k.rank, &served, axis, 0, 0).map_err(ce)?;
        recv.reshape((n, m, d))
            .and_then(|t| super::reduce_fast::sum(&t, 0))
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
    k: &Kernel,
    table: &Tensor,
    tt: &TType,
    ids: &[i64],
    weights: &[f64],
    g: &Tensor,
) -> R<Tensor> {
    let pl = k.table.and_then(|p| k.sparse.placements.get(&p).copied());
    let axes = tt.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
    let (me, n) = k.topo().shard_index(k.rank, &axes);
    let d = table.dims()[1];
    let (uniq, inv) = requests(ids, weights);
    let kk = uniq.len();
    let inv = Tensor::from_vec(inv, ids.len(), k.dev).map_err(ce)?;
    // Per distinct id (plus the dropped slot, discarded).
    let gu = Tensor::zeros((kk + 1, d), g.dtype(), k.dev)
        .and_then(|z| z.index_add(&inv, g, 0))
        .and_then(|t| t.narrow(0, 0, kk))
        .map_err(ce)?;
    if n <= 1 {
        let rows: Vec<u32> = uniq
            .iter()
            .map(|&q| pl.map_or(q as usize, |pl| pl.locate(q as u64).1) as u32)
            .collect();
        let idx = Tensor::from_vec(rows, kk, k.dev).map_err(ce)?;
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
    let (all, m) = gather_requests(k, axis, &uniq)?;
    let gu = gu.pad_with_zeros(0, 0, m - kk).map_err(ce)?;
    // One block per owner: the gradients of the ids it owns.
    let mut blocks = Vec::with_capacity(n);
    for o in 0..n {
        let mut mask: Vec<f64> = uniq
            .iter()
            .map(|&q| f64::from(u8::from(pl.locate(q as u64).0 == o)))
            .collect();
        mask.resize(m, 0.0);
        let mask = Tensor::from_vec(mask, (m, 1), k.dev)
            .and_then(|t| t.to_dtype(g.dtype()))
            .map_err(ce)?;
        blocks.push(gu.broadcast_mul(&mask).map_err(ce)?);
    }
    let send = Tensor::cat(&blocks, 0).map_err(ce)?;
    let recv = k.comm.all_to_all(k.rank, &send, axis, 0, 0).map_err(ce)?;
    let (rows, mask) = serve(&pl, me, &all);
    let len = rows.len();
    let idx = Tensor::from_vec(rows, len, k.dev).map_err(ce)?;
    let mask = Tensor::from_vec(mask, (len, 1), k.dev)
        .and_then(|t| t.to_dtype(g.dtype()))
        .map_err(ce)?;
    table
        .zeros_like()
        .and_then(|z| z.index_add(&idx, &recv.broadcast_mul(&mask)?, 0))
        .map_err(ce)
}

impl Primitive for Lookup {
    fn name(&self) -> &'static str {
        "lookup"
    }

    fn attrs(&self) -> Vec<String> {
        vec![
            format!("table: {}", self.table),
            format!("combiner: {}", self.combiner.name()),
        ]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        Forward::of(self.run(k, x, ts, out)?.y)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let Looked {
            y,
            ids,
            weights,
            samples: n,
            rows,
            valid: base,
            present,
            factors,
        } = self.run(k, g.x, g.ts, g.out)?;
        let table = g.x[0];
        let ct = g.g;
        // Each id's row gets its sample's cotangent (times its weight).
        let d = table.dims()[1];
        let valency = ids.len() / n.max(1);
        let scale = Tensor::from_vec(weights.clone(), (ids.len(), 1), k.dev)
            .and_then(|t| t.to_dtype(ct.dtype()))
            .map_err(ce)?;
        let gr = ct
            .unsqueeze(1)
            .and_then(|t| t.broadcast_as((n, valency, d)))
            .and_then(|t| t.reshape((n * valency, d)))
            .and_then(|t| t.broadcast_mul(&scale))
            .map_err(ce)?;
        let dt = fetch_rows_t(k, table, g.ts[0], &ids, &base, &gr)?;
        // d/d weight, per combiner (y the sample's output, g its cotangent,
        // c its factor): sum g·r; mean c·(g·r − g·y); sqrtn c·g·r − c²·w·(g·y).
        let dw = match g.x.get(2) {
            Some(w) => {
                let gs = ct
                    .unsqueeze(1)
                    .and_then(|t| t.broadcast_as((n, valency, d)))
                    .and_then(|t| t.reshape((n * valency, d)))
                    .map_err(ce)?;
                let gr_dot = Kernel::f64s(
                    &rows
                        .mul(&gs)
                        .and_then(|t| super::reduce_fast::sum(&t, 1))
                        .map_err(ce)?,
                )?;
                let gy_dot = Kernel::f64s(
                    &y.mul(ct)
                        .and_then(|t| super::reduce_fast::sum(&t, 1))
                        .map_err(ce)?,
                )?;
                // The factor c is over the present ids (dropped ones included),
                // so a dropped id's weight still moves c; only kept ids add g·r.
                let dw: Vec<f64> = (0..ids.len())
                    .map(|j| {
                        let s = j / valency.max(1);
                        let (kept, pad, c) =
                            (base[j], f64::from(u8::from(ids[j] >= 0)), factors[s]);
                        match self.combiner {
                            Combiner::Mean => pad * c * (kept * gr_dot[j] - gy_dot[s]),
                            Combiner::Sqrtn => {
                                kept * c * gr_dot[j] - pad * c * c * present[j] * gy_dot[s]
                            }
                            Combiner::Sum => kept * gr_dot[j],
                        }
                    })
                    .collect();
                Some(
                    Tensor::from_vec(dw, w.shape(), k.dev)
                        .and_then(|t| t.to_dtype(ct.dtype()))
                        .map_err(ce)?,
                )
            }
            None => None,
        };
        let mut out = vec![Some(dt), None];
        if g.x.len() > 2 {
            out.push(dw);
        }
        Ok(out)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        // Ids to the owners and rows back, forward and backward.
        let (table, ids) = (ts[0], ts[1]);
        let mut comms = Vec::new();
        let dim = out.dims.get(1).and_then(|d| c.size(&d.size)).unwrap_or(0);
        let have = ids.numel().and_then(|p| c.size(&p));
        if let (Some(n), Some(ax)) = (have, table.dims.first().and_then(|d| d.axes.first())) {
            let axes = ids.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
            let devices = c.axes_product(&axes).max(1);
            let bytes = (n / devices) as f64 * (dim as f64 * 4.0 + 8.0) * 2.0;
            if c.axis_size(ax) > 1 {
                comms.push(CommCost {
                    kind: "embedding all-to-all".into(),
                    axes: vec![ax.clone()],
                    bytes,
                    explicit: false,
                });
            }
        }
        Some(Cost { flops: 0.0, comms })
    }
}
