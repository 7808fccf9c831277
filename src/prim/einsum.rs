//! `einsum("btd,dkhe->kbthe", a, b, ...)`: one size and one layout per letter
//! across the operands; output letters keep their layout; a contracted letter
//! split over an axis leaves a pending sum over it. Any number of operands;
//! letters that only one operand has and the output lacks are summed out.

use super::cost::{CommCost, Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, axes_text, split_and_pending, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{ExprKind, ReduceOp};
use crate::diag::Problem;
use crate::types::{Dim, TType};
use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};

pub const DEFS: &[Def] = &[Def {
    name: "einsum",
    kind: Kind::Function,
    signature: "einsum(\"btd,dkhe->kbthe\", a, b, ...)",
    rule: "one size per letter (E0208), one layout per letter (E0213); output letters keep their layout; a contracted letter split over `ax` gives `partial(ax)`; at most one partial operand; a letter once per operand and once in the output; bad specification E0217",
    check: Some(check),
    examples: &[
        "einsum(\"ij,jk->ik\", {a: f32[4, 6]}, {b: f32[6, 2]})",
        "einsum(\"bij,bjk->bki\", {a: f32[2, 4, 6]}, {b: f32[2, 6, 3]})",
        "einsum(\"ij,j->i\", {a: f32[4, 6]}, {b: f32[6]})",
        "einsum(\"ij->ji\", {a: f32[4, 6]})",
        "einsum(\"ijk,jl->il\", {a: f32[4, 6, 2]}, {b: f32[6, 3]})",
        "einsum(\"ij,jk,kl->il\", {a: f32[4, 6]}, {b: f32[6, 2]}, {c: f32[2, 3]})",
    ],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct Einsum {
    /// The operands' letters and the output's, without whitespace.
    pub inputs: Vec<String>,
    pub output: String,
}

impl Einsum {
    fn spec(&self) -> String {
        format!("{}->{}", self.inputs.join(","), self.output)
    }
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let e = c.expr;
    if c.pos.len() < 2 {
        arity(cx, c, 2, 9);
        return None;
    }
    if !super::rules::known_named(cx, c, &[]) {
        return None;
    }
    let ExprKind::Str(spec) = &c.pos[0].kind else {
        cx.report(Problem::WrongKind {
            span: c.pos[0].span,
            expected: "an einsum specification string".into(),
            found: "an expression".into(),
        });
        return None;
    };
    let sspan = c.pos[0].span;
    let bad_spec = |cx: &mut dyn Rules, message: String| {
        cx.report(Problem::Einsum {
            span: sspan,
            message,
        });
    };
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let Some((ins, out)) = spec.split_once("->") else {
        bad_spec(cx, "missing `->` and output".into());
        return None;
    };
    let ins: Vec<&str> = ins.split(',').collect();
    if let Some(bad) = spec
        .chars()
        .find(|c| !c.is_ascii_alphabetic() && !",->".contains(*c))
    {
        bad_spec(cx, format!("`{bad}` is not a dimension letter"));
        return None;
    }
    if ins.len() != c.pos.len() - 1 {
        bad_spec(
            cx,
            format!(
                "{} inputs in the specification, {} operands given",
                ins.len(),
                c.pos.len() - 1
            ),
        );
        return None;
    }
    for (i, s) in ins.iter().enumerate() {
        if let Some(l) = s.chars().find(|l| s.matches(*l).count() > 1) {
            bad_spec(
                cx,
                format!(
                    "letter `{l}` appears twice in operand {} (`{s}`); diagonals are not supported",
                    i + 1
                ),
            );
            return None;
        }
    }
    let mut ops = Vec::new();
    for (i, x) in c.pos[1..].iter().enumerate() {
        let t = cx.tensor(x, "`einsum`")?;
        if t.rank() != ins[i].len() {
            cx.report(Problem::Einsum {
                span: x.span,
                message: format!(
                    "operand {} has rank {} but `{}` names {} dimensions",
                    i + 1,
                    t.rank(),
                    ins[i],
                    ins[i].len()
                ),
            });
            return None;
        }
        ops.push((t, *x));
    }
    let typed: Vec<(&TType, &crate::ast::Expr)> = ops.iter().map(|(t, x)| (t, *x)).collect();
    if !super::rules::same_dtype(cx, &typed, c.expr) {
        return None;
    }
    let pendings = ops.iter().filter(|o| !o.0.pending.is_empty()).count();
    if pendings > 1 {
        if let Some((t, x)) = ops.iter().rev().find(|o| !o.0.pending.is_empty()) {
            cx.need_reduced(t, "an einsum of two partial values", x);
        }
        return None;
    }
    // Each letter: one size and one layout across all operands.
    let mut letters: BTreeMap<char, (Dim, usize, usize)> = BTreeMap::new();
    for (oi, (t, x)) in ops.iter().enumerate() {
        for (di, ch) in ins[oi].chars().enumerate() {
            let d = &t.dims[di];
            match letters.get_mut(&ch) {
                None => {
                    letters.insert(ch, (d.clone(), oi, di));
                }
                Some((prev, poi, _)) => {
                    if prev.size != d.size {
                        let (pt, px) = &ops[*poi];
                        cx.report_traced(
                            Problem::Contraction {
                                span: e.span,
                                lhs: (px.span, pt.to_string()),
                                rhs: (x.span, t.to_string()),
                                lhs_dim: format!("`{ch}` = {}", prev.size),
                                rhs_dim: format!("`{ch}` = {}", d.size),
                            },
                            e,
                        );
                        return None;
                    }
                    if prev.axes.is_empty() {
                        prev.axes = d.axes.clone();
                    } else if !d.axes.is_empty() && d.axes != prev.axes {
                        let (pt, px) = &ops[*poi];
                        cx.report_traced(
                            Problem::Ambiguous {
                                span: e.span,
                                lhs: (
                                    px.span,
                                    format!(
                                        "`{ch}` split over {} in `{pt}`",
                                        axes_text(&prev.axes)
                                    ),
                                ),
                                rhs: (
                                    x.span,
                                    format!("`{ch}` split over {} in `{t}`", axes_text(&d.axes)),
                                ),
                                detail: format!(
                                    "dimension `{ch}` is split differently in two operands"
                                ),
                            },
                            e,
                        );
                        return None;
                    }
                }
            }
        }
    }
    // One axis cannot split two letters: the contraction would see only the
    // blocks where they meet.
    let all: Vec<Dim> = letters.values().map(|l| l.0.clone()).collect();
    if let Some(ax) = super::rules::twice(&all) {
        cx.report_traced(
            Problem::Ambiguous {
                span: e.span,
                lhs: (ops[0].1.span, ops[0].0.to_string()),
                rhs: (ops[ops.len() - 1].1.span, ops[ops.len() - 1].0.to_string()),
                detail: format!("axis `{ax}` would split two letters of the einsum"),
            },
            e,
        );
        return None;
    }
    let mut dims = Vec::new();
    for ch in out.chars() {
        let Some((d, _, _)) = letters.get(&ch) else {
            bad_spec(
                cx,
                format!("output letter `{ch}` does not appear in any input"),
            );
            return None;
        };
        if out.matches(ch).count() > 1 {
            bad_spec(cx, format!("output letter `{ch}` appears twice"));
            return None;
        }
        dims.push(d.clone());
    }
    let mut pending = ops
        .iter()
        .flat_map(|o| o.0.pending.clone())
        .collect::<BTreeMap<_, _>>();
    for (ch, (d, _, _)) in &letters {
        if !out.contains(*ch) {
            for a in &d.axes {
                // A partial operand summed over an axis it already owes a sum over.
                if let Some((t, x)) = ops.iter().find(|o| o.0.pending.contains_key(a)) {
                    cx.need_reduced(t, "an einsum contracted over the same axis", x);
                    return None;
                }
                pending.insert(a.clone(), ReduceOp::Sum);
            }
        }
    }
    if let Some(ax) = split_and_pending(&dims, &pending) {
        cx.report_traced(
            Problem::Ambiguous {
                span: e.span,
                lhs: (ops[0].1.span, ops[0].0.to_string()),
                rhs: (ops[ops.len() - 1].1.span, ops[ops.len() - 1].0.to_string()),
                detail: format!("axis `{ax}` would be used twice in the result"),
            },
            e,
        );
        return None;
    }
    let ty = TType {
        dtype: ops[0].0.dtype,
        dims,
        pending,
    };
    Typed::new(
        ty,
        Einsum {
            inputs: ins.iter().map(|s| s.to_string()).collect(),
            output: out.to_string(),
        },
    )
}

/// The layout each letter is computed in: the output's, else (for a contracted
/// letter) whichever operand splits it.
fn layout(ins: &[String], o: &str, ts: &[&TType], out: &TType) -> HashMap<char, Vec<String>> {
    let mut want: HashMap<char, Vec<String>> = Default::default();
    for (c, d) in o.chars().zip(&out.dims) {
        want.insert(c, d.axes.clone());
    }
    for (s, t) in ins.iter().zip(ts) {
        for (c, d) in s.chars().zip(&t.dims) {
            let e = want.entry(c).or_default();
            if e.is_empty() && !d.axes.is_empty() && !o.contains(c) {
                *e = d.axes.clone();
            }
        }
    }
    want
}

/// Two-operand einsum through permute + reshape + one batched matmul; every
/// letter of one operand alone must be in the output.
fn einsum2(sa: &str, sb: &str, o: &str, a: &Tensor, b: &Tensor) -> R<Tensor> {
    let size = |c: char| -> usize {
        if let Some(i) = sa.find(c) {
            a.dims()[i]
        } else if let Some(i) = sb.find(c) {
            b.dims()[i]
        } else {
            1
        }
    };
    let batch: Vec<char> = o
        .chars()
        .filter(|c| sa.contains(*c) && sb.contains(*c))
        .collect();
    let contr: Vec<char> = sa
        .chars()
        .filter(|c| sb.contains(*c) && !o.contains(*c))
        .collect();
    let af: Vec<char> = sa.chars().filter(|c| !sb.contains(*c)).collect();
    let bf: Vec<char> = sb.chars().filter(|c| !sa.contains(*c)).collect();
    let perm = |s: &str, order: &[char]| -> Vec<usize> {
        order.iter().filter_map(|c| s.find(*c)).collect()
    };
    let prod = |cs: &[char]| -> usize { cs.iter().map(|c| size(*c)).product() };
    if let Some(c) = einsum2_direct(sa, sb, o, a, b, &batch, &size)? {
        return Ok(c);
    }
    let mut ao: Vec<char> = batch.clone();
    ao.extend(&af);
    ao.extend(&contr);
    let mut bo: Vec<char> = batch.clone();
    bo.extend(&contr);
    bo.extend(&bf);
    let a2 = a
        .permute(perm(sa, &ao))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((prod(&batch), prod(&af), prod(&contr))))
        .map_err(ce)?;
    let b2 = b
        .permute(perm(sb, &bo))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((prod(&batch), prod(&contr), prod(&bf))))
        .map_err(ce)?;
    let c = super::matmul_split::mm(&a2, &b2).map_err(ce)?;
    let mut co: Vec<char> = batch.clone();
    co.extend(&af);
    co.extend(&bf);
    let shape: Vec<usize> = co.iter().map(|c| size(*c)).collect();
    let c = c.reshape(shape).map_err(ce)?;
    let p: Vec<usize> = o
        .chars()
        .filter_map(|ch| co.iter().position(|x| *x == ch))
        .collect();
    c.permute(p).and_then(|t| t.contiguous()).map_err(ce)
}

