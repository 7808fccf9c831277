//! Mixed precision's one rule for values: a 16-bit float (bf16, f16) is
//! widened to f32 wherever it accumulates — an accumulating kernel, the loss,
//! a sum over devices, and the MPI wire, which carries no 16-bit types — and
//! narrowed back after. Every place that widens asks here.

use candle_core::{DType, Result, Tensor};

/// Whether `d` is a 16-bit float (mixed precision's compute type).
pub fn is_half(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16)
}

/// `t` in f32 when it is a 16-bit float; otherwise `t` itself.
pub fn widen(t: &Tensor) -> Result<Tensor> {
    if is_half(t.dtype()) {
        t.to_dtype(DType::F32)
    } else {
        Ok(t.clone())
    }
}
