//! Normal initial values in f32, many at a time, with the bits of the one-at-a-
//! time path.
//!
//! Initialising the full GPT-J draws 257 million normals: each one two hashes,
//! a logarithm and a cosine from the platform's libm ([`crate::init::normal`]),
//! 5.6 s on this machine's two cores before step 1 could start. Here the same
//! Box–Muller draw is computed for a block of indices in one branch-free loop
//! that the compiler vectorises (AVX-512 or AVX2 where the CPU has them, picked
//! at run time): the logarithm and cosine are short series of our own, good to
//! about 1e-15 relative — not libm's bits, so each value is first checked. An
//! element is written from the fast value `y` only when the libm path's value
//! `Y` must round to the same f32: `Y` is within [`TOL`] of `y` (relative),
//! and both ends of that interval round to one f32 (rounding is monotone, so
//! `Y` rounds to it too). Anything else — an interval straddling an f32
//! rounding boundary, a cosine near zero (where a reduced argument loses
//! relative accuracy), a truncated normal near or past its cut — takes the
//! one-at-a-time path. So the f32 values are the one-at-a-time path's, bit for
//! bit, on every machine; the fast path only decides how quickly they come.
//! `tests` measure the series against libm (a margin of 2^8 under `TOL`) and
//! compare every output with the one-at-a-time path's.

use crate::init::{bits53, normal, truncated};
use std::f64::consts::{FRAC_2_PI, FRAC_PI_2, LN_2, PI};
use std::mem::MaybeUninit;

/// How far (relative) the fast value may be from libm's for its f32 to be
/// trusted: 2^-40, where the series and the roundings on the way are within
/// about 2^-49 (see `tests::series_stay_far_inside_the_tolerance`).
const TOL: f64 = 1.0 / (1u64 << 40) as f64;
/// Elements per block: computed together, then mended one at a time.
const BLOCK: usize = 256;

