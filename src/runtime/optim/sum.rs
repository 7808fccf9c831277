//! Gradients summed over a step's microbatches, without a new set of tensors
//! per microbatch: `acc + g` made a fresh gradient-sized tensor each time and
//! kept three sets alive at once (the sum so far, the microbatch's, the new
//! sum). The sum is fresh once, then grows in place.

use super::{bytes, ce, R};
use crate::optim::fused::Pass;
use crate::optim::plain;
use candle_core::Tensor;

/// The gradients of the microbatches so far, summed.
pub struct GradSum {
    grads: Vec<Tensor>,
    /// Whether `grads` are tensors this sum made (then nothing else shares
    /// their storage and they may be written in place); the first
    /// microbatch's are kept as they came.
    owned: bool,
}

impl GradSum {
    /// The first microbatch's gradients.
    pub fn new(grads: Vec<Tensor>) -> Self {
        GradSum {
            grads,
            owned: false,
        }
    }

    /// Add one more microbatch's gradients. In place where both are plain
    /// f32/f64 tensors of one type and shape: `Pass::Linear` with both
    /// factors 1 rounds the exact f64 sum of two f32s once, the same bits as
    /// an f32 add.
    pub fn add(&mut self, g: &[Tensor]) -> R<()> {
        if self.grads.len() != g.len() {
            return Err("gradient sum: a microbatch with another parameter count".into());
        }
        for (acc, g) in self.grads.iter_mut().zip(g) {
            let same = acc.dtype() == g.dtype() && acc.dims() == g.dims();
            if self.owned && same && plain(acc) && plain(g) {
                acc.inplace_op2(g, &Pass::Linear { a: 1.0, b: 1.0 })
                    .map_err(ce)?;
            } else {
                *acc = (&*acc + g).map_err(ce)?;
            }
        }
        self.owned = true;
        Ok(())
    }

    /// The bytes of the tensors the sum made itself, beside the microbatches'
    /// own gradients: none until a second microbatch is added.
    pub fn own_bytes(&self) -> f64 {
        if !self.owned {
            return 0.0;
        }
        self.grads.iter().map(bytes).sum()
    }

    /// The summed gradients.
    pub fn into_vec(self) -> Vec<Tensor> {
        self.grads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The sum in place has the bits of the sum of fresh f32 adds (values of
    /// nine magnitudes, so roundings happen), and the first microbatch's
    /// tensors are not written.
    #[test]
    fn sums_in_place_with_the_bits_of_fresh_adds() {
        let dev = Device::Cpu;
        let wave = |k: f32| -> Vec<f32> {
            (0..1000)
                .map(|i| ((i as f32 + k) * 0.37).sin() * 10f32.powi(i % 9 - 4))
                .collect()
        };
        let t = |k: f32| Tensor::from_vec(wave(k), (10, 100), &dev).expect("tensor");
        let gs: Vec<Tensor> = (0..5).map(|k| t(k as f32 * 3.1)).collect();
        let mut sum = GradSum::new(vec![gs[0].clone()]);
        let mut fresh = gs[0].clone();
        for g in &gs[1..] {
            sum.add(std::slice::from_ref(g)).expect("add");
            fresh = (&fresh + g).expect("fresh add");
        }
        let bits = |x: &Tensor| -> Vec<u32> {
            x.flatten_all()
                .and_then(|x| x.to_vec1::<f32>())
                .expect("values")
                .into_iter()
                .map(f32::to_bits)
                .collect()
        };
        assert_eq!(bits(&sum.into_vec()[0]), bits(&fresh));
        assert_eq!(
            bits(&gs[0]),
            bits(&t(0.0)),
            "the first gradient was written"
        );
    }
}
