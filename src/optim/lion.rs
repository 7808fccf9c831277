//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"),
//! as `optax.lion`: the update is the sign of an interpolation of the
//! momentum and the gradient, with decoupled weight decay; the momentum then
//! moves towards the gradient at a second rate. One slot (`m`), the same
//! size as the parameter.
//!
//! ```text
//! c = b1·m + (1 − b1)·g
//! p ← p − lr·(sign(c) + wd·p)
//! m ← b2·m + (1 − b2)·g
//! ```

use super::{ce, Rule, Slots, Whole, R};
use candle_core::Tensor;

pub struct Lion {
    pub b1: f64,
    pub b2: f64,
    pub weight_decay: f64,
}

impl Rule for Lion {
    fn slots(&self) -> Slots {
        Slots { m: true, v: None }
    }

    fn composed(
        &self,
        _lr: f64,
        _t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        _v: Option<&Tensor>,
        _whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let m = m.ok_or("lion without its momentum")?;
        let (b1, b2) = (self.b1, self.b2);
        let c =
            (m.affine(b1, 0.0).map_err(ce)? + g.affine(1.0 - b1, 0.0).map_err(ce)?).map_err(ce)?;
        let mut d = c.sign().map_err(ce)?;
        if self.weight_decay != 0.0 {
            d = (d + p.affine(self.weight_decay, 0.0).map_err(ce)?).map_err(ce)?;
        }
        let m =
            (m.affine(b2, 0.0).map_err(ce)? + g.affine(1.0 - b2, 0.0).map_err(ce)?).map_err(ce)?;
        Ok((d, Some(m), None))
    }

    fn flops(&self, shape: &[usize]) -> f64 {
        // Two interpolations, the sign, the decay and the step.
        8.0 * shape.iter().map(|d| *d as f64).product::<f64>()
    }
}
