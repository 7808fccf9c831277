//! `einsum("btd,dkhe->kbthe", a, b, ...)`: one size and one layout per letter
//! across the operands; output letters keep their layout; a contracted letter
//! split over an axis leaves a pending sum over it. Any number of operands;
//! letters that only one operand has and the output lacks are summed out.

use super::cost::{CommCost, Cost, CostCx};
use super::einsum_plan;
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

/// Two-operand einsum as one batched product, laid out by
/// [`einsum_plan::plan`]: each operand read in place where its letters allow,
/// else permuted into place first; every letter of one operand alone must be
/// in the output.
fn einsum2(sa: &str, sb: &str, o: &str, a: &Tensor, b: &Tensor) -> R<Tensor> {
    let size = |c: char| -> usize {
        let at = |s: &str, t: &Tensor| s.chars().position(|x| x == c).map(|i| t.dims()[i]);
        at(sa, a).or_else(|| at(sb, b)).unwrap_or(1)
    };
    let p = einsum_plan::plan(sa, sb, o);
    let ((sl, l), (sr, r)) = if p.swap {
        ((sb, b), (sa, a))
    } else {
        ((sa, a), (sb, b))
    };
    let lhs = operand(sl, l, [&p.batch, &p.rows, &p.depth], p.copy[0], &size)?;
    let rhs = operand(sr, r, [&p.batch, &p.depth, &p.cols], p.copy[1], &size)?;
    let c = super::matmul_split::mm(&lhs, &rhs).map_err(ce)?;
    let order = format!("{}{}{}", p.batch, p.rows, p.cols);
    let c = c
        .reshape(order.chars().map(size).collect::<Vec<_>>())
        .map_err(ce)?;
    if !p.copy[2] {
        return Ok(c);
    }
    let perm: Vec<usize> = o
        .chars()
        .filter_map(|ch| order.chars().position(|x| x == ch))
        .collect();
    c.permute(perm).and_then(|t| t.contiguous()).map_err(ce)
}

/// An operand as the product reads it: `[batch, one, two]` from its letters
/// `groups` (a group it lacks has size 1; a batch it lacks is read with stride
/// 0), in place when `copy` is false (each group's letters lie together in
/// that order), else permuted into that order first.
fn operand(
    s: &str,
    x: &Tensor,
    groups: [&String; 3],
    copy: bool,
    size: &dyn Fn(char) -> usize,
) -> R<Tensor> {
    let n = |g: &str| -> usize { g.chars().map(size).product() };
    let own = |g: &str| -> String { g.chars().filter(|c| s.contains(*c)).collect() };
    let want: [String; 3] = [own(groups[0]), own(groups[1]), own(groups[2])];
    let x = if copy {
        let order: String = want.concat();
        let perm: Vec<usize> = order
            .chars()
            .filter_map(|c| s.chars().position(|x| x == c))
            .collect();
        let x = x.permute(perm).and_then(|t| t.contiguous()).map_err(ce)?;
        x.reshape((n(&want[0]), n(&want[1]), n(&want[2])))
            .map_err(ce)?
    } else {
        // Merge each group's run of letters, then move the runs into place;
        // a group the operand lacks is a dim of size 1 after the others.
        let first = |g: &String| -> usize {
            g.chars()
                .next()
                .and_then(|c| s.chars().position(|x| x == c))
                .unwrap_or(usize::MAX)
        };
        let mut by_pos: Vec<usize> = (0..3).collect();
        by_pos.sort_by_key(|i| first(&want[*i]));
        let shape: Vec<usize> = by_pos.iter().map(|i| n(&want[*i])).collect();
        let perm: Vec<usize> = (0..3)
            .map(|g| by_pos.iter().position(|i| *i == g).unwrap_or(g))
            .collect();
        x.contiguous()
            .and_then(|t| t.reshape(shape))
            .and_then(|t| t.permute(perm))
            .map_err(ce)?
    };
    // The plan gives each operand all of the batch's letters or none.
    if want[0].is_empty() && !groups[0].is_empty() {
        x.broadcast_as((n(groups[0]), x.dims()[1], x.dims()[2]))
            .map_err(ce)
    } else {
        Ok(x)
    }
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

    /// Every layout the plan takes (operands read as they lie or transposed
    /// or copied, swapped, a batch of one operand's letters read with stride
    /// 0, the product permuted or not) gives the einsum's values.
    #[test]
    fn two_operand_einsums_match_their_definition() {
        let dev = Device::Cpu;
        let dims = |s: &str| -> Vec<usize> {
            s.chars()
                .map(|c| match c {
                    'b' => 2,
                    't' | 's' => 5,
                    'h' | 'k' => 3,
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
            ("btd", "dkhe", "kbthe"),
            ("kbthe", "dkhe", "btd"),
            ("kbthe", "btd", "dkhe"),
            ("btd", "kbthe", "dkhe"),
            ("bthe", "hed", "ebt"),
            ("kbt", "kd", "dbt"),
            ("bd", "ke", "kbed"),
            ("ij", "jk", "ki"),
            ("bij", "bjk", "bki"),
            ("ibj", "jbk", "kbi"),
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
