//! How a two-operand contraction is laid onto one batched product with the
//! fewest copies. A product reads each operand as `[batch, rows, depth]` or
//! `[batch, depth, columns]` through strides, and writes `[batch, rows,
//! columns]` contiguously; an einsum fits without a copy when each operand's
//! letters of each of those groups lie next to each other, and the output's
//! letters come in batch, row, column order. Where they do not, the operand
//! (or the product) is permuted into place first, at the cost of one pass
//! over it.
//!
//! The batch may also take letters only one operand has (the other operand
//! is then read with batch stride 0): the attention projection's derivative
//! `kbthe,btd->dkhe` is a product per `k` of `btd` read transposed and
//! `bthe` as it lies, where grouping by operand alone would copy the whole
//! 3·B·T·D cotangent into `[khe, bt]` (2.8 ms against a forward of 1.2 ms on
//! seed 004's widened model, `cargo bench --bench einsum`).
//!
//! The plan depends on the letters alone, never the sizes, so one device, a
//! shard and a microbatch run the same products. Against the layout before
//! this plan (both operands copied into `[batch, free, contracted]` unless
//! already so), every einsum of the repository's models and their
//! derivatives gives the same bits at five sets of sizes, except two at a
//! batch of 1 (`kbf,dkf->bd`, `kbi,jbk->ibj`: gemm's matrix-vector sums
//! depend on which operand is on the left), and the seed models' losses
//! are bit-identical.

/// The three groups of a product's operand.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Group {
    Batch,
    Free,
    Depth,
}

/// One way to run a contraction as a batched product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The product's left operand is the einsum's second one.
    pub swap: bool,
    pub batch: String,
    pub rows: String,
    pub depth: String,
    pub cols: String,
    /// Copy the left operand, the right one, the product into place.
    pub copy: [bool; 3],
    /// What those copies cost, from their letters ([`copy_cost`]).
    pub cost: u128,
}

/// The operand's letters as runs of one group each, in memory order; `None`
/// when a group's letters are not next to each other.
fn runs(s: &str, group: &dyn Fn(char) -> Group) -> Option<Vec<(Group, String)>> {
    let mut out: Vec<(Group, String)> = Vec::new();
    for c in s.chars() {
        let g = group(c);
        match out.last_mut() {
            Some((last, letters)) if *last == g => letters.push(c),
            _ => {
                if out.iter().any(|(x, _)| *x == g) {
                    return None;
                }
                out.push((g, c.to_string()));
            }
        }
    }
    Some(out)
}

fn of(rs: &Option<Vec<(Group, String)>>, g: Group) -> Option<String> {
    rs.as_ref().map(|rs| {
        rs.iter()
            .find(|(x, _)| *x == g)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    })
}

fn filter(s: &str, keep: &dyn Fn(char) -> bool) -> String {
    s.chars().filter(|c| keep(*c)).collect()
}

/// The cheapest plan for `sa, sb -> o` (letters distinct in each): the least
/// copied, then the fewest batch letters. What a copy costs is counted from
/// its letters, each taken as 64 long, not from the sizes: the plan is then
/// the same for every size of the same einsum, so a sharded run, a
/// microbatch and one device run the same products in the same order (gemm's
/// sums for a small product depend on which operand is on the left). Ties
/// go to the first candidate: operands in their order, then the batch of
/// shared letters alone, then with letters of the output's, the first
/// operand's, the second operand's leading run.
pub(crate) fn plan(sa: &str, sb: &str, o: &str) -> Plan {
    // A step runs the same few einsums over and over: each thread keeps the
    // plans it made (the candidates cost tens of allocations each).
    thread_local! {
        static PLANS: std::cell::RefCell<std::collections::HashMap<String, Plan>> =
            Default::default();
    }
    let key = format!("{sa},{sb}->{o}");
    if let Some(p) = PLANS.with(|m| m.borrow().get(&key).cloned()) {
        return p;
    }
    let p = search(sa, sb, o);
    PLANS.with(|m| {
        let mut m = m.borrow_mut();
        // Bounded: a program has few distinct einsums.
        if m.len() >= 4096 {
            m.clear();
        }
        m.insert(key, p.clone());
    });
    p
}