/// [`einsum2`] as one matmul of the operands as they lie, when no copy is
/// needed: the batch letters lead in both operands and the output, the output
/// goes on with one operand's free letters (the left operand) then the
/// other's, the left operand lies as [batch, free, contracted] or as [batch,
/// contracted, free] (read transposed: gemm packs its left operand anyway),
/// and the right one as [batch, contracted, free], contracted in the left's
/// order. A weight's gradient (`bthe,btd->dhe`) takes this path: permuting
/// both operands and the product into place was 4% of GPT-J's profile at
/// d_model 256. `None` when the letters are not so grouped.
fn einsum2_direct(
    sa: &str,
    sb: &str,
    o: &str,
    a: &Tensor,
    b: &Tensor,
    batch: &[char],
    size: &dyn Fn(char) -> usize,
) -> R<Option<Tensor>> {
    // Byte slicing below: one byte a letter.
    if !(sa.is_ascii() && sb.is_ascii() && o.is_ascii()) {
        return Ok(None);
    }
    let distinct = |s: &str| s.chars().enumerate().all(|(i, c)| !s[..i].contains(c));
    if !(distinct(sa) && distinct(sb) && distinct(o)) {
        return Ok(None);
    }
    let lead: String = batch.iter().collect();
    if !(o.starts_with(&lead) && sa.starts_with(&lead) && sb.starts_with(&lead)) {
        return Ok(None);
    }
    let only = |x: &str, y: &str| -> String { x.chars().filter(|c| !y.contains(*c)).collect() };
    let (fa, fb) = (only(sa, sb), only(sb, sa));
    let rest = &o[lead.len()..];
    let (l, sl, fl, r, sr, fr) = if rest == format!("{fa}{fb}") {
        (a, sa, fa, b, sb, fb)
    } else if rest == format!("{fb}{fa}") {
        (b, sb, fb, a, sa, fa)
    } else {
        return Ok(None);
    };
    let (lrest, rrest) = (&sl[lead.len()..], &sr[lead.len()..]);
    let lc = only(lrest, &fl);
    if rrest != format!("{lc}{fr}") {
        return Ok(None);
    }
    let prod = |s: &str| -> usize { s.chars().map(size).product() };
    let (nb, m, k, n) = (prod(&lead), prod(&fl), prod(&lc), prod(&fr));
    let lhs = if lrest == format!("{fl}{lc}") {
        l.reshape((nb, m, k))
    } else if lrest == format!("{lc}{fl}") {
        l.reshape((nb, k, m)).and_then(|t| t.transpose(1, 2))
    } else {
        return Ok(None);
    };
    let shape: Vec<usize> = o.chars().map(size).collect();
    lhs.and_then(|x| super::matmul_split::mm(&x, &r.reshape((nb, k, n))?))
        .and_then(|c| c.reshape(shape))
        .map(Some)
        .map_err(ce)
}

