//! FTRL-proximal (TensorFlow's ApplyFtrl), for embedding tables: the new weight
//! is computed from a linear term and an accumulator, not stepped. It has no
//! fused kernel.

use super::{ce, Rule, R};
use candle_core::Tensor;

pub struct Ftrl {
    pub lr_power: f64,
    pub l1: f64,
    pub l2: f64,
    pub initial_accumulator: f64,
}

impl Rule for Ftrl {
    fn v_init(&self) -> Option<f64> {
        Some(self.initial_accumulator)
    }

    fn has_fused(&self, _m: Option<&Tensor>, _v: Option<&Tensor>) -> bool {
        false
    }

    fn fused(
        &self,
        _lr: f64,
        _t: i32,
        _p: &Tensor,
        _g: &Tensor,
        _s: f64,
        _m: Option<&Tensor>,
        _v: Option<&Tensor>,
    ) -> R<()> {
        Err("FTRL has no fused step".into())
    }

    fn composed(
        &self,
        lr: f64,
        _t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
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
