//! Adagrad (optax.adagrad): an accumulator of squared gradients, starting at
//! `initial_accumulator`.

use super::fused::Pass;
use super::{ce, Rule, Slots, Whole, R};
use candle_core::Tensor;

pub struct Adagrad {
    pub initial_accumulator: f64,
    pub eps: f64,
}

impl Rule for Adagrad {
    fn slots(&self) -> Slots {
        Slots {
            m: false,
            v: Some(self.initial_accumulator),
        }
    }

    fn steps_in_place(&self) -> bool {
        true
    }

    fn flops(&self, shape: &[usize]) -> f64 {
        6.0 * shape.iter().map(|d| *d as f64).product::<f64>()
    }

    fn zero_is_still(&self) -> bool {
        true
    }

    fn has_fused(&self, _m: Option<&Tensor>, v: Option<&Tensor>) -> bool {
        v.is_some()
    }

    fn fused(
        &self,
        lr: f64,
        _t: i32,
        p: &Tensor,
        g: &Tensor,
        s: f64,
        _m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> R<()> {
        let Some(v) = v else {
            return Err("adagrad without its accumulator".into());
        };
        v.inplace_op2(g, &Pass::Square { a: 1.0, b: s * s })
            .map_err(ce)?;
        p.inplace_op3(
            g,
            v,
            &Pass::Adagrad {
                lr,
                s,
                eps: self.eps,
            },
        )
        .map_err(ce)
    }

    fn composed(
        &self,
        _lr: f64,
        _t: i32,
        _p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
        _whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let Some(v) = v else {
            return Ok((g.clone(), m.cloned(), None));
        };
        let v = (v + g.sqr().map_err(ce)?).map_err(ce)?;
        let d = g
            .div(&v.sqrt().and_then(|s| s.affine(1.0, self.eps)).map_err(ce)?)
            .map_err(ce)?;
        Ok((d, m.cloned(), Some(v)))
    }
}