/// Writes `(scale * normal(seed, i)) as f32` (with `truncated`, `(scale *
/// truncated(seed, i)) as f32`) for `i` in `first..first + out.len()`.
pub fn normals_f32(
    seed: u64,
    scale: f64,
    truncated: bool,
    first: u64,
    out: &mut [MaybeUninit<f32>],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx2")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { blocks_avx512(seed, scale, truncated, first, out) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { blocks_avx2(seed, scale, truncated, first, out) };
        }
    }
    either(seed, scale, truncated, first, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
fn blocks_avx512(seed: u64, scale: f64, cut: bool, first: u64, out: &mut [MaybeUninit<f32>]) {
    either(seed, scale, cut, first, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn blocks_avx2(seed: u64, scale: f64, cut: bool, first: u64, out: &mut [MaybeUninit<f32>]) {
    either(seed, scale, cut, first, out)
}

/// [`blocks`] for a truncated normal or not: a constant there, because a
/// flag read in the loop keeps it from being vectorised.
#[inline(always)]
fn either(seed: u64, scale: f64, cut: bool, first: u64, out: &mut [MaybeUninit<f32>]) {
    if cut {
        blocks::<true>(seed, scale, first, out)
    } else {
        blocks::<false>(seed, scale, first, out)
    }
}

#[inline(always)]
fn blocks<const CUT: bool>(seed: u64, scale: f64, first: u64, out: &mut [MaybeUninit<f32>]) {
    let mut vals = [0f32; BLOCK];
    let mut good = [0u8; BLOCK];
    let mut at = first;
    for part in out.chunks_mut(BLOCK) {
        let n = part.len();
        // The vectorised loop: no calls, no branches.
        // (An index loop: over `iter_mut().zip(..).take(n)` it was not
        // vectorised, 2.8× slower.)
        let (vals, good) = (&mut vals[..n], &mut good[..n]);
        for k in 0..n {
            let (v, g) = fast(seed, scale, CUT, at.wrapping_add(k as u64));
            vals[k] = v;
            good[k] = g as u8;
        }
        for (k, o) in part.iter_mut().enumerate() {
            let i = at.wrapping_add(k as u64);
            o.write(if good[k] != 0 {
                vals[k]
            } else if CUT {
                (scale * truncated(seed, i)) as f32
            } else {
                (scale * normal(seed, i)) as f32
            });
        }
        at = at.wrapping_add(n as u64);
    }
}

/// `x as f64` for `x < 2^53`, exactly, without a conversion instruction the
/// vector units may lack: two halves through the 2^52 trick.
#[inline(always)]
fn to_f64(x: u64) -> f64 {
    let hi = f64::from_bits(MAGIC.to_bits() | (x >> 26)) - MAGIC;
    let lo = f64::from_bits(MAGIC.to_bits() | (x & ((1 << 26) - 1))) - MAGIC;
    hi * (1u64 << 26) as f64 + lo
}

/// `init::uniform`, bit for bit.
#[inline(always)]
fn uniform(seed: u64, i: u64) -> f64 {
    to_f64(bits53(seed, i)) / (1u64 << 53) as f64
}

/// 1/k! for k in 0..18, exactly as `1.0 / k!` rounds (k! < 2^53 is exact).
const INV_FACT: [f64; 18] = {
    let mut out = [1.0; 18];
    let (mut k, mut f) = (1, 1.0);
    while k < 18 {
        f *= k as f64;
        out[k] = 1.0 / f;
        k += 1;
    }
    out
};

/// 2^52 as f64: `from_bits(MAGIC.to_bits() | x) - MAGIC` is `x as f64` for x < 2^52.
const MAGIC: f64 = 4_503_599_627_370_496.0;

/// ln(u) for normal positive `u`, to about 1e-15 relative: u = 2^e·m with m in
/// [√½, √2), ln m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172, by its
/// series to s^17 (the next term is under 1e-16 of the sum).
#[inline(always)]
fn ln(u: f64) -> f64 {
    const ODD: [f64; 8] = [
        1.0 / 3.0,
        1.0 / 5.0,
        1.0 / 7.0,
        1.0 / 9.0,
        1.0 / 11.0,
        1.0 / 13.0,
        1.0 / 15.0,
        1.0 / 17.0,
    ];
    let bits = u.to_bits();
    let field = f64::from_bits(MAGIC.to_bits() | ((bits >> 52) & 0x7ff)) - MAGIC;
    let m = f64::from_bits((bits & ((1 << 52) - 1)) | 0x3ff0_0000_0000_0000);
    let big = m > std::f64::consts::SQRT_2;
    let m = if big { m * 0.5 } else { m };
    let e = field - 1023.0 + if big { 1.0 } else { 0.0 };
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut p = ODD[7];
    for c in ODD[..7].iter().rev() {
        p = p * z + c;
    }
    e * LN_2 + 2.0 * s * (p * z + 1.0)
}

/// cos(x) for x in [0, 2π], with whether it kept its relative accuracy (not
/// within 2^-10 of a zero). x = n·π/2 + r, |r| ≤ π/4: π/2 in three parts, the
/// first with 20 low bits clear so that n·P1 and x − n·P1 are exact; the third
/// is π/2 − fl(π/2). cos and sin of r by their series to r^16 and r^17.
#[inline(always)]
fn cos(x: f64) -> (f64, bool) {
    const P1: f64 = f64::from_bits(FRAC_PI_2.to_bits() & !((1 << 20) - 1));
    const P2: f64 = FRAC_PI_2 - P1;
    const P3: f64 = 6.123_233_995_736_766e-17;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5 · 2^52
    let t = x * FRAC_2_PI + ROUND;
    let q = t.to_bits() & 3;
    let n = t - ROUND;
    let r = ((x - n * P1) - n * P2) - n * P3;
    let z = r * r;
    // Σ (−z)^k / (2k)! and Σ (−z)^k / (2k+1)!, k ≤ 8, by Horner in −z.
    let (mut c, mut s) = (INV_FACT[16], INV_FACT[17]);
    for k in (0..8).rev() {
        c = c * -z + INV_FACT[2 * k];
        s = s * -z + INV_FACT[2 * k + 1];
    }
    let sin = s * r;
    let odd = q & 1 == 1;
    let v = if odd { sin } else { c };
    let v = if q == 1 || q == 2 { -v } else { v };
    (v, !odd || r.abs() > 1.0 / 1024.0)
}

/// `init::normal(seed, i)` by the series, and whether its cosine kept its
/// relative accuracy.
#[inline(always)]
fn draw(seed: u64, i: u64) -> (f64, bool) {
    let u1 = uniform(seed, i.wrapping_mul(2)).max(1e-300);
    let u2 = uniform(seed, i.wrapping_mul(2).wrapping_add(1));
    let (c, sure) = cos(2.0 * PI * u2);
    ((-2.0 * ln(u1)).sqrt() * c, sure)
}

/// The element at `i` and whether its f32 is certain.
#[inline(always)]
fn fast(seed: u64, scale: f64, cut: bool, i: u64) -> (f32, bool) {
    let (z, sure) = draw(seed, i);
    let y = scale * z;
    let lo = (y - y.abs() * TOL) as f32;
    let hi = (y + y.abs() * TOL) as f32;
    let kept = !cut || z.abs() < 2.0 * (1.0 - 4.0 * TOL);
    (
        lo,
        sure && kept && y.is_finite() && lo.to_bits() == hi.to_bits(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(seed: u64, scale: f64, cut: bool, first: u64, n: usize) -> Vec<f32> {
        let mut out = vec![MaybeUninit::uninit(); n];
        normals_f32(seed, scale, cut, first, &mut out);
        // SAFETY: `normals_f32` wrote every element.
        out.into_iter()
            .map(|v| unsafe { v.assume_init() })
            .collect()
    }

    #[test]
    fn same_bits_as_one_at_a_time() {
        for (seed, scale, cut, first, n) in [
            (7u64, 0.02, false, 0u64, 100_000usize),
            (42, 1.0, false, u64::MAX - 300, 1_000),
            (3, 0.5, true, 1 << 40, 50_000),
            (9, 0.0, false, 5, 600),
            (11, -3.0, true, 0, 777),
        ] {
            let got = all(seed, scale, cut, first, n);
            for (k, v) in got.iter().enumerate() {
                let i = first.wrapping_add(k as u64);
                let want = if cut {
                    (scale * truncated(seed, i)) as f32
                } else {
                    (scale * normal(seed, i)) as f32
                };
                assert_eq!(v.to_bits(), want.to_bits(), "seed {seed} index {i}");
            }
        }
    }

    #[test]
    fn uniform_has_the_bits_of_init() {
        for i in (0..1_000_000u64).step_by(7).chain([0, u64::MAX, 1 << 63]) {
            assert_eq!(
                uniform(5, i).to_bits(),
                crate::init::uniform(5, i).to_bits()
            );
        }
        for x in [
            0u64,
            1,
            (1 << 26) - 1,
            1 << 26,
            (1 << 53) - 1,
            123_456_789_012_345,
        ] {
            assert_eq!(to_f64(x), x as f64);
        }
    }

    /// The premise of [`TOL`]: over a million draws, the fast normal is
    /// within 2^-48 (relative) of libm's, 256 times inside the tolerance;
    /// and few elements need the slow path.
    #[test]
    fn series_stay_far_inside_the_tolerance() {
        let (mut worst, mut slow) = (0f64, 0usize);
        let n = 1_000_000u64;
        for i in 0..n {
            let (fast, sure) = draw(13, i);
            let exact = normal(13, i);
            if sure {
                worst = worst.max(((fast - exact) / exact).abs());
            }
            slow += usize::from(!fast_ok(13, i));
        }
        assert!(worst < TOL / 256.0, "worst relative error {worst:e}");
        assert!(
            slow < (n / 500) as usize,
            "{slow} of {n} took the slow path"
        );
        let half = std::f64::consts::FRAC_1_SQRT_2;
        for u in [
            1e-300,
            1e-10,
            0.3,
            half - 1e-9,
            half + 1e-9,
            0.999_999,
            1.0 - 1e-16,
        ] {
            let e = ((ln(u) - u.ln()) / u.ln()).abs();
            assert!(e < 1e-14, "ln({u}) off by {e:e}");
        }
    }

    fn fast_ok(seed: u64, i: u64) -> bool {
        fast(seed, 0.02, false, i).1
    }
}
