//! Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural
//! networks"): momentum SGD whose update of a 2-D weight is orthogonalised by
//! five Newton–Schulz iterations, scaled to AdamW's update size as Moonlight
//! does (Liu et al. 2025, "Muon is Scalable for LLM Training": 0.2·√max(A, B)
//! for an A×B matrix, so one learning rate and weight decay serve both), with
//! decoupled weight decay. One slot (`m`).
//!
//! ```text
//! m ← μ·m + g
//! u = g + μ·m (Nesterov) or m
//! O = NS₅(u / (‖u‖_F + 1e-7)),  X ← aX + (bA + cA²)X with A = XXᵀ,
//!     (a, b, c) = (3.4445, −4.7750, 2.0315), on the wide orientation
//! p ← p − lr·(0.2·√max(A, B)·O + wd·p)
//! ```
//!
//! Only 2-D weights that are not embedding rows take it; the others (biases,
//! norm scales, embeddings and tables) step with AdamW and the `adam_*`
//! hyperparameters ([`crate::step::Step::of`] decides). The orthogonalisation
//! needs the whole matrix: on a weight split over mesh axes the update is
//! gathered first (an all-gather the plan counts and the checker reports,
//! N0001), every device orthogonalises it, and each keeps its own piece.

use super::{ce, Rule, Slots, Whole, R};
use candle_core::Tensor;

/// Newton–Schulz coefficients of the quintic iteration.
pub const NS: (f64, f64, f64) = (3.4445, -4.7750, 2.0315);

/// Added to the Frobenius norm before dividing by it.
const NORM_EPS: f64 = 1e-7;

pub struct Muon {
    pub momentum: f64,
    pub nesterov: bool,
    pub ns_steps: usize,
    pub weight_decay: f64,
}

/// `steps` Newton–Schulz iterations towards the orthogonal factor of `u`
/// (a 2-D matrix), normalised by its Frobenius norm first.
pub fn orthogonalize(u: &Tensor, steps: usize) -> R<Tensor> {
    let (a, b, c) = NS;
    let norm = u
        .sqr()
        .and_then(|s| s.sum_all())
        .and_then(|s| s.sqrt())
        .and_then(|s| crate::kernels::host::scalar(&s))
        .map_err(ce)?;
    let mut x = u.affine(1.0 / (norm + NORM_EPS), 0.0).map_err(ce)?;
    let dims = u.dims();
    let tall = dims.first() > dims.get(1);
    if tall {
        x = x.t().and_then(|t| t.contiguous()).map_err(ce)?;
    }
    for _ in 0..steps {
        let xt = x.t().map_err(ce)?;
        let a_ = x.matmul(&xt).map_err(ce)?;
        let aa = a_.matmul(&a_).map_err(ce)?;
        let bm = (a_.affine(b, 0.0).map_err(ce)? + aa.affine(c, 0.0).map_err(ce)?).map_err(ce)?;
        x = (x.affine(a, 0.0).map_err(ce)? + bm.matmul(&x).map_err(ce)?).map_err(ce)?;
    }
    if tall {
        x = x.t().and_then(|t| t.contiguous()).map_err(ce)?;
    }
    Ok(x)
}

/// The factor that gives an orthogonal A×B update AdamW's typical size.
pub fn rms_scale(dims: &[usize]) -> f64 {
    0.2 * (dims.iter().copied().max().unwrap_or(1) as f64).sqrt()
}

impl Rule for Muon {
    fn slots(&self) -> Slots {
        Slots { m: true, v: None }
    }

    fn whole_matrix(&self) -> bool {
        true
    }

    fn composed(
        &self,
        _lr: f64,
        _t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        _v: Option<&Tensor>,
        whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let m = m.ok_or("muon without its momentum")?;
        let mu = self.momentum;
        let m = (m.affine(mu, 0.0).map_err(ce)? + g).map_err(ce)?;
        let u = if self.nesterov {
            (g + m.affine(mu, 0.0).map_err(ce)?).map_err(ce)?
        } else {
            m.clone()
        };
        let full = whole.gather(&u)?;
        if full.rank() != 2 {
            return Err(crate::fault::Fault::Shape(format!(
                "muon orthogonalises 2-D weights; this one has shape {:?}",
                full.dims()
            )));
        }
        let o = orthogonalize(&full, self.ns_steps)?;
        let o = o.affine(rms_scale(full.dims()), 0.0).map_err(ce)?;
        let mut d = whole.piece(&o)?;
        if self.weight_decay != 0.0 {
            d = (d + p.affine(self.weight_decay, 0.0).map_err(ce)?).map_err(ce)?;
        }
        Ok((d, Some(m), None))
    }

    fn flops(&self, shape: &[usize]) -> f64 {
        // Per iteration on the wide n×k orientation (n ≤ k): XXᵀ (2n²k),
        // A² (2n³) and BX (2n²k), plus the momentum and the step.
        let (n, k) = match shape {
            [a, b] => ((*a).min(*b) as f64, (*a).max(*b) as f64),
            _ => (1.0, shape.iter().map(|d| *d as f64).product::<f64>()),
        };
        let per = 4.0 * n * n * k + 2.0 * n * n * n;
        self.ns_steps as f64 * per + 6.0 * n * k
    }
}
