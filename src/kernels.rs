//! Which kernels run. shardc has its own CPU kernels where candle's are slow
//! (the fused optimizer steps, the fast reductions and elementwise passes,
//! cross-entropy's passes, the pooled heap), each chosen only for plain CPU
//! tensors and each agreeing with the candle ops it replaces. On a GPU the
//! only one is fused attention (`prim/flash.rs`); everything else is candle's.
//! `SHARDC_KERNELS=candle` turns all of them off (the candle-only path), so
//! that CI runs the generated primitive tests and the seed models on it, and
//! the GPU check compares fused attention with the composed one.

use std::sync::OnceLock;

/// Whether shardc's own CPU kernels may run (`SHARDC_KERNELS` is not
/// `candle`). Read once per process.
pub fn own() -> bool {
    static OWN: OnceLock<bool> = OnceLock::new();
    *OWN.get_or_init(|| std::env::var("SHARDC_KERNELS").map_or(true, |v| v.trim() != "candle"))
}

/// Device→host reads of tensor values. Every place a step needs numbers on
/// the host (the loss, ids and labels, a norm) reads through here, so that
/// what a GPU would copy back is counted: `SHARDC_HOST_READS=1 shardc run`
/// prints the totals, and `tests/host_reads.rs` holds the candle-only path
/// to reading ids and scalars only, never a float tensor's data.
pub mod host {
    use candle_core::{DType, Result, Tensor, WithDType};
    use std::sync::atomic::{AtomicU64, Ordering};

    static READS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);
    static FLOAT_BYTES: AtomicU64 = AtomicU64::new(0);
    static LARGEST_FLOAT: AtomicU64 = AtomicU64::new(0);

    /// What this process has read so far.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Reads {
        pub reads: u64,
        pub bytes: u64,
        /// Bytes of floating-point values (ids and labels are integers).
        pub float_bytes: u64,
        /// The largest single read of floating-point values, in bytes.
        pub largest_float: u64,
    }

    /// The totals so far.
    pub fn reads() -> Reads {
        Reads {
            reads: READS.load(Ordering::Relaxed),
            bytes: BYTES.load(Ordering::Relaxed),
            float_bytes: FLOAT_BYTES.load(Ordering::Relaxed),
            largest_float: LARGEST_FLOAT.load(Ordering::Relaxed),
        }
    }

    fn note(t: &Tensor, float: bool) {
        let bytes = (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        READS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes, Ordering::Relaxed);
        if float {
            FLOAT_BYTES.fetch_add(bytes, Ordering::Relaxed);
            LARGEST_FLOAT.fetch_max(bytes, Ordering::Relaxed);
        }
    }

    /// The values of `t`, flattened, as `T`.
    pub fn read<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
        note(t, t.dtype().is_float());
        t.flatten_all()?.to_dtype(T::DTYPE)?.to_vec1::<T>()
    }

    /// Integer ids or labels carried in a float tensor (a collective's
    /// payload): counted as ids.
    pub fn read_ids(t: &Tensor) -> Result<Vec<i64>> {
        note(t, false);
        let v = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        Ok(v.into_iter().map(|x| x as i64).collect())
    }

    /// The one value of `t` (a scalar or a one-element tensor), as f64.
    pub fn scalar(t: &Tensor) -> Result<f64> {
        read::<f64>(t)?
            .first()
            .copied()
            .ok_or_else(|| candle_core::Error::Msg("an empty tensor read as a scalar".into()))
    }
}