fn search(sa: &str, sb: &str, o: &str) -> Plan {
    let mut best: Option<Plan> = None;
    for swap in [false, true] {
        let (l, r) = if swap { (sb, sa) } else { (sa, sb) };
        for extra in extras(l, r, o) {
            if let Some(p) = candidate(sa, l, r, o, swap, &extra) {
                // Cheaper copies, then fewer batch letters.
                let key = |p: &Plan| (p.cost, p.batch.chars().count());
                if best.as_ref().is_none_or(|b| key(&p) < key(b)) {
                    best = Some(p);
                }
            }
        }
    }
    best.unwrap_or_else(|| {
        // Unreachable for distinct letters (the first candidate always
        // exists); a plan that copies everything is still correct.
        let shared = |c: char| sa.contains(c) && sb.contains(c);
        Plan {
            swap: false,
            batch: filter(o, &shared),
            rows: filter(o, &|c| sa.contains(c) && !sb.contains(c)),
            depth: filter(sa, &|c| shared(c) && !o.contains(c)),
            cols: filter(o, &|c| sb.contains(c) && !sa.contains(c)),
            copy: [true; 3],
            cost: u128::MAX,
        }
    })
}

/// What permuting `from` into `to` costs, from the letters alone: `64^k`
/// for `k` letters, 16 times that when the innermost letter moves (candle
/// then copies element by element, not in runs: `kbthe` into `[khe, bt]`
/// took 2 ms against 0.09 ms into `[bt, khe]`).
fn copy_cost(from: &str, to: &str) -> u128 {
    let letters = u32::try_from(from.chars().count()).unwrap_or(u32::MAX);
    let runs = if from.chars().last() == to.chars().last() {
        1
    } else {
        16
    };
    64u128.saturating_pow(letters).saturating_mul(runs)
}

