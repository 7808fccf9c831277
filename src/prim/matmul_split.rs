//! f32 products shared between the cores a device has, through shardc's
//! worker pool ([`crate::pool`]). candle hands a product to gemm on one
//! thread below gemm's threading threshold (which `runtime::mesh::share_cores`
//! raises, because gemm's threads wake through rayon: on this VM
//! `rayon::join` of two 5 µs tasks took 25–56 µs after an idle gap, against
//! products of about 110 µs). The pool's helpers spin a while after each job,
//! so a product split over them costs about half: the classifier's
//! `[32, 784] @ [784, 512]` took 114 µs whole and 58 µs in halves. A product
//! is cut in several parts per thread, which the threads take as they get to
//! them, so a thread on a core another process holds delays one small part.
//!
//! The bits are gemm's own: each part is the same gemm call on a block of the
//! output, and every part falls in the whole product's gemm class
//! ([`same_path`]), whose depth blocking depends on `k` alone, so every
//! element sums its products in the same order (the unit test compares bit
//! for bit with candle's product).

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Multiply-adds from which a product is split (below, the hand-off costs
/// more than half the product).
const SPLIT_FROM: usize = 1 << 21;
/// The fewest multiply-adds a part of a split product has.
const PART_FROM: usize = 1 << 19;

/// `a @ b` (rank 2, or rank 3 with equal batch dims), split over the worker
/// pool when the device has more than one thread and the product is large
/// enough; otherwise candle's product.
pub fn mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shapes = match (a.dims(), b.dims()) {
        ([m, k], [k2, n]) if k == k2 => Some(m * k * n),
        ([ba, m, k], [bb, k2, n]) if k == k2 && ba == bb => Some(ba * m * k * n),
        _ => None,
    };
    let split = crate::kernels::own()
        && shapes.is_some_and(|macs| macs >= SPLIT_FROM)
        && a.dtype() == DType::F32
        && b.dtype() == DType::F32
        && a.device().is_cpu()
        && b.device().is_cpu()
        && crate::pool::threads() > 1;
    if split {
        a.apply_op2_no_bwd(b, &Split)
    } else {
        gemm(a, b)
    }
}

/// candle's matmul; on a GPU, whose GEMM takes only row- or column-major
/// operands with one batch stride, a strided view is copied first.
fn gemm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let a = rows_apart(a, b)?;
    match a.matmul(b) {
        Err(_) if !a.device().is_cpu() => a.contiguous()?.matmul(&b.contiguous()?),
        r => r,
    }
}

/// `broadcast_matmul`, with the GPU's layout limits handled as in [`mm`]:
/// broadcast batch dimensions (stride 0) are materialised there.
pub fn broadcast_mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let a = rows_apart(a, b)?;
    match a.broadcast_matmul(b) {
        Err(_) if !a.device().is_cpu() && a.rank() >= 2 && b.rank() >= 2 => {
            let (l, r) = (a.dims(), b.dims());
            let (lb, rb) = (&l[..l.len() - 2], &r[..r.len() - 2]);
            let batch = candle_core::Shape::from(lb)
                .broadcast_shape_binary_op(&candle_core::Shape::from(rb), "matmul")?;
            let mut ls = batch.dims().to_vec();
            ls.extend_from_slice(&l[l.len() - 2..]);
            let mut rs = batch.dims().to_vec();
            rs.extend_from_slice(&r[r.len() - 2..]);
            let a = a.broadcast_as(ls)?.contiguous()?;
            let b = b.broadcast_as(rs)?.contiguous()?;
            a.matmul(&b)
        }
        r => r,
    }
}

/// `a` as candle's CPU product may read it beside `b`. When `b`'s batch is
/// read with stride 0 (broadcast), candle 0.11 folds `a`'s batch into the
/// rows of one product, assuming `a`'s rows lie `k` apart: for a transposed
/// `a` that reads the wrong elements (the unit test below). Such an `a` is
/// copied row-major first; every other operand goes as it is.
fn rows_apart(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 3 || !a.device().is_cpu() {
        return Ok(a.clone());
    }
    let (st, dims) = (a.stride(), a.dims());
    let row_major = st[ra - 1] == 1 && st[ra - 2] == dims[ra - 1];
    let b_batch: usize = b.dims()[..rb.saturating_sub(2)].iter().product();
    let a_batch: usize = dims[..ra - 2].iter().product();
    let broadcast = b_batch < a_batch
        || b.stride()[..rb.saturating_sub(2)]
            .iter()
            .zip(b.dims())
            .any(|(s, d)| *s == 0 && *d > 1);
    if row_major || !broadcast {
        Ok(a.clone())
    } else {
        a.contiguous()
    }
}

