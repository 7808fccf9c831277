//! Reductions the kernels use, on candle's CPU tensors, without candle's slow
//! paths. candle sums over a dimension that is not the last element by
//! element, with an index division per element (1.5 ms for the bias gradient
//! of a [256, 2048] output, where a matmul of that size takes 58 µs), and
//! takes a maximum with a branch per element. Here a sum over any dimension
//! but the last adds whole contiguous rows, in order, from zero — each output
//! is still `((0 + x₀) + x₁) + …`, so the bits are candle's — and a maximum
//! over the last dimension keeps one running maximum per lane with candle's
//! comparison (`m < x` replaces; a NaN first element stays), combined in
//! lane order: the same value. Other dtypes, and sums over the last
//! dimension (candle's own fast path), go to candle.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};

/// `t` summed over `dim`, which is kept with size 1.
pub fn sum_keepdim(t: &Tensor, dim: usize) -> Result<Tensor> {
    let last = dim + 1 == t.rank();
    if last || !fast(t) || t.dims().get(dim).is_none() {
        return t.sum_keepdim(dim);
    }
    t.contiguous()?.apply_op1_no_bwd(&SumDim { dim })
}

/// `t` summed over `dim`, which is removed.
pub fn sum(t: &Tensor, dim: usize) -> Result<Tensor> {
    sum_keepdim(t, dim)?.squeeze(dim)
}

/// The maximum over the last dimension, kept with size 1.
pub fn max_last_keepdim(t: &Tensor) -> Result<Tensor> {
    if !fast(t) || t.rank() == 0 || t.elem_count() == 0 {
        return t.max_keepdim(D::Minus1);
    }
    t.contiguous()?.apply_op1_no_bwd(&MaxLast)
}

/// The maximum over `dim` (kept), fast when it is the last.
pub fn max_keepdim(t: &Tensor, dim: usize) -> Result<Tensor> {
    if dim + 1 == t.rank() {
        max_last_keepdim(t)
    } else {
        t.max_keepdim(dim)
    }
}

fn fast(t: &Tensor) -> bool {
    crate::kernels::own() && t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64)
}

fn contiguous<'a, T>(v: &'a [T], l: &Layout) -> Result<&'a [T]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("reduction: contiguous operand expected".into()))?;
    Ok(&v[a..b])
}

struct SumDim {
    dim: usize,
}

fn sum_rows<T: Copy + Default + std::ops::AddAssign>(
    v: &[T],
    pre: usize,
    n: usize,
    post: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); pre * post];
    for (p, o) in out.chunks_exact_mut(post.max(1)).enumerate() {
        for k in 0..n {
            let at = (p * n + k) * post;
            for (x, y) in o.iter_mut().zip(&v[at..at + post]) {
                *x += *y;
            }
        }
    }
    out
}

impl CustomOp1 for SumDim {
    fn name(&self) -> &'static str {
        "sum-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = l.dims();
        let pre: usize = dims[..self.dim].iter().product();
        let n = dims[self.dim];
        let post: usize = dims[self.dim + 1..].iter().product();
        let mut shape = dims.to_vec();
        shape[self.dim] = 1;
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(sum_rows(contiguous(v, l)?, pre, n, post)),
            CpuStorage::F64(v) => CpuStorage::F64(sum_rows(contiguous(v, l)?, pre, n, post)),
            _ => {
                return Err(candle_core::Error::Msg(
                    "sum-rows: f32 or f64 expected".into(),
                ))
            }
        };
        Ok((out, Shape::from(shape)))
    }
}

struct MaxLast;

/// Lanes of independent running maxima.
const LANES: usize = 8;

/// The maximum of each row of `n` (rows independent: over parts of the rows
/// on the worker pool, the bits of one pass); `None` if a part did not run.
fn max_rows<T: Copy + PartialOrd + Send + Sync>(v: &[T], n: usize) -> Option<Vec<T>> {
    let rows = v.len() / n;
    crate::pool::rows_into(rows, 1, n, &|first, k, out| {
        let part = &v[first * n..(first + k) * n];
        for (o, m) in out.iter_mut().zip(max_rows_here(part, n)) {
            o.write(m);
        }
    })
}

