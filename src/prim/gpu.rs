//! shardc's own CUDA kernels: their sources compiled by NVRTC on first use
//! (once per process and set of defines), and the plumbing between candle's
//! tensors and a kernel launch (a contiguous tensor's device memory, a new
//! buffer wrapped as a tensor). Built with `--features cuda` only.
//!
//! Why our own: candle composes attention and softmax cross-entropy from
//! one-pass kernels, each a trip through memory; on an H200 they were most of
//! a GPT-2-small step (`shardc run --profile`). The kernels here fuse those
//! passes and run on the tensors' own stream, so they order with candle's.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{Device, Result, Shape, Storage, Tensor};
use std::collections::HashMap;
use std::sync::Mutex;

/// PTX by (kernel file, defines), compiled once per process.
static PTX: Mutex<Option<HashMap<(&'static str, String), String>>> = Mutex::new(None);

/// A module of kernels: the name candle caches it under, and its PTX.
pub struct Module {
    pub name: String,
    pub ptx: String,
}

/// The module compiled from `source` (named `file`) with `defines`
/// prepended (e.g. `#define HD 64`).
pub fn module(file: &'static str, source: &str, defines: &str) -> Result<Module> {
    let mut g = PTX
        .lock()
        .map_err(|_| candle_core::Error::Msg("the GPU kernels' cache is poisoned".into()))?;
    let map = g.get_or_insert_with(HashMap::new);
    let key = (file, defines.to_string());
    let name = format!(
        "shardc_{file}_{}",
        defines.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    );
    if let Some(p) = map.get(&key) {
        return Ok(Module {
            name,
            ptx: p.clone(),
        });
    }
    let ptx = nvrtc::compile_ptx(format!("{defines}\n{source}"))
        .map_err(|e| candle_core::Error::Msg(format!("compiling shardc's {file} kernels: {e}")))?
        .to_src();
    map.insert(key, ptx.clone());
    Ok(Module { name, ptx })
}

/// The GPU `t` lives on, if it does.
pub fn cuda(t: &Tensor) -> Option<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Some(d.clone()),
        _ => None,
    }
}

/// A contiguous tensor's storage, read-locked, and where its elements start.
pub struct Slice<'a> {
    guard: candle_core::StorageRef<'a>,
    start: usize,
    len: usize,
}

impl Slice<'_> {
    /// Its elements as the kernel argument they are.
    pub fn view<T: CudaDType + DeviceRepr>(&self) -> Result<CudaView<'_, T>> {
        match &*self.guard {
            Storage::Cuda(c) => Ok(c
                .as_cuda_slice::<T>()?
                .slice(self.start..self.start + self.len)),
            _ => Err(candle_core::Error::Msg(
                "an operand of shardc's GPU kernels is not on the GPU".into(),
            )),
        }
    }
}

/// `t`'s device memory; `t` must be contiguous (see [`Tensor::contiguous`]).
pub fn slice(t: &Tensor) -> Slice<'_> {
    let (guard, layout) = t.storage_and_layout();
    Slice {
        guard,
        start: layout.start_offset(),
        len: t.elem_count(),
    }
}

/// The launch of a grid-strided elementwise kernel over `n` elements: 256
/// threads a block, at most 65,535 blocks (each thread then takes several).
pub fn elementwise(n: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel's output buffer as a contiguous tensor of `shape`.
pub fn wrap<T: CudaDType>(x: CudaSlice<T>, dev: &CudaDevice, shape: impl Into<Shape>) -> Tensor {
    let st = CudaStorage::wrap_cuda_slice(x, dev.clone());
    Tensor::from_storage(Storage::Cuda(st), shape, BackpropOp::none(), false)
}

/// Each tensor's sum of squares, in f64 ([n] on their GPU), when all are
/// f32 on one GPU and shardc's own kernels are on: two launches per tensor
/// and no host synchronisation (`sums.cu`).
pub fn sums_of_squares(ts: &[&Tensor]) -> Option<Result<Tensor>> {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    const THREADS: usize = 256;
    const BLOCKS: usize = 256;
    let dev = cuda(ts.first()?)?;
    let fits = ts.iter().all(|t| {
        t.dtype() == candle_core::DType::F32 && cuda(t).is_some_and(|d| d.id() == dev.id())
    });
    if !crate::kernels::own() || !fits {
        return None;
    }
    Some((|| {
        let k = module("sums", include_str!("sums.cu"), "")?;
        let part_f = dev.get_or_load_custom_func("sq_part", &k.name, &k.ptx)?;
        let total_f = dev.get_or_load_custom_func("sq_total", &k.name, &k.ptx)?;
        // SAFETY (both): every slot and every used partial is written first.
        let out = unsafe { dev.alloc::<f64>(ts.len())? };
        let part = unsafe { dev.alloc::<f64>(BLOCKS)? };
        for (slot, t) in ts.iter().enumerate() {
            let c = t.contiguous()?;
            let s = slice(&c);
            let x = s.view::<f32>()?;
            let n = c.elem_count();
            let blocks = n.div_ceil(THREADS).clamp(1, BLOCKS);
            let nn = n as i64;
            let mut l = part_f.builder();
            l.arg(&x).arg(&nn).arg(&part);
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: (THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads n elements of x; writes `blocks` partials.
            unsafe { l.launch(cfg) }.w()?;
            let (b, si) = (blocks as i32, slot as i32);
            let mut l = total_f.builder();
            l.arg(&part).arg(&b).arg(&out).arg(&si);
            // SAFETY: reads the partials just written; writes one slot.
            unsafe { l.launch(LaunchConfig::for_num_elems(1)) }.w()?;
        }
        Ok(wrap(out, &dev, ts.len()))
    })())
}