/// gemm picks its algorithm and its depth blocking from a product's shape:
/// a product of at most 256 elements, one with a single row or column, and
/// one of at most 64 × 64 each sum in their own order (a 64 × 64 one blocks
/// the depth by 512, a larger one from the cache sizes and the depth alone).
/// Parts of `other` × `block` (and a last one of `other` × `rest`, where
/// `rest` is not 0) sum like the whole `other` × `len` when they fall in the
/// same class; the order of `other` and the blocked side does not matter to
/// these tests.
fn same_path(other: usize, block: usize, rest: usize, len: usize) -> bool {
    let class = |a: usize, b: usize| (a * b <= 256, a <= 1 || b <= 1, a <= 64 && b <= 64);
    let whole = class(other, len);
    class(other, block) == whole && (rest == 0 || class(other, rest) == whole)
}

/// The split product as a candle op (candle takes the operands' locks).
pub struct Split;

/// An operand's elements as gemm reads them: (batch, row, column) strides and
/// the first element's index, checked against its storage.
#[derive(Clone, Copy)]
struct View {
    start: usize,
    strides: [usize; 3],
}

impl View {
    fn of(l: &Layout, len: usize) -> Result<(View, [usize; 3])> {
        let (dims, st) = (l.dims(), l.stride());
        let (dims, strides) = match (dims, st) {
            ([r, c], [rs, cs]) => ([1, *r, *c], [0, *rs, *cs]),
            ([b, r, c], [bs, rs, cs]) => ([*b, *r, *c], [*bs, *rs, *cs]),
            _ => return Err(err("rank 2 or 3 expected")),
        };
        let start = l.start_offset();
        // The last element gemm may read lies inside the storage.
        if dims.iter().all(|d| *d > 0) {
            let last = dims
                .iter()
                .zip(&strides)
                .try_fold(start, |acc, (d, s)| {
                    (d - 1).checked_mul(*s).and_then(|x| acc.checked_add(x))
                })
                .ok_or_else(|| err("strides overflow"))?;
            if last >= len {
                return Err(err("a view past its storage"));
            }
        }
        Ok((View { start, strides }, dims))
    }
}

fn err(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("split matmul: {what}"))
}

/// Raw pointers handed to the pool's threads: each part writes a block of the
/// output no other part writes, and every pointer outlives `execute`, which
/// returns only when every part has run.
#[derive(Clone, Copy)]
struct Ptrs {
    a: *const f32,
    b: *const f32,
    out: *mut f32,
}
// SAFETY: see the type's comment: the pointees outlive the pool's call, the
// operands are only read, and the parts write disjoint blocks of `out`.
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

impl Ptrs {
    /// The three pointers, each moved `a0`, `b0`, `o0` elements on (a method,
    /// so the pool's closure captures `Ptrs` whole, not its raw fields).
    ///
    /// # Safety
    /// Each offset lies inside its allocation.
    unsafe fn at(self, a0: usize, b0: usize, o0: usize) -> (*const f32, *const f32, *mut f32) {
        // SAFETY: the caller's.
        unsafe { (self.a.add(a0), self.b.add(b0), self.out.add(o0)) }
    }
}