/// Sets of the right operand's free letters that may join the batch: leading
/// runs of the output's and each operand's letters that it alone has. Only
/// when no letter is shared by both operands and the output (a batch item
/// then has one stride in each operand: its own, or 0).
///
/// Not the left operand's: with a right operand of batch stride 0, a
/// transposed left one is copied before the product (`matmul_split`: candle
/// folds its batch into its rows, which is wrong unless its rows lie `k`
/// apart), a copy this plan would not see. The swapped candidate takes those
/// letters from the right instead.
fn extras(l: &str, r: &str, o: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    if o.chars().any(|c| l.contains(c) && r.contains(c)) {
        return out;
    }
    let own = |c: char| r.contains(c) && !l.contains(c) && o.contains(c);
    for s in [o, l, r] {
        let lead: String = s.chars().take_while(|c| own(*c)).collect();
        for n in 1..=lead.len() {
            let e: String = lead.chars().take(n).collect();
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    out
}

fn candidate(sa: &str, l: &str, r: &str, o: &str, swap: bool, extra: &str) -> Option<Plan> {
    let shared = |c: char| l.contains(c) && r.contains(c);
    let in_batch = |c: char| (shared(c) && o.contains(c)) || extra.contains(c);
    let group = |c: char| {
        if in_batch(c) {
            Group::Batch
        } else if shared(c) {
            Group::Depth
        } else {
            Group::Free
        }
    };
    // Each operand holds all of the batch's letters or none.
    let batch_all: String = filter(o, &in_batch);
    let holds = |s: &str| -> Option<bool> {
        let n = batch_all.chars().filter(|c| s.contains(*c)).count();
        match n {
            0 => Some(false),
            n if n == batch_all.len() => Some(true),
            _ => None,
        }
    };
    let (lb, rb) = (holds(l)?, holds(r)?);
    let (lr, rr) = (runs(l, &group), runs(r, &group));
    let pick = |g: Group,
                first: (&Option<Vec<(Group, String)>>, bool),
                second: (&Option<Vec<(Group, String)>>, bool),
                fallback: String| {
        [first, second]
            .into_iter()
            .find_map(|(rs, has)| if has { of(rs, g) } else { None })
            .unwrap_or(fallback)
    };
    let batch = pick(Group::Batch, (&lr, lb), (&rr, rb), batch_all.clone());
    let depth = pick(
        Group::Depth,
        (&lr, true),
        (&rr, true),
        filter(sa, &|c| shared(c) && !o.contains(c)),
    );
    let rows = of(&lr, Group::Free)
        .unwrap_or_else(|| filter(o, &|c| l.contains(c) && group(c) == Group::Free));
    let cols = of(&rr, Group::Free)
        .unwrap_or_else(|| filter(o, &|c| r.contains(c) && group(c) == Group::Free));
    let fits = |rs: &Option<Vec<(Group, String)>>, has: bool| {
        rs.is_some()
            && (!has || of(rs, Group::Batch).as_deref() == Some(batch.as_str()))
            && of(rs, Group::Depth).as_deref() == Some(depth.as_str())
    };
    // The right operand is read row-major within an item (its contracted
    // letters before its free ones), never transposed: gemm's sums for a
    // small product change with the right operand's layout, and these are
    // the bits a row-major copy gave before.
    let row_major = |rs: &Option<Vec<(Group, String)>>| {
        rs.as_ref().is_some_and(|rs| {
            let at = |g| rs.iter().position(|(x, _)| *x == g);
            match (at(Group::Depth), at(Group::Free)) {
                (Some(d), Some(f)) => d < f,
                _ => true,
            }
        })
    };
    let out_order = format!("{batch}{rows}{cols}");
    let copy = [
        !fits(&lr, lb),
        !(fits(&rr, rb) && row_major(&rr)),
        out_order != o,
    ];
    // A batch of one operand's letters must leave each item a matrix
    // product, not many matrix-vector ones: `btd,bthe->hed` batched over
    // `he` copies nothing but ran 128 matrix-vector products, 2.5× slower
    // than one product.
    if !extra.is_empty() && (rows.is_empty() || cols.is_empty()) {
        return None;
    }
    let own = |s: &str, order: String| -> String { filter(&order, &|c| s.contains(c)) };
    let moves = [
        (l, own(l, format!("{batch}{rows}{depth}"))),
        (r, own(r, format!("{batch}{depth}{cols}"))),
        (out_order.as_str(), o.to_string()),
    ];
    let cost = moves
        .iter()
        .zip(copy)
        .filter(|(_, c)| *c)
        .map(|((from, to), _)| copy_cost(from, to))
        .fold(0u128, u128::saturating_add);
    Some(Plan {
        swap,
        batch,
        rows,
        depth,
        cols,
        copy,
        cost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost_of(sa: &str, sb: &str, o: &str) -> Plan {
        plan(sa, sb, o)
    }

    /// The attention projection and its two derivatives: the forward copies
    /// nothing, the weight's derivative only the (weight-sized) product.
    #[test]
    fn the_attention_projection_copies_least() {
        let f = cost_of("btd", "dkhe", "kbthe");
        assert_eq!((f.batch.as_str(), f.copy), ("k", [false; 3]), "{f:?}");
        let dw = cost_of("kbthe", "btd", "dkhe");
        assert_eq!(dw.copy, [false, false, true], "{dw:?}");
        assert_eq!(dw.cost, 64u128.pow(4));
        // The input's: the cotangent (its contracted letters apart) in runs
        // of `he`, and the weight; not the cotangent element by element.
        let dx = cost_of("kbthe", "dkhe", "btd");
        assert_eq!((dx.swap, dx.copy), (false, [true, true, false]), "{dx:?}");
        // A product as it lies, and a batched one read transposed.
        assert_eq!(cost_of("ij", "jk", "ik").cost, 0);
        assert_eq!(cost_of("bji", "bjk", "bik").cost, 0);
        // The output projection's weight derivative: one product, not one
        // per (h, e) of matrix-vector products.
        let dw = cost_of("btd", "bthe", "hed");
        assert_eq!((dw.batch.as_str(), dw.cost), ("", 0), "{dw:?}");
    }
}
