//! Tensor types: dtype + global shape + sharding + pending reductions.
//!
//! Dimension sizes are integer polynomials over symbolic sizes (`B`, `T`), so that
//! `B * SEQ` and `SEQ * B` are the same size and element counts can be compared
//! without knowing the batch.

use crate::ast::{DType, ReduceOp};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Sum of `coeff * product(symbols)`; the empty product is the constant term.
///
/// Shared, not copied: a type is cloned wherever a value is recorded (binding
/// types, bodies replayed by the editor's checker), and a polynomial never
/// changes once built, so a clone is a reference count, not a tree of strings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Poly(Arc<BTreeMap<Vec<String>, i64>>);

impl Poly {
    pub fn constant(c: i64) -> Poly {
        let mut m = BTreeMap::new();
        if c != 0 {
            m.insert(vec![], c);
        }
        Poly(Arc::new(m))
    }
    pub fn sym(name: &str) -> Poly {
        let mut m = BTreeMap::new();
        m.insert(vec![name.to_string()], 1);
        Poly(Arc::new(m))
    }
    pub fn as_const(&self) -> Option<i64> {
        match self.0.len() {
            0 => Some(0),
            1 => self.0.get(&vec![]).copied(),
            _ => None,
        }
    }
    pub fn is_const(&self) -> bool {
        self.as_const().is_some()
    }
    pub fn symbols(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.keys().flatten().cloned().collect();
        v.sort();
        v.dedup();
        v
    }
    pub fn add(&self, o: &Poly) -> Option<Poly> {
        let mut m = (*self.0).clone();
        for (k, c) in o.0.iter() {
            let e = m.entry(k.clone()).or_insert(0);
            *e = e.checked_add(*c)?;
            if *e == 0 {
                m.remove(k);
            }
        }
        Some(Poly(Arc::new(m)))
    }
    pub fn neg(&self) -> Option<Poly> {
        let mut m = BTreeMap::new();
        for (k, c) in self.0.iter() {
            m.insert(k.clone(), c.checked_neg()?);
        }
        Some(Poly(Arc::new(m)))
    }
    pub fn sub(&self, o: &Poly) -> Option<Poly> {
        self.add(&o.neg()?)
    }
    pub fn mul(&self, o: &Poly) -> Option<Poly> {
        let mut out = Poly::default();
        for (ka, ca) in self.0.iter() {
            for (kb, cb) in o.0.iter() {
                let mut k = ka.clone();
                k.extend(kb.iter().cloned());
                k.sort();
                let mut m = BTreeMap::new();
                m.insert(k, ca.checked_mul(*cb)?);
                out = out.add(&Poly(Arc::new(m)))?;
            }
        }
        Some(out)
    }
    /// Exact division; `None` when the quotient is not an integer polynomial.
    pub fn div(&self, o: &Poly) -> Option<Poly> {
        if let Some(d) = o.as_const() {
            if d == 0 {
                return None;
            }
            let mut m = BTreeMap::new();
            for (k, c) in self.0.iter() {
                if c.checked_rem(d)? != 0 {
                    return None;
                }
                m.insert(k.clone(), c.checked_div(d)?);
            }
            return Some(Poly(Arc::new(m)));
        }
        // Division by a single monomial: every term must contain it.
        if o.0.len() != 1 {
            return None;
        }
        let (dk, dc) = o.0.iter().next()?;
        let mut m = BTreeMap::new();
        for (k, c) in self.0.iter() {
            if c.checked_rem(*dc)? != 0 {
                return None;
            }
            let mut rest = k.clone();
            for s in dk {
                let i = rest.iter().position(|x| x == s)?;
                rest.remove(i);
            }
            m.insert(rest, c.checked_div(*dc)?);
        }
        Some(Poly(Arc::new(m)))
    }
    /// Divisible by `n` for every value of the symbols (all coefficients divisible).
    pub fn divisible_by(&self, n: i64) -> bool {
        n != 0 && self.0.values().all(|c| c.checked_rem(n) == Some(0))
    }
    /// The number `self` stands for under `env`: `substitute` then
    /// `as_const`, without building polynomials when every symbol is bound to
    /// a number (the planner asks this of every dimension of every node).
    pub fn value(&self, env: &BTreeMap<String, Poly>) -> Option<i64> {
        let mut sum = 0i64;
        for (k, c) in self.0.iter() {
            let mut term = *c;
            for s in k {
                match env.get(s).map(Poly::as_const) {
                    Some(Some(v)) => term = term.checked_mul(v)?,
                    _ => return self.substitute(env)?.as_const(),
                }
            }
            sum = sum.checked_add(term)?;
        }
        Some(sum)
    }
    /// Whether some symbol of `self` has a value in `env`.
    pub fn names_any(&self, env: &BTreeMap<String, Poly>) -> bool {
        self.0.keys().flatten().any(|s| env.contains_key(s))
    }
    pub fn substitute(&self, env: &BTreeMap<String, Poly>) -> Option<Poly> {
        // Most sizes are constants or name nothing bound: nothing to rebuild.
        if !self.names_any(env) {
            return Some(self.clone());
        }
        let mut out = Poly::default();
        for (k, c) in self.0.iter() {
            let mut term = Poly::constant(*c);
            for s in k {
                let v = env.get(s).cloned().unwrap_or_else(|| Poly::sym(s));
                term = term.mul(&v)?;
            }
            out = out.add(&term)?;
        }
        Some(out)
    }
}