fn max_rows_here<T: Copy + PartialOrd>(v: &[T], n: usize) -> impl Iterator<Item = T> + '_ {
    v.chunks_exact(n).map(move |row| {
        // Lane j sees elements j, j + LANES, ..., starting from the
        // first element as candle does (a NaN there stays; any other
        // NaN is never taken).
        let mut lanes = [row[0]; LANES];
        let split = n - n % LANES;
        for c in row[..split].chunks_exact(LANES) {
            for (m, x) in lanes.iter_mut().zip(c) {
                if *m < *x {
                    *m = *x;
                }
            }
        }
        // Lanes in order, then the tail, with the same comparison.
        let mut m = row[0];
        for x in lanes.iter().chain(&row[split..]) {
            if m < *x {
                m = *x;
            }
        }
        m
    })
}

impl CustomOp1 for MaxLast {
    fn name(&self) -> &'static str {
        "max-last"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = l.dims();
        let n = dims[dims.len() - 1].max(1);
        let mut shape = dims.to_vec();
        let last = shape.len() - 1;
        shape[last] = 1;
        let lost = || candle_core::Error::Msg("max-last: a part of the pass did not run".into());
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(max_rows(contiguous(v, l)?, n).ok_or_else(lost)?),
            CpuStorage::F64(v) => CpuStorage::F64(max_rows(contiguous(v, l)?, n).ok_or_else(lost)?),
            _ => {
                return Err(candle_core::Error::Msg(
                    "max-last: f32 or f64 expected".into(),
                ))
            }
        };
        Ok((out, Shape::from(shape)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn bits(t: &Tensor) -> Vec<u64> {
        t.flatten_all()
            .and_then(|t| t.to_dtype(DType::F64))
            .and_then(|t| t.to_vec1::<f64>())
            .expect("values")
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// Candle's bits, for every dim of a few shapes, f32 and f64, strided
    /// operands too; NaN and signed zeros in the maxima.
    #[test]
    fn the_same_bits_as_candle() {
        // The maxima of the largest shape over parts of its rows on two threads.
        crate::pool::set_threads(2);
        let dev = Device::Cpu;
        for shape in [
            vec![7usize],
            vec![5, 13],
            vec![3, 4, 17],
            vec![2, 3, 4, 9],
            vec![300, 1000],
        ] {
            for dt in [DType::F32, DType::F64] {
                let t = Tensor::randn(0f64, 1.0, shape.as_slice(), &dev)
                    .and_then(|t| t.to_dtype(dt))
                    .expect("random");
                for d in 0..shape.len() {
                    let want = t.sum_keepdim(d).expect("candle");
                    assert_eq!(bits(&sum_keepdim(&t, d).expect("ours")), bits(&want));
                }
                assert_eq!(
                    bits(&max_last_keepdim(&t).expect("ours")),
                    bits(&t.max_keepdim(D::Minus1).expect("candle"))
                );
                if shape.len() > 1 {
                    let s = t.transpose(0, 1).expect("strided");
                    assert_eq!(
                        bits(&sum_keepdim(&s, 0).expect("ours")),
                        bits(&s.sum_keepdim(0).expect("candle"))
                    );
                }
            }
        }
        let odd = Tensor::new(
            &[
                [f32::NAN, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0],
                [0.0, -0.0, 1.0, f32::NAN, 3.0, 0.0, 0.0, 0.0, 0.0, -1.0],
                [0.0, f32::NAN, 1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 100.0],
            ],
            &dev,
        )
        .expect("values");
        assert_eq!(
            bits(&max_last_keepdim(&odd).expect("ours")),
            bits(&odd.max_keepdim(D::Minus1).expect("candle"))
        );
        // A NaN seeding a lane must not hide that lane's later maximum.
        let mut row = vec![0.0f32; 16];
        row[1] = f32::NAN;
        row[9] = 100.0;
        let lane = Tensor::from_vec(row, (1, 16), &dev).expect("values");
        assert_eq!(
            bits(&max_last_keepdim(&lane).expect("ours")),
            bits(&lane.max_keepdim(D::Minus1).expect("candle"))
        );
    }
}