/// Sum out the letters of `s` that no other operand and not the output has.
fn sum_out(s: &str, x: &Tensor, keep: &dyn Fn(char) -> bool) -> R<(String, Tensor)> {
    let mut x = x.clone();
    let mut letters: Vec<char> = s.chars().collect();
    for i in (0..letters.len()).rev() {
        if !keep(letters[i]) {
            x = super::reduce_fast::sum(&x, i).map_err(ce)?;
            letters.remove(i);
        }
    }
    Ok((letters.into_iter().collect(), x))
}

/// The einsum of local tensors: letters one operand alone has (and the output
/// lacks) are summed out, then operands are contracted pairwise, left to right.
pub fn einsum(ins: &[&str], o: &str, xs: &[&Tensor]) -> R<Tensor> {
    let needed = |c: char, from: usize, skip: Option<usize>| {
        o.contains(c)
            || ins
                .iter()
                .enumerate()
                .any(|(j, s)| j >= from && Some(j) != skip && s.contains(c))
    };
    let mut cur: Vec<(String, Tensor)> = Vec::new();
    for (i, (s, x)) in ins.iter().zip(xs).enumerate() {
        cur.push(sum_out(s, x, &|c| needed(c, 0, Some(i)))?);
    }
    let (mut s, mut t) = cur.remove(0);
    let n = cur.len();
    for (k, (sb, b)) in cur.into_iter().enumerate() {
        let target: String = if k + 1 == n {
            o.to_string()
        } else {
            // Letters still needed by the output or a later operand.
            let mut v: Vec<char> = Vec::new();
            for c in s.chars().chain(sb.chars()) {
                if !v.contains(&c) && needed(c, k + 2, None) {
                    v.push(c);
                }
            }
            v.into_iter().collect()
        };
        t = einsum2(&s, &sb, &target, &t, &b)?;
        s = target;
    }
    if s == o {
        return Ok(t);
    }
    // One operand: a permutation of what is left.
    let p: Vec<usize> = o.chars().filter_map(|c| s.find(c)).collect();
    t.permute(p).and_then(|t| t.contiguous()).map_err(ce)
}

