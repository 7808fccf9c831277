//! Computed initial values: a weight declared `init cos(angles)` (a RoPE table,
//! a mask; with `freeze(...)` a buffer) has a small program of its own in the
//! lowered program's `inits`. It is run here once, in f64 on one device of a
//! one-device mesh (the checker made sure every value in it is whole and reads
//! no input or parameter), and the result is the parameter's global array,
//! which the runtime then slices for each device like any initial value.

use super::exec::{Exec, R};
use super::mesh::Comm;
use crate::init::Init;
use crate::mesh::Topology;
use crate::spmd::{Param, Program};
use candle_core::{DType, Device};
use std::collections::HashMap;

/// The global value of every parameter with a computed initial value, by name.
pub fn computed(prog: &Program) -> R<HashMap<String, Vec<f64>>> {
    let mut out = HashMap::new();
    for p in &prog.params {
        if let Init::Computed(k) = p.init {
            out.insert(p.name.clone(), evaluate(prog, p, k)?);
        }
    }
    Ok(out)
}

/// The initial global value of `p`: computed, or from its initializer.
pub fn initial(prog: &Program, p: &Param, seed: u64) -> R<Vec<f64>> {
    match p.init {
        Init::Computed(k) => evaluate(prog, p, k),
        init => {
            let n: usize = p.stored.known_shape().iter().product();
            let idx: Vec<u64> = (0..n as u64).collect();
            Ok(init.values(
                &p.stored,
                seed ^ crate::init::hash_str(&p.name),
                &idx,
                &prog.bound,
            ))
        }
    }
}

fn evaluate(prog: &Program, p: &Param, k: usize) -> R<Vec<f64>> {
    let init = prog
        .inits
        .get(k)
        .ok_or_else(|| format!("the initial value of `{}` has no program", p.name))?;
    let out = init
        .output
        .ok_or_else(|| format!("the initial value of `{}` has no result", p.name))?
        as usize;
    let comm = Comm::new(Topology::of(&[]));
    let ex = Exec {
        prog: init,
        comm: &comm,
        rank: 0,
        dtype: DType::F64,
        dev: Device::Cpu,
        sparse: Default::default(),
        stage: None,
        held: Default::default(),
        bwd: Default::default(),
        counted: Default::default(),
        totals: Default::default(),
    };
    let tape = ex.forward(&[], &[], None).map_err(|e| {
        e.fault
            .context(&format!("computing the initial value of `{}`", p.name))
    })?;
    let v = tape.vals[out]
        .flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .map_err(crate::fault::Fault::from)?;
    let want: usize = p.stored.known_shape().iter().product();
    if v.len() != want {
        return Err(crate::fault::Fault::Shape(format!(
            "the initial value of `{}` has {} elements, the parameter {want}",
            p.name,
            v.len()
        )));
    }
    Ok(v)
}
