//! FTRL-proximal (TensorFlow's ApplyFtrl), for embedding tables: the new weight
//! is computed from a linear term and an accumulator, not stepped. It has no
//! fused kernel.

use super::{ce, Rule, Slots, Whole, R};
use candle_core::Tensor;

pub struct Ftrl {
    pub lr_power: f64,
    pub l1: f64,
    pub l2: f64,
    pub initial_accumulator: f64,
}

impl Rule for Ftrl {
    fn slots(&self) -> Slots {
        Slots {
            m: true,
            v: Some(self.initial_accumulator),
        }
    }

    fn flops(&self, shape: &[usize]) -> f64 {
        20.0 * shape.iter().map(|d| *d as f64).product::<f64>()
    }

    fn composed(
        &self,
        lr: f64,
        _t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
        _whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let (Some(lin), Some(acc)) = (m, v) else {
            return Ok((g.clone(), m.cloned(), v.cloned()));
        };
        let acc_new = (acc + g.sqr().map_err(ce)?).map_err(ce)?;
        let pw = |t: &Tensor| t.powf(-self.lr_power).map_err(ce);
        let sigma = ((pw(&acc_new)? - pw(acc)?).map_err(ce)? / lr).map_err(ce)?;
        let lin = ((lin + g).map_err(ce)? - sigma.mul(p).map_err(ce)?).map_err(ce)?;
        let quad = (pw(&acc_new)? / lr)
            .and_then(|t| t.affine(1.0, 2.0 * self.l2))
            .map_err(ce)?;
        let shrunk = lin
            .sign()
            .and_then(|sg| sg.affine(self.l1, 0.0))
            .and_then(|t| t - &lin)
            .and_then(|t| t.div(&quad))
            .map_err(ce)?;
        let keep = lin.abs().and_then(|a| a.gt(self.l1)).map_err(ce)?;
        let w = keep
            .where_cond(&shrunk, &shrunk.zeros_like().map_err(ce)?)
            .map_err(ce)?;
        // p - lr·d = w
        let d = ((p - w).map_err(ce)? / lr).map_err(ce)?;
        Ok((d, Some(lin), Some(acc_new)))
    }
}