impl CustomOp2 for Split {
    fn name(&self) -> &'static str {
        "split-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(va), CpuStorage::F32(vb)) = (s1, s2) else {
            return Err(err("f32 operands expected"));
        };
        let (a, [nb, m, k]) = View::of(l1, va.len())?;
        let (b, [nb2, k2, n]) = View::of(l2, vb.len())?;
        if nb != nb2 || k != k2 {
            return Err(err("operand shapes do not match"));
        }
        let rank3 = l1.dims().len() == 3;
        let shape: Shape = if rank3 {
            (nb, m, n).into()
        } else {
            (m, n).into()
        };
        let mut out = vec![0f32; nb * m * n];
        if nb * m * n == 0 || k == 0 {
            return Ok((CpuStorage::F32(out), shape));
        }
        let threads = crate::pool::threads();
        // Whole batch items per part when there are enough; else each item
        // in blocks along the longer of its rows and columns, in multiples of
        // 16 (a vector of f32): [`crate::pool::PER_THREAD`] per thread, of at least
        // [`PART_FROM`] multiply-adds, so a thread that falls behind (a core
        // shared with another process) holds up only a small part.
        let per_item = if nb >= threads * crate::pool::PER_THREAD {
            1
        } else {
            let most = (m * n * k / PART_FROM).max(1);
            (threads * crate::pool::PER_THREAD).div_ceil(nb).min(most)
        };
        let along_n = n >= m;
        let len = if along_n { n } else { m };
        let other = if along_n { m } else { n };
        let mut block = len.div_ceil(per_item).next_multiple_of(16).min(len);
        // Wider blocks until every part takes gemm's path for the whole.
        while block < len && !same_path(other, block, len % block, len) {
            block += 16;
        }
        let block = block.min(len);
        let blocks = len.div_ceil(block);
        let parts = nb * blocks;
        let p = Ptrs {
            a: va.as_ptr(),
            b: vb.as_ptr(),
            out: out.as_mut_ptr(),
        };
        crate::pool::run(parts, &|part| {
            let (item, blk) = (part / blocks, part % blocks);
            let lo = blk * block;
            let hi = (lo + block).min(len);
            let (rows, cols) = if along_n { (m, hi - lo) } else { (hi - lo, n) };
            // Element offsets of this part's first element in each operand
            // and in the output: in bounds, as `View::of` checked the last
            // element of each operand, and the output holds nb·m·n.
            let a0 = a.start + item * a.strides[0] + if along_n { 0 } else { lo * a.strides[1] };
            let b0 = b.start + item * b.strides[0] + if along_n { lo * b.strides[2] } else { 0 };
            let o0 = item * m * n + if along_n { lo } else { lo * n };
            // SAFETY: every element gemm reads lies inside its operand
            // (the offsets above stay within the checked views), every element
            // it writes lies inside this part's block of `out`, and no other
            // part writes that block.
            unsafe {
                let (pa, pb, po) = p.at(a0, b0, o0);
                gemm::gemm(
                    rows,
                    cols,
                    k,
                    po,
                    1,
                    n as isize,
                    false,
                    pa,
                    a.strides[2] as isize,
                    a.strides[1] as isize,
                    pb,
                    b.strides[2] as isize,
                    b.strides[1] as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
        Ok((CpuStorage::F32(out), shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, IndexOp};

    /// The split product has the bits of candle's, for row-major and
    /// transposed operands, views that start inside their storage, batches,
    /// and blocks along rows and along columns.
    #[test]
    fn split_products_have_candles_bits() {
        // Parts over two threads (a pool helper and the caller).
        crate::pool::set_threads(2);
        let dev = Device::Cpu;
        let wave = |n: usize, k: f64| -> Tensor {
            let v: Vec<f32> = (0..n)
                .map(|i| ((i as f64 + k) * 0.37).sin() as f32)
                .collect();
            Tensor::from_vec(v, n, &dev).expect("tensor")
        };
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("values")
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        let check = |a: &Tensor, b: &Tensor, what: &str| {
            let want = a.matmul(b).expect("candle");
            let got = a.apply_op2_no_bwd(b, &Split).expect("split");
            assert_eq!(got.dims(), want.dims(), "{what}");
            assert_eq!(bits(&got), bits(&want), "{what}");
        };
        for (m, k, n) in [
            (32, 784, 512),
            (784, 32, 512),
            (300, 70, 20),
            (5, 3, 100),
            (16, 4096, 1040),
            (2, 2048, 1025),
            (1100, 1024, 16),
        ] {
            let a = wave(m * k, 0.0).reshape((m, k)).expect("a");
            let b = wave(k * n, 9.0).reshape((k, n)).expect("b");
            check(&a, &b, &format!("{m}x{k}x{n}"));
            // Transposed operands, read as they lie.
            let at = wave(m * k, 1.0)
                .reshape((k, m))
                .and_then(|t| t.t())
                .expect("at");
            let bt = wave(k * n, 2.0)
                .reshape((n, k))
                .and_then(|t| t.t())
                .expect("bt");
            check(&at, &bt, &format!("{m}x{k}x{n} transposed"));
            // A view 3 rows into a larger tensor.
            let big = wave((m + 3) * k, 4.0).reshape((m + 3, k)).expect("big");
            check(
                &big.i(3..).expect("view"),
                &b,
                &format!("{m}x{k}x{n} offset"),
            );
        }
        let a = wave(3 * 40 * 64, 0.0).reshape((3, 40, 64)).expect("a");
        let b = wave(3 * 64 * 96, 5.0).reshape((3, 64, 96)).expect("b");
        check(&a, &b, "batched");
        let bt = wave(3 * 64 * 96, 6.0)
            .reshape((3, 96, 64))
            .and_then(|t| t.transpose(1, 2))
            .expect("bt");
        check(&a, &bt, "batched, transposed");
    }

    /// A transposed left operand beside a broadcast right one (the case
    /// candle's product folds wrongly) gives the product of its copy.
    #[test]
    fn transposed_left_beside_a_broadcast_right() {
        let dev = Device::Cpu;
        let v = |n: usize| -> Vec<f32> { (0..n).map(|i| ((i as f32) * 0.37).sin()).collect() };
        let at = Tensor::from_vec(v(2 * 4 * 3), (2, 4, 3), &dev)
            .and_then(|t| t.transpose(1, 2))
            .expect("a transposed view");
        let a = at.contiguous().expect("its copy");
        let b = Tensor::from_vec(v(4 * 5), (4, 5), &dev).expect("b");
        let vals = |t: Tensor| {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("values")
        };
        let want = vals(broadcast_mm(&a, &b).expect("row-major"));
        assert_eq!(vals(broadcast_mm(&at, &b).expect("transposed")), want);
        let b3 = b
            .unsqueeze(0)
            .and_then(|t| t.broadcast_as((2, 4, 5)))
            .expect("b3");
        assert_eq!(vals(mm(&at, &b3).expect("stride-0 batch")), want);
    }
}