impl fmt::Display for Poly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "0");
        }
        // Highest-degree terms first, constant last: `B*T + 1`. (Written
        // without building strings: the checker prints every type it sees.)
        let mut terms: Vec<(&Vec<String>, &i64)> = self.0.iter().collect();
        if terms.len() > 1 {
            terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        }
        for (i, (k, c)) in terms.iter().enumerate() {
            let c = **c;
            let (neg, a) = (c < 0, c.unsigned_abs());
            if i == 0 {
                if neg {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if neg { " - " } else { " + " })?;
            }
            let mut first = true;
            if a != 1 || k.is_empty() {
                write!(f, "{a}")?;
                first = false;
            }
            for s in k.iter() {
                if !first {
                    f.write_str("*")?;
                }
                f.write_str(s)?;
                first = false;
            }
        }
        Ok(())
    }
}

/// One dimension: its global size and the mesh axes it is split over (major first).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Dim {
    pub size: Poly,
    pub axes: Vec<String>,
}

impl Dim {
    pub fn replicated(size: Poly) -> Dim {
        Dim { size, axes: vec![] }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TType {
    pub dtype: DType,
    pub dims: Vec<Dim>,
    /// Reductions still owed over these mesh axes (JAX's unreduced axes, DTensor's Partial).
    pub pending: BTreeMap<String, ReduceOp>,
}

impl TType {
    pub fn new(dtype: DType, dims: Vec<Dim>) -> TType {
        TType {
            dtype,
            dims,
            pending: BTreeMap::new(),
        }
    }
    pub fn scalar(dtype: DType) -> TType {
        TType::new(dtype, vec![])
    }
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    /// The global shape when every size is a constant (parameters always are);
    /// a symbolic size counts as 0.
    pub fn known_shape(&self) -> Vec<usize> {
        self.dims
            .iter()
            .map(|d| d.size.as_const().unwrap_or(0).max(0) as usize)
            .collect()
    }
    pub fn shape(&self) -> Vec<Poly> {
        self.dims.iter().map(|d| d.size.clone()).collect()
    }
    pub fn numel(&self) -> Option<Poly> {
        self.dims
            .iter()
            .try_fold(Poly::constant(1), |acc, d| acc.mul(&d.size))
    }
    pub fn all_axes(&self) -> Vec<&str> {
        self.dims
            .iter()
            .flat_map(|d| d.axes.iter().map(|s| s.as_str()))
            .collect()
    }
    pub fn is_sharded(&self) -> bool {
        self.dims.iter().any(|d| !d.axes.is_empty())
    }
    /// The per-device (local) shape given axis sizes; symbolic sizes stay symbolic.
    pub fn local_shape(&self, axis_size: &dyn Fn(&str) -> i64) -> Vec<String> {
        self.dims
            .iter()
            .map(|d| {
                let n: i64 = d
                    .axes
                    .iter()
                    .fold(1i64, |acc, a| acc.saturating_mul(axis_size(a)));
                if n <= 1 {
                    d.size.to_string()
                } else {
                    match d.size.div(&Poly::constant(n)) {
                        Some(q) => q.to_string(),
                        None => format!("{}/{}", paren(&d.size), n),
                    }
                }
            })
            .collect()
    }
    /// Bytes of the global value, when every size is known.
    pub fn bytes(&self) -> Option<u64> {
        let n = self.numel()?.as_const()?;
        Some((n.max(0) as u64).saturating_mul(self.dtype.bytes()))
    }
}

fn paren(p: &Poly) -> String {
    let s = p.to_string();
    if s.contains(' ') {
        format!("({s})")
    } else {
        s
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A sum of terms (the only sizes printed with a space) is bracketed
        // before a sharding: `(B*T + 1)@dp`.
        let bracket = !self.axes.is_empty() && self.size.0.len() > 1;
        if bracket {
            write!(f, "({})", self.size)?;
        } else {
            write!(f, "{}", self.size)?;
        }
        match self.axes.len() {
            0 => Ok(()),
            1 => write!(f, "@{}", self.axes[0]),
            _ => write!(f, "@({})", self.axes.join(", ")),
        }
    }
}

impl fmt::Display for TType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype.name())?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")?;
        if !self.pending.is_empty() {
            let items: Vec<String> = self
                .pending
                .iter()
                .map(|(a, op)| match op {
                    ReduceOp::Sum => a.clone(),
                    op => format!("{}: {a}", op.name()),
                })
                .collect();
            write!(f, " partial({})", items.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn poly_arithmetic_normalises() {
        let b = Poly::sym("B");
        let s = Poly::constant(16);
        let a = b.mul(&s).unwrap();
        let c = s.mul(&b).unwrap();
        assert_eq!(a, c);
        assert_eq!(a.to_string(), "16*B");
        assert!(a.divisible_by(8));
        assert!(!a.divisible_by(32));
        assert_eq!(a.div(&Poly::constant(16)).unwrap(), b);
        assert!(a.div(&Poly::constant(32)).is_none());
        let d = Poly::constant(768);
        assert_eq!(d.div(&Poly::constant(12)).unwrap().as_const(), Some(64));
        let bt = b.mul(&Poly::sym("T")).unwrap();
        assert_eq!(bt.div(&Poly::sym("T")).unwrap(), b);
        assert_eq!(b.add(&Poly::constant(1)).unwrap().to_string(), "B + 1");
    }

    #[test]
    fn value_is_substitute_then_as_const() {
        let (b, t) = (Poly::sym("B"), Poly::sym("T"));
        let bt1 = b.mul(&t).unwrap().add(&Poly::constant(1)).unwrap();
        let cancels = b.sub(&t).unwrap();
        let mut env = BTreeMap::new();
        env.insert("B".to_string(), Poly::constant(8));
        let check = |p: &Poly, env: &BTreeMap<String, Poly>| {
            assert_eq!(p.value(env), p.substitute(env).and_then(|q| q.as_const()));
        };
        // T unbound: no number, unless the symbols cancel.
        check(&bt1, &env);
        check(&cancels, &env);
        env.insert("T".to_string(), Poly::sym("B"));
        check(&cancels, &env);
        // Bindings are not followed: `B - T` is `8 - B`.
        assert_eq!(cancels.value(&env), None);
        env.insert("T".to_string(), Poly::constant(8));
        check(&cancels, &env);
        assert_eq!(cancels.value(&env), Some(0));
        env.insert("T".to_string(), Poly::constant(i64::MAX / 4));
        check(&bt1, &env);
        assert_eq!(bt1.value(&env), None);
        env.insert("T".to_string(), Poly::constant(3));
        check(&bt1, &env);
        assert_eq!(bt1.value(&env), Some(25));
        check(&Poly::default(), &env);
    }
}
