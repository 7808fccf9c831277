//! Adam and AdamW, as optax: bias-corrected moments, eps outside the square
//! root, and (AdamW) decoupled weight decay.

use super::fused::Pass;
use super::{ce, Rule, R};
use candle_core::Tensor;

pub struct Adam {
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: Option<f64>,
}

impl Rule for Adam {
    fn has_fused(&self, m: Option<&Tensor>, v: Option<&Tensor>) -> bool {
        m.is_some() && v.is_some()
    }

    fn fused(
        &self,
        lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        s: f64,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> R<()> {
        let (Some(m), Some(v)) = (m, v) else {
            return Err("adam without its moments".into());
        };
        m.inplace_op2(
            g,
            &Pass::Linear {
                a: self.b1,
                b: (1.0 - self.b1) * s,
            },
        )
        .map_err(ce)?;
        v.inplace_op2(
            g,
            &Pass::Square {
                a: self.b2,
                b: (1.0 - self.b2) * s * s,
            },
        )
        .map_err(ce)?;
        let (c1, c2) = (1.0 - self.b1.powi(t), 1.0 - self.b2.powi(t));
        p.inplace_op3(
            m,
            v,
            &Pass::Adam {
                lr,
                c1,
                c2,
                eps: self.eps,
                wd: self.weight_decay.unwrap_or(0.0),
            },
        )
        .map_err(ce)
    }

    fn composed(
        &self,
        _lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let (Some(m), Some(v)) = (m, v) else {
            return Ok((g.clone(), m.cloned(), v.cloned()));
        };
        let (b1, b2) = (self.b1, self.b2);
        let m =
            (m.affine(b1, 0.0).map_err(ce)? + g.affine(1.0 - b1, 0.0).map_err(ce)?).map_err(ce)?;
        let v = (v.affine(b2, 0.0).map_err(ce)?
            + g.sqr().and_then(|s| s.affine(1.0 - b2, 0.0)).map_err(ce)?)
        .map_err(ce)?;
        let mh = m.affine(1.0 / (1.0 - b1.powi(t)), 0.0).map_err(ce)?;
        let vh = v.affine(1.0 / (1.0 - b2.powi(t)), 0.0).map_err(ce)?;
        let mut d = mh
            .div(
                &vh.sqrt()
                    .and_then(|s| s.affine(1.0, self.eps))
                    .map_err(ce)?,
            )
            .map_err(ce)?;
        if let Some(wd) = self.weight_decay {
            d = (d + p.affine(wd, 0.0).map_err(ce)?).map_err(ce)?;
        }
        Ok((d, Some(m), Some(v)))
    }
}
