//! Stochastic gradient descent, with optional (Nesterov) momentum (optax.sgd).

use super::fused::Pass;
use super::{ce, Rule, Slots, Whole, R};
use candle_core::Tensor;

pub struct Sgd {
    pub momentum: f64,
    pub nesterov: bool,
}

impl Rule for Sgd {
    fn slots(&self) -> Slots {
        Slots {
            m: self.momentum > 0.0,
            v: None,
        }
    }

    fn steps_in_place(&self) -> bool {
        true
    }

    fn flops(&self, shape: &[usize]) -> f64 {
        4.0 * shape.iter().map(|d| *d as f64).product::<f64>()
    }

    fn zero_is_still(&self) -> bool {
        // Plain SGD leaves a parameter with a zero gradient exactly as it is.
        self.momentum == 0.0
    }

    fn has_fused(&self, _m: Option<&Tensor>, _v: Option<&Tensor>) -> bool {
        true
    }

    fn fused(
        &self,
        lr: f64,
        _t: i32,
        p: &Tensor,
        g: &Tensor,
        s: f64,
        m: Option<&Tensor>,
        _v: Option<&Tensor>,
    ) -> R<()> {
        match m {
            Some(m) => {
                m.inplace_op2(
                    g,
                    &Pass::Linear {
                        a: self.momentum,
                        b: s,
                    },
                )
                .map_err(ce)?;
                p.inplace_op3(
                    m,
                    g,
                    &Pass::Momentum {
                        lr,
                        s,
                        mu: self.momentum,
                        nesterov: self.nesterov,
                    },
                )
                .map_err(ce)
            }
            None => p.inplace_op2(g, &Pass::Plain { lr, s }).map_err(ce),
        }
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
        let Some(m) = m else {
            return Ok((g.clone(), None, v.cloned()));
        };
        let m = (m.affine(self.momentum, 0.0).map_err(ce)? + g).map_err(ce)?;
        let d = if self.nesterov {
            (g + m.affine(self.momentum, 0.0).map_err(ce)?).map_err(ce)?
        } else {
            m.clone()
        };
        Ok((d, Some(m), v.cloned()))
    }
}
