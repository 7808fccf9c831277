//! Which kernels run. shardc has its own CPU kernels where candle's are slow
//! (the fused optimizer steps, the fast reductions and elementwise passes,
//! cross-entropy's passes, the pooled heap), each chosen only for plain CPU
//! tensors and each agreeing with the candle ops it replaces. The candle-only
//! path is the one a GPU takes; `SHARDC_KERNELS=candle` forces it on the CPU,
//! so that CI runs the generated primitive tests and the seed models on it.

use std::sync::OnceLock;

/// Whether shardc's own CPU kernels may run (`SHARDC_KERNELS` is not
/// `candle`). Read once per process.
pub fn own() -> bool {
    static OWN: OnceLock<bool> = OnceLock::new();
    *OWN.get_or_init(|| std::env::var("SHARDC_KERNELS").map_or(true, |v| v.trim() != "candle"))
}
