//! One forward and backward pass of a program on the virtual mesh, from global
//! values to global values: the model's output, and each parameter's gradient
//! for a given cotangent of the output. What the primitives' generated tests
//! compare between meshes and against finite differences (`tests/prims.rs`).

use super::exec::{Exec, R};
use super::mesh::Comm;
use super::train::{gather_one, local_piece, sync_grads};
use crate::mesh::{Collectives, Topology};
use crate::prim::lookup::SparseState;
use crate::spmd::{Op, Program};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;

/// What a probe returns (global, row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub output: Vec<f64>,
    /// Per parameter, in program order: its name and its gradient.
    pub grads: Vec<(String, Vec<f64>)>,
}

/// Run `prog` once: parameters and inputs are global arrays (parameters by
/// name; computed ones, buffers, default to their computed value), `ct` the
/// output's cotangent (global). The output must owe no
/// reduction. `dropout_seed`: dropout's stream (as a training step's).
pub fn probe(
    prog: &Program,
    params: &HashMap<String, Vec<f64>>,
    inputs: &[Vec<f64>],
    ct: &[f64],
    dtype: DType,
    dropout_seed: Option<u64>,
) -> R<Probe> {
    let out_id = prog.output.ok_or("the program has no output")? as usize;
    let out_t = prog.nodes[out_id].ty.clone();
    if !out_t.pending.is_empty() {
        return Err(super::exec::Fault::Shape(format!(
            "the output `{out_t}` owes a reduction"
        )));
    }
    let mut with_buffers = super::buffers::computed(prog)?;
    with_buffers.extend(params.iter().map(|(k, v)| (k.clone(), v.clone())));
    let params = &with_buffers;
    let topo = Topology::of(&prog.mesh);
    let comm = Comm::new(topo.clone());
    let input_types: Vec<_> = prog
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Input(_)))
        .map(|n| n.ty.clone())
        .collect();
    let results: Vec<R<Option<Probe>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..topo.devices())
            .map(|rank| {
                let (comm, topo, out_t, input_types) = (&comm, &topo, &out_t, &input_types);
                s.spawn(move || {
                    let r = device(
                        prog,
                        comm,
                        topo,
                        rank,
                        params,
                        inputs,
                        ct,
                        out_t,
                        input_types,
                        dtype,
                        dropout_seed,
                    );
                    if r.is_err() {
                        comm.abort();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a device panicked".into())))
            .collect()
    });
    let mut found = None;
    for r in results {
        if let Some(p) = r? {
            found = Some(p);
        }
    }
    found.ok_or_else(|| "no device reported".into())
}

#[allow(clippy::too_many_arguments)]
fn device(
    prog: &Program,
    comm: &Comm,
    topo: &Topology,
    rank: usize,
    params: &HashMap<String, Vec<f64>>,
    inputs: &[Vec<f64>],
    ct: &[f64],
    out_t: &crate::types::TType,
    input_types: &[crate::types::TType],
    dtype: DType,
    dropout_seed: Option<u64>,
) -> R<Option<Probe>> {
    let dev = Device::Cpu;
    let ex = Exec {
        prog,
        comm,
        rank,
        dtype,
        dev: dev.clone(),
        sparse: SparseState::default(),
        stage: None,
        held: Default::default(),
        bwd: Default::default(),
        counted: Default::default(),
        totals: Default::default(),
    };
    let ps: Vec<Tensor> = prog
        .params
        .iter()
        .map(|p| {
            let v = params
                .get(&p.name)
                .ok_or_else(|| format!("no value for parameter `{}`", p.name))?;
            local_piece(topo, rank, &p.stored, prog, v, dtype, &dev)
        })
        .collect::<R<_>>()?;
    let xs: Vec<Tensor> = input_types
        .iter()
        .zip(inputs)
        .map(|(t, v)| local_piece(topo, rank, t, prog, v, dtype, &dev))
        .collect::<R<_>>()?;
    // The model alone (not the loss lowering appended after it).
    let model = 0..prog.model_nodes();
    let mut tape = ex.empty_tape(&ps, &xs)?;
    ex.forward_range(&mut tape, model.clone(), dropout_seed)?;
    let out_id = prog.output.ok_or("no output")? as usize;
    let out = &tape.vals[out_id];
    // The cotangent of a replicated value is held as addends.
    let (_, rep) = topo.replication(out_t, None);
    let g = local_piece(topo, rank, out_t, prog, ct, dtype, &dev)?;
    let g = (g / rep as f64).map_err(super::exec::Fault::from)?;
    let mut grads = vec![None; prog.params.len()];
    ex.backward_range(&tape, &[(out_id, g)], model, &mut grads)?;
    let grads: Vec<Tensor> = grads
        .into_iter()
        .zip(&ps)
        .map(|(g, p)| g.map_or_else(|| p.zeros_like().map_err(super::exec::Fault::from), Ok))
        .collect::<R<_>>()?;
    // Every parameter trains (a frozen one gets no gradient).
    let step = crate::step::Step::of(
        prog,
        &crate::step::Training {
            loss: crate::spec::Loss::Function,
            metrics: &[],
            accumulate: 1,
            clip: None,
            compute: None,
            optimizer: &|_| crate::spec::Optimizer::default(),
        },
    );
    let grads = sync_grads(&ex, &step, grads)?;
    let mut named = Vec::new();
    for (i, g) in grads.iter().enumerate() {
        if let Some(v) = gather_one(&ex, i, g)? {
            named.push((prog.params[i].name.clone(), v));
        }
    }
    // The output, assembled on device 0 from every device's piece.
    let pieces = comm.gather_to_first(rank, out).map_err(|e| e.to_string())?;
    let Some(pieces) = pieces else {
        return Ok(None);
    };
    let n: usize = out_t.known_shape().iter().product();
    let mut output = vec![0f64; n];
    for (r, piece) in pieces.iter().enumerate() {
        let idx = crate::init::global_indices(topo, r, out_t, &prog.bound)?;
        let vals = crate::prim::Kernel::f64s(piece)?;
        for (i, v) in idx.iter().zip(vals) {
            if let Some(o) = output.get_mut(*i as usize) {
                *o = v;
            }
        }
    }
    Ok(Some(Probe {
        output,
        grads: named,
    }))
}