impl Einsum {
    /// The operands moved to the layout each letter is computed in.
    fn operands(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Vec<Tensor>> {
        let want = layout(&self.inputs, &self.output, ts, out);
        let mut res = Vec::new();
        for ((s, t), x) in self.inputs.iter().zip(ts).zip(x) {
            let mut x = (*x).clone();
            for (i, (c, d)) in s.chars().zip(&t.dims).enumerate() {
                let w = want.get(&c).cloned().unwrap_or_default();
                if d.axes != w {
                    x = k.relayout(&x, i, &d.axes, &w)?;
                }
            }
            res.push(x);
        }
        Ok(res)
    }
}

impl Primitive for Einsum {
    fn name(&self) -> &'static str {
        "einsum"
    }

    fn render(&self, args: &[String]) -> String {
        format!("einsum(\"{}\", {})", self.spec(), args.join(", "))
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let ops = self.operands(k, x, ts, out)?;
        let ins: Vec<&str> = self.inputs.iter().map(String::as_str).collect();
        let refs: Vec<&Tensor> = ops.iter().collect();
        Forward::of(einsum(&ins, &self.output, &refs)?)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let ops = self.operands(k, g.x, g.ts, g.out)?;
        let want = layout(&self.inputs, &self.output, g.ts, g.out);
        let mut grads = Vec::new();
        for (i, s) in self.inputs.iter().enumerate() {
            if g.want.get(i) == Some(&false) {
                // Not asked for (a split backward's other half takes it).
                grads.push(None);
                continue;
            }
            // d/d operand i: the output's cotangent contracted with the others;
            // letters only operand i had were summed out, so broadcast back.
            let mut ins: Vec<&str> = vec![self.output.as_str()];
            let mut xs: Vec<&Tensor> = vec![g.g];
            for (j, o) in ops.iter().enumerate() {
                if j != i {
                    ins.push(self.inputs[j].as_str());
                    xs.push(o);
                }
            }
            let kept: String = s
                .chars()
                .filter(|c| ins.iter().any(|x| x.contains(*c)))
                .collect();
            let mut gi = einsum(&ins, &kept, &xs)?;
            if kept.len() != s.len() {
                let local = ops[i].dims();
                for (d, c) in s.chars().enumerate() {
                    if !kept.contains(c) {
                        gi = gi.unsqueeze(d).map_err(ce)?;
                    }
                }
                gi = gi
                    .broadcast_as(local)
                    .and_then(|t| t.contiguous())
                    .map_err(ce)?;
            }
            // Transpose the operand's relayouts.
            for (j, (c, d)) in s.chars().zip(&g.ts[i].dims).enumerate() {
                let w = want.get(&c).cloned().unwrap_or_default();
                if d.axes != w {
                    gi = k.relayout_t(&gi, j, &d.axes, &w)?;
                }
            }
            grads.push(Some(gi));
        }
        Ok(grads)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        // 2 × the local size of the full index space.
        let mut letters: BTreeMap<char, Dim> = BTreeMap::new();
        for (s, t) in self.inputs.iter().zip(ts) {
            for (ch, d) in s.chars().zip(&t.dims) {
                match letters.get_mut(&ch) {
                    None => {
                        letters.insert(ch, d.clone());
                    }
                    Some(prev) if prev.axes.is_empty() => prev.axes = d.axes.clone(),
                    Some(_) => {}
                }
            }
        }
        let mut space = 1.0f64;
        let mut known = true;
        for d in letters.values() {
            match c.size(&d.size) {
                Some(v) => space *= v as f64 / c.axes_product(&d.axes).max(1) as f64,
                None => known = false,
            }
        }
        let want = layout(&self.inputs, &self.output, ts, out);
        let mut comms: Vec<CommCost> = Vec::new();
        for (s, t) in self.inputs.iter().zip(ts) {
            for (ch, d) in s.chars().zip(&t.dims) {
                let w = want.get(&ch).cloned().unwrap_or_default();
                comms.extend(super::cost::gathers(c, t, &d.axes, &w));
            }
        }
        Some(Cost {
            flops: if known { 2.0 * space } else { 0.0 },
            comms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// The einsum of two operands by its definition, in f64.
    fn naive(sa: &str, sb: &str, o: &str, a: &Tensor, b: &Tensor) -> Vec<f64> {
        let mut size: HashMap<char, usize> = HashMap::new();
        for (s, t) in [(sa, a), (sb, b)] {
            for (c, d) in s.chars().zip(t.dims()) {
                size.insert(c, *d);
            }
        }
        let letters: Vec<char> = {
            let mut v: Vec<char> = o.chars().collect();
            for c in sa.chars().chain(sb.chars()) {
                if !v.contains(&c) {
                    v.push(c);
                }
            }
            v
        };
        let flat = |t: &Tensor| -> Vec<f64> {
            t.flatten_all()
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .expect("values")
        };
        let (av, bv) = (flat(a), flat(b));
        let at = |s: &str, idx: &HashMap<char, usize>| -> usize {
            s.chars().fold(0, |acc, c| acc * size[&c] + idx[&c])
        };
        let n_out: usize = o.chars().map(|c| size[&c]).product();
        let mut out = vec![0.0; n_out];
        let total: usize = letters.iter().map(|c| size[c]).product();
        for mut flat_i in 0..total {
            let mut idx = HashMap::new();
            for c in letters.iter().rev() {
                idx.insert(*c, flat_i % size[c]);
                flat_i /= size[c];
            }
            out[at(o, &idx)] += av[at(sa, &idx)] * bv[at(sb, &idx)];
        }
        out
    }

    /// Every grouping the direct path takes (left operand as it lies or read
    /// transposed, operands swapped, batch letters leading) and some it
    /// declines give the einsum's values.
    #[test]
    fn two_operand_einsums_match_their_definition() {
        let dev = Device::Cpu;
        let dims = |s: &str| -> Vec<usize> {
            s.chars()
                .map(|c| match c {
                    'b' => 2,
                    't' | 's' => 5,
                    'h' => 3,
                    'e' => 4,
                    _ => 6,
                })
                .collect()
        };
        let cases = [
            ("btd", "dhe", "bthe"),
            ("bthe", "hed", "btd"),
            ("bthe", "dhe", "btd"),
            ("bthe", "btd", "dhe"),
            ("btd", "bthe", "hed"),
            ("bthe", "bshe", "bhts"),
            ("bhts", "bshe", "bthe"),
            ("bte", "bse", "bts"),
            ("bts", "bse", "bte"),
            ("bst", "bse", "bte"),
            ("td", "dh", "ht"),
        ];
        for (sa, sb, o) in cases {
            let t = |s: &str, k: f64| {
                let d = dims(s);
                let n: usize = d.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|i| ((i as f64 + k) * 0.61).sin() as f32)
                    .collect();
                Tensor::from_vec(v, d, &dev).expect("tensor")
            };
            let (a, b) = (t(sa, 0.0), t(sb, 7.0));
            let got = einsum(&[sa, sb], o, &[&a, &b]).expect("einsum");
            assert_eq!(got.dims(), dims(o).as_slice(), "{sa},{sb}->{o}");
            let got = got
                .flatten_all()
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .expect("values");
            for (x, y) in got.iter().zip(naive(sa, sb, o, &a, &b)) {
                assert!((x - y).abs() < 1e-5, "{sa},{sb}->{o}: {x} against {y}");
            }
        }
    }
}
