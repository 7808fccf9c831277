//! The optimizer state's steps: fused in-place steps equal the composed
//! ones, and the plan and the runtime agree on which optimizers step in place.

use super::*;
use crate::spec::Schedule;
use candle_core::{DType, Device};

/// The fused in-place steps equal the composed ones (forced by an all-ones
/// mask, which takes the composed path, in row blocks for the large tensor)
/// for every optimizer that has a kernel, over several steps with clipping (to
/// rounding: the kernels fold constants in another order).
#[test]
fn fused_steps_equal_composed_steps() {
    let dev = Device::Cpu;
    let lr = Schedule::build(crate::vocab::Lr::WarmupCosine, &|k: &str| match k {
        "peak" => Some(0.05),
        "warmup" => Some(1.0),
        "decay" => Some(4.0),
        "end" => Some(0.001),
        _ => None,
    });
    let opt = |kind: OptKind| Optimizer {
        kind,
        lr: lr.clone(),
        ..Optimizer::default()
    };
    let (b1, b2, eps) = (0.9, 0.999, 1e-8);
    let cases = [
        opt(OptKind::Adam { b1, b2, eps }),
        opt(OptKind::AdamW {
            b1,
            b2,
            eps,
            weight_decay: 0.1,
        }),
        opt(OptKind::Sgd {
            momentum: 0.0,
            nesterov: false,
        }),
        opt(OptKind::Sgd {
            momentum: 0.9,
            nesterov: false,
        }),
        opt(OptKind::Sgd {
            momentum: 0.9,
            nesterov: true,
        }),
        opt(OptKind::Adagrad {
            initial_accumulator: 0.1,
            eps,
        }),
    ];
    for dims in [vec![3usize, 5], vec![2049, 1025]] {
        for o in &cases {
            let n: usize = dims.iter().product();
            let wave =
                |k: f64| -> Vec<f64> { (0..n).map(|i| ((i as f64 + k) * 0.37).sin()).collect() };
            let p0 = Tensor::from_vec(wave(0.0), dims.as_slice(), &dev).expect("p");
            let mut fused =
                OptState::new(std::slice::from_ref(&p0), vec![o.clone()]).expect("state");
            let mut composed =
                OptState::new(std::slice::from_ref(&p0), vec![o.clone()]).expect("state");
            let (mut pf, mut pc) = (vec![p0.clone()], vec![p0.copy().expect("copy")]);
            let ones = Tensor::ones((dims[0], 1), DType::F64, &dev).expect("mask");
            for step in 1..=4 {
                let g =
                    Tensor::from_vec(wave(step as f64 * 11.0), dims.as_slice(), &dev).expect("g");
                let scale = if step == 2 { 0.5 } else { 1.0 };
                fused
                    .update(
                        step,
                        &mut pf,
                        std::slice::from_ref(&g),
                        scale,
                        &[None],
                        &[],
                        &|_| None,
                    )
                    .expect("fused");
                composed
                    .update(
                        step,
                        &mut pc,
                        std::slice::from_ref(&g),
                        scale,
                        &[Some(ones.clone())],
                        &[],
                        &|_| None,
                    )
                    .expect("composed");
            }
            let flat = |t: &Tensor| {
                t.flatten_all()
                    .and_then(|t| t.to_vec1::<f64>())
                    .expect("values")
            };
            let (a, b) = (flat(&pf[0]), flat(&pc[0]));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / (1e-9 + y.abs()))
                .fold(0.0, f64::max);
            assert!(
                worst < 1e-9,
                "{} {dims:?}: fused and composed differ by {worst:e} (relative)",
                o.describe()
            );
            // The parameter moved, and the caller's tensor was not written.
            assert!(
                a.iter().zip(&flat(&p0)).any(|(x, y)| x != y),
                "{} did not step",
                o.describe()
            );
            assert_eq!(
                flat(&p0),
                wave(0.0),
                "{}: the initial tensor was written in place",
                o.describe()
            );
            for (sf, sc) in fused
                .m
                .iter()
                .chain(&fused.v)
                .zip(composed.m.iter().chain(&composed.v))
            {
                if let (Some(x), Some(y)) = (sf, sc) {
                    let (x, y) = (flat(x), flat(y));
                    let worst = x
                        .iter()
                        .zip(&y)
                        .map(|(x, y)| (x - y).abs() / (1e-9 + y.abs()))
                        .fold(0.0, f64::max);
                    assert!(worst < 1e-9, "{}: slots differ by {worst:e}", o.describe());
                }
            }
        }
    }
}

/// The plan counts a replicated piece's slots once per process exactly when
/// the runtime shares them: when the optimizer's rule has a fused in-place
/// step for the slots it keeps (`Rule::steps_in_place`).
#[test]
fn plan_and_runtime_agree_on_which_optimizers_step_in_place() {
    let dev = Device::Cpu;
    let p = Tensor::zeros(4, DType::F32, &dev).expect("p");
    let kinds = [
        OptKind::Adam {
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
        },
        OptKind::AdamW {
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        OptKind::Sgd {
            momentum: 0.0,
            nesterov: false,
        },
        OptKind::Sgd {
            momentum: 0.9,
            nesterov: true,
        },
        OptKind::Adagrad {
            initial_accumulator: 0.1,
            eps: 1e-7,
        },
        OptKind::Ftrl {
            lr_power: -0.5,
            l1: 0.0,
            l2: 0.0,
            initial_accumulator: 0.1,
        },
        OptKind::Frozen,
    ];
    for kind in kinds {
        let o = Optimizer {
            kind,
            lr: Schedule::Constant(0.1),
            ..Optimizer::default()
        };
        let state = OptState::new(std::slice::from_ref(&p), vec![o.clone()]).expect("state");
        assert_eq!(
            state.in_place(0, &p),
            crate::optim::rule(&o).steps_in_place(),
            "{}",
            o.describe()
        );
    }
}
