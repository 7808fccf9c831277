//! Stage 3: shape, dtype and sharding checking.
//!
//! Layers are checked per instantiation (like templates): `Block(768, 12)` binds the
//! layer's dimension parameters to concrete sizes (and shardings), so every error
//! can quote real numbers. Symbolic sizes (`B`, `T`) in function signatures unify at
//! call sites.

mod decls;
mod ops;

use crate::ast::{
    self, Arg, DimExpr, DimOp, DimSpec, Expr, ExprKind, LayerDecl, Member, ReduceOp, TypeExpr,
};
use crate::diag::{did_you_mean, Diagnostic, Label, Problem};
use crate::resolve::{Mesh, Program};
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

/// One line of `shardc check --types`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TypeEntry {
    #[serde(skip)]
    pub span: Span,
    /// `Model`, `Block(768, 12).forward`, ...
    pub scope: String,
    pub name: String,
    pub kind: &'static str,
    pub ty: String,
    /// Per-device shape on the mesh the model was checked on.
    pub local: String,
    /// For FSDP weights: the layout used in `forward` after gathering.
    pub used_as: Option<String>,
    /// The type and the mesh's axes, for drawing the layout (editor hovers).
    #[serde(skip)]
    pub layout: Option<(TType, Vec<(String, i64)>)>,
}

/// What the checker learned, for tools and later stages.
#[derive(Debug, Default)]
pub struct Checked {
    pub types: Vec<TypeEntry>,
    /// One static plan per `train` declaration.
    pub plans: Vec<crate::plan::Plan>,
    /// One SPMD program per `train` declaration (when the file has no errors).
    pub programs: Vec<crate::spmd::Program>,
}

/// A layer dimension parameter's value: a size and, when written, its sharding.
#[derive(Clone, Debug, PartialEq)]
struct DimVal {
    size: Poly,
    axes: Option<Vec<String>>,
}

#[derive(Debug)]
struct Inst {
    decl: Rc<LayerDecl>,
    /// `Block(768, 12)`: shown in diagnostics and `--types`.
    label: String,
    env: HashMap<String, DimVal>,
    /// Weight name → (storage type, type used in forward, span).
    weights: HashMap<String, (TType, TType, Span)>,
    subs: HashMap<String, Val>,
    /// Members whose declaration had an error: uses of them report nothing more.
    poisoned: HashSet<String>,
}

#[derive(Clone, Debug)]
enum Val {
    T(TType),
    Num(f64),
    Int(i64),
    Str(String),
    Layer(Rc<Inst>),
    /// `repeat(n, layer)`, optionally split into pipeline stages over an axis.
    Repeat(i64, Rc<Inst>, Option<String>),
    /// Already reported; stop cascading.
    Poison,
}

impl Val {
    fn describe(&self) -> String {
        match self {
            Val::T(t) => format!("a tensor `{t}`"),
            Val::Num(_) => "a number".into(),
            Val::Int(_) => "an integer".into(),
            Val::Str(s) => format!("the string \"{s}\""),
            Val::Layer(i) => format!("the layer `{}`", i.label),
            Val::Repeat(n, i, _) => format!("the layer stack `repeat({n}, {})`", i.label),
            Val::Poison => "an invalid value".into(),
        }
    }
}

#[derive(Clone, Debug)]
struct Binding {
    ty: TType,
    nid: Option<crate::spmd::Nid>,
    span: Span,
    /// Names this binding was computed from, for the shape-flow trace.
    deps: Vec<String>,
}

#[derive(Default)]
struct Scope {
    vars: HashMap<String, Binding>,
    tyvars: BTreeMap<String, Poly>,
    ellipsis: Option<Vec<Dim>>,
    /// Bindings whose value had an error: using them reports nothing more.
    poisoned: HashSet<String>,
    /// Innermost `local { }` block, if any: no implicit collectives inside.
    local: Option<Span>,
    scope_name: String,
}

pub struct Checker<'p> {
    prog: &'p Program,
    spec: &'p crate::spec::Spec,
    sources: &'p crate::source::SourceMap,
    pub diags: Vec<Diagnostic>,
    mesh: Option<&'p Mesh>,
    strict: Option<Span>,
    pub out: Checked,
    seen_types: HashSet<(Span, String, String)>,
    stack: Vec<String>,
    /// Instantiation sites, innermost last: errors inside a stdlib layer point here too.
    sites: Vec<(Span, String)>,
    /// Symbolic sizes bound by a `train` declaration (the batch).
    bound: BTreeMap<String, Poly>,
    insts: HashMap<String, Rc<Inst>>,
    /// `shard_params` in force for the layers being instantiated (FSDP applies to
    /// every weight below the model or layer that asks for it).
    fsdp: Option<(String, i64)>,
    /// Layout asked for by the annotation of the `let` whose value is being
    /// checked: (span of that value, per-dim axes, None = not annotated). An
    /// elementwise op whose operands disagree takes it instead of being ambiguous.
    hint: Option<(Span, Vec<Option<Vec<String>>>)>,
    /// The plan being accumulated while a trained model is checked, and how many
    /// times the code being checked runs per step (repeated layers).
    plan: Option<crate::plan::Plan>,
    mult: u64,
    /// The SPMD program being emitted while a trained model is checked: the node
    /// holding the value of the expression just checked, the layer path of the
    /// code being checked (`blocks.3.attn`), and parameter nodes by full name.
    emit: Option<crate::spmd::Program>,
    last: Option<crate::spmd::Nid>,
    path: Vec<String>,
    param_nodes: HashMap<String, crate::spmd::Nid>,
    /// Nodes of the tensor arguments of the built-in being checked, in order; and
    /// whether we are inside one (its internal reshards are implied by its result).
    arg_ids: Vec<Option<crate::spmd::Nid>>,
    in_builtin: bool,
    checked_fns: HashSet<(Span, String)>,
    /// Microbatches and schedule of the pipelined stack of the model being lowered.
    pipeline_microbatches: Option<usize>,
    pipeline_schedule: String,
    /// Planned activations before the pipelined stack and after one stage's share.
    stack_acts: Option<(f64, f64)>,
}

/// The most repetitions of a layer that lowering unrolls.
const MAX_UNROLL: i64 = 4096;

impl<'p> Checker<'p> {
    pub fn new(
        prog: &'p Program,
        spec: &'p crate::spec::Spec,
        sources: &'p crate::source::SourceMap,
        strict_flag: bool,
    ) -> Self {
        let strict = prog.strict.or(strict_flag.then(Span::default));
        Checker {
            prog,
            spec,
            sources,
            diags: vec![],
            mesh: None,
            strict,
            out: Checked::default(),
            seen_types: HashSet::new(),
            stack: vec![],
            sites: vec![],
            bound: BTreeMap::new(),
            insts: HashMap::new(),
            fsdp: None,
            hint: None,
            plan: None,
            mult: 1,
            emit: None,
            last: None,
            path: Vec::new(),
            param_nodes: HashMap::new(),
            arg_ids: Vec::new(),
            in_builtin: false,
            checked_fns: HashSet::new(),
            pipeline_microbatches: None,
            pipeline_schedule: String::new(),
            stack_acts: None,
        }
    }

    pub fn run(mut self) -> (Vec<Diagnostic>, Checked) {
        self.check_features();
        let trained: HashSet<String> = self
            .prog
            .trains
            .iter()
            .map(|t| t.model.name.clone())
            .collect();
        let spec = self.spec;
        for t in &spec.trains {
            self.check_train(t);
        }
        // Models without a train declaration are checked on the file's first mesh.
        let default_mesh = self
            .prog
            .meshes
            .iter()
            .find(|m| m.span.file == self.prog.root)
            .or(self.prog.meshes.first());
        for name in self.prog.layer_order.clone() {
            let Some(decl) = self.prog.layers.get(&name).cloned() else {
                continue;
            };
            if decl.is_model && !trained.contains(&name) {
                self.mesh = default_mesh;
                self.bound.clear();
                self.check_model(&decl, None);
            }
        }
        // Same problem found through two instantiations: report once.
        let mut seen = HashSet::new();
        self.diags
            .retain(|d| seen.insert((d.code, d.primary.span, d.message.clone())));
        (self.diags, self.out)
    }

    fn report(&mut self, p: Problem) {
        let mut d = p.diagnostic();
        self.add_context(&mut d);
        self.diags.push(d);
    }

    fn add_context(&self, d: &mut Diagnostic) {
        // Inside an instantiated layer, also point at where it was instantiated.
        if self.sites.len() < 2 {
            return;
        }
        if let Some((site, label)) = self.sites.last() {
            let p = d.primary.span;
            let inside = site.file == p.file && site.start <= p.start && p.end <= site.end;
            if !inside && !d.secondary.iter().any(|l| l.span == *site) {
                d.secondary.push(Label::new(
                    *site,
                    format!("in `{label}`, instantiated here"),
                ));
            }
        }
        // From deep inside imported layers, also show the user's own line.
        let root = self.prog.root;
        if d.primary.span.file != root && !d.secondary.iter().any(|l| l.span.file == root) {
            if let Some((site, label)) = self
                .sites
                .iter()
                .rev()
                .find(|(s, _)| s.file == root && *s != Span::default())
            {
                d.secondary.push(Label::new(
                    *site,
                    format!("in `{label}`, instantiated here"),
                ));
            }
        }
    }

    fn axis_size(&self, a: &str) -> i64 {
        self.mesh.map_or(1, |m| m.size(a))
    }

    fn axes_product(&self, axes: &[String]) -> i64 {
        axes.iter()
            .fold(1i64, |acc, a| acc.saturating_mul(self.axis_size(a)))
    }

    fn axes_text(axes: &[String]) -> String {
        match axes.len() {
            1 => format!("`{}`", axes[0]),
            _ => format!("`({})`", axes.join(", ")),
        }
    }

    fn check_axis(&mut self, axis: &ast::Ident) -> bool {
        match self.mesh {
            Some(m) if m.axis(&axis.name).is_some() => true,
            m => {
                self.report(Problem::UnknownAxis {
                    span: axis.span,
                    axis: axis.name.clone(),
                    mesh: m.map(|m| (m.name.clone(), m.name_span)),
                    axes: m.map(|m| m.axis_names()).unwrap_or_default(),
                });
                false
            }
        }
    }

    // ── models and layers ────────────────────────────────────────────────

    fn check_model(
        &mut self,
        decl: &Rc<LayerDecl>,
        batch: Option<i64>,
    ) -> Option<(Rc<Inst>, Val, Vec<Dim>)> {
        let inst =
            self.instantiate(decl, HashMap::new(), decl.name.name.clone(), decl.name.span)?;
        let Some(fwd) = find_fn(decl, "forward") else {
            self.report(Problem::NoForward {
                span: decl.name.span,
                layer: decl.name.name.clone(),
            });
            return None;
        };
        // The model is called with its own declared input types; the batch (first
        // dimension of the first input) is bound by `train`.
        let mut args = Vec::new();
        let mut scope = Scope::default();
        let mut first_dim = Vec::new();
        if let (Some(b), Some((_, te))) = (batch, fwd.params.first()) {
            if let Some(DimSpec::Dim {
                size: DimExpr::Name(n),
                ..
            }) = te.dims.first()
            {
                if !self.prog.consts.contains_key(&n.name) {
                    self.bound.insert(n.name.clone(), Poly::constant(b));
                }
            }
        }
        for (i, (name, te)) in fwd.params.iter().enumerate() {
            let ty = self.eval_type(te, &inst, &mut scope, true, None)?;
            if i == 0 {
                first_dim = ty.dims.first().cloned().into_iter().collect();
            }
            let ty = self.apply_bound(ty);
            self.validate_type(&ty, te, &format!("of `{}`", name.name));
            let nid = self.emit_node(crate::spmd::Op::Input(i), vec![], &ty, name.span);
            if let Some(p) = self.emit.as_mut() {
                p.input_names.push(name.name.clone());
            }
            args.push((Val::T(ty), name.span, nid));
        }
        self.sites.push((decl.name.span, decl.name.name.clone()));
        let out = self.call_fn(&inst, fwd, args, decl.name.span);
        self.sites.pop();
        if let Some(p) = self.emit.as_mut() {
            p.output = self.last;
        }
        Some((inst, out, first_dim))
    }

    fn apply_bound(&self, mut t: TType) -> TType {
        if self.bound.is_empty() {
            return t;
        }
        for d in &mut t.dims {
            if let Some(s) = d.size.substitute(&self.bound) {
                d.size = s;
            }
        }
        t
    }

    fn instantiate(
        &mut self,
        decl: &Rc<LayerDecl>,
        env: HashMap<String, DimVal>,
        label: String,
        site: Span,
    ) -> Option<Rc<Inst>> {
        let key = format!("{label}|{:?}|{:?}", self.mesh.map(|m| &m.axes), self.fsdp);
        if let Some(i) = self.insts.get(&key) {
            return Some(i.clone());
        }
        if self.stack.contains(&decl.name.name) {
            let mut chain = self.stack.clone();
            chain.push(decl.name.name.clone());
            self.report(Problem::RecursiveLayer { span: site, chain });
            return None;
        }
        self.stack.push(decl.name.name.clone());
        self.sites.push((site, label.clone()));
        let mut inst = Inst {
            decl: decl.clone(),
            label: label.clone(),
            env,
            weights: HashMap::new(),
            subs: HashMap::new(),
            poisoned: HashSet::new(),
        };
        let outer_fsdp = self.fsdp.clone();
        for m in &decl.members {
            if let Member::Directive { name, args, span } = m {
                if name.name == "shard_params" {
                    if let Some(f) = self.shard_params_directive(args, *span) {
                        self.fsdp = Some(f);
                    }
                } else {
                    self.report(Problem::BadDirective {
                        span: name.span,
                        message: format!("unknown directive `{}`", name.name),
                        help: Some(
                            "the only layer directive is `shard_params(axis, min_size: N)`".into(),
                        ),
                    });
                }
            }
        }
        let mut member_names: HashMap<String, Span> = HashMap::new();
        for m in &decl.members {
            let name = match m {
                Member::Weight { name, .. } | Member::Sub { name, .. } => Some(name),
                Member::Fn(f) => Some(&f.name),
                Member::Directive { .. } => None,
            };
            if let Some(n) = name {
                if let Some(first) = member_names.get(&n.name) {
                    self.report(Problem::Duplicate {
                        span: n.span,
                        name: n.name.clone(),
                        first: *first,
                    });
                    continue;
                }
                member_names.insert(n.name.clone(), n.span);
            }
            match m {
                Member::Weight { name, ty, init, .. } => {
                    let mut scope = Scope::default();
                    let t = self.eval_type(ty, &inst, &mut scope, false, None);
                    let valid = t
                        .as_ref()
                        .is_some_and(|t| self.validate_type(t, ty, &format!("of `{}`", name.name)));
                    if !valid {
                        inst.poisoned.insert(name.name.clone());
                    }
                    if let Some(t) = t.filter(|_| valid) {
                        if !t.pending.is_empty() {
                            self.report(Problem::BadValue {
                                span: ty.span,
                                message: "a weight cannot have a pending reduction".into(),
                                help: Some("remove `partial(...)` from the weight's type".into()),
                            });
                        }
                        inst.weights
                            .insert(name.name.clone(), (t.clone(), t, name.span));
                    }
                    if let Some(Err(p)) = init.as_ref().map(crate::init::Init::parse) {
                        self.report(*p);
                    }
                }
                Member::Sub { name, value, .. } => {
                    let path = format!("{label}.{}", name.name);
                    match self.sublayer(&inst, value, &path) {
                        Some(v) => {
                            inst.subs.insert(name.name.clone(), v);
                        }
                        None => {
                            inst.poisoned.insert(name.name.clone());
                        }
                    }
                }
                Member::Directive { .. } | Member::Fn(_) => {}
            }
        }
        if let Some((axis, min)) = self.fsdp.clone() {
            self.apply_fsdp(&mut inst, &axis, min);
        }
        // Record weights for --types.
        let label = match &self.fsdp {
            Some((a, _)) if !inst.weights.is_empty() => format!("{label} [shard_params({a})]"),
            _ => label,
        };
        self.fsdp = outer_fsdp;
        let mut ws: Vec<(&String, &(TType, TType, Span))> = inst.weights.iter().collect();
        ws.sort_by_key(|(_, w)| w.2);
        let entries: Vec<(TypeEntry, TType)> = ws
            .into_iter()
            .map(|(n, (stored, used, span))| {
                let e = TypeEntry {
                    span: *span,
                    scope: label.clone(),
                    name: n.clone(),
                    kind: "weight",
                    ty: stored.to_string(),
                    local: self.local_text(stored),
                    used_as: (stored != used).then(|| used.to_string()),
                    layout: None,
                };
                (e, stored.clone())
            })
            .collect();
        for (e, t) in entries {
            self.record(e, &t);
        }
        self.sites.pop();
        self.stack.pop();
        let rc = Rc::new(inst);
        self.insts.insert(key, rc.clone());
        Some(rc)
    }

    fn shard_params_directive(&mut self, args: &[Arg], span: Span) -> Option<(String, i64)> {
        let mut axis = None;
        let mut min = 0i64;
        for a in args {
            match a {
                Arg::Pos(Expr {
                    kind: ExprKind::Name(n),
                    span,
                }) if axis.is_none() => {
                    if self.check_axis(&ast::Ident {
                        name: n.clone(),
                        span: *span,
                    }) {
                        axis = Some(n.clone());
                    } else {
                        return None;
                    }
                }
                Arg::Named(
                    k,
                    ast::OptValue::Expr(Expr {
                        kind: ExprKind::Int(v),
                        ..
                    }),
                ) if k.name == "min_size" && *v >= 0 => min = *v,
                other => {
                    self.report(Problem::BadDirective { span: other.span(), message: "unexpected argument to `shard_params`".into(), help: Some("write `shard_params(data, min_size: 1024)`: a mesh axis and an optional minimum size in elements".into()) });
                    return None;
                }
            }
        }
        if axis.is_none() {
            self.report(Problem::BadDirective {
                span,
                message: "`shard_params` needs a mesh axis".into(),
                help: Some("write `shard_params(data)`".into()),
            });
        }
        axis.map(|a| (a, min))
    }

    /// FSDP/ZeRO-3 (seed 003's `shard_params`): a weight larger than `min` elements is
    /// stored split over `axis` along its largest dimension that divides evenly.
    fn apply_fsdp(&mut self, inst: &mut Inst, axis: &str, min: i64) {
        let n = self.axis_size(axis);
        for (stored, _used, _) in inst.weights.values_mut() {
            let Some(numel) = stored.numel().and_then(|p| p.as_const()) else {
                continue;
            };
            if numel <= min || stored.all_axes().contains(&axis) {
                continue;
            }
            let mut order: Vec<usize> = (0..stored.rank()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(stored.dims[i].size.as_const().unwrap_or(0)));
            for i in order {
                let local = stored.dims[i].size.as_const().unwrap_or(0)
                    / self.axes_product(&stored.dims[i].axes).max(1);
                if local % n == 0 {
                    stored.dims[i].axes.insert(0, axis.to_string());
                    break;
                }
            }
        }
    }

    fn sublayer(&mut self, inst: &Inst, value: &Expr, path: &str) -> Option<Val> {
        let ExprKind::Call(callee, args) = &value.kind else {
            self.report(Problem::WrongKind {
                span: value.span,
                expected: "a layer instantiation like `Dense(D -> 4*D)`".into(),
                found: "an expression".into(),
            });
            return None;
        };
        let ExprKind::Name(cname) = &callee.kind else {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: "expression".into(),
                found: "not a layer".into(),
            });
            return None;
        };
        if cname == "repeat" {
            return self.repeat(inst, args, value.span, path);
        }
        let Some(decl) = self.prog.layers.get(cname).cloned() else {
            let sug = did_you_mean(cname, self.prog.layers.keys().map(|s| s.as_str()));
            self.report(Problem::UnknownName {
                span: callee.span,
                name: cname.clone(),
                what: "layer",
                suggestion: sug,
            });
            return None;
        };
        if decl.is_model {
            self.report(Problem::WrongKind {
                span: callee.span,
                expected: "a layer".into(),
                found: format!("the model `{cname}`"),
            });
            return None;
        }
        let mut vals = Vec::new();
        for a in args {
            match a {
                Arg::Arrow(x, y, _) => {
                    vals.push((self.dim_arg(inst, &x.size, x.axes.as_deref())?, x.span));
                    vals.push((self.dim_arg(inst, &y.size, y.axes.as_deref())?, y.span));
                }
                Arg::Pos(e) => {
                    let Some((de, axes)) = expr_to_dim(e) else {
                        self.report(Problem::WrongKind {
                            span: e.span,
                            expected: "a dimension size".into(),
                            found: "an expression".into(),
                        });
                        return None;
                    };
                    vals.push((self.dim_arg(inst, &de, axes.as_deref())?, e.span));
                }
                Arg::Named(k, _) => {
                    self.report(Problem::NamedArg {
                        span: k.span,
                        callee: cname.clone(),
                        name: k.name.clone(),
                        known: decl.params.iter().map(|p| p.name.clone()).collect(),
                        missing: false,
                    });
                    return None;
                }
            }
        }
        if vals.len() != decl.params.len() {
            self.report(Problem::Arity {
                span: value.span,
                callee: cname.clone(),
                expected: plural(decl.params.len(), "dimension argument"),
                found: vals.len(),
                decl: Some(decl.name.span),
            });
            return None;
        }
        // A sharded size argument must divide evenly; say so at the user's call
        // rather than inside the layer (heads get their own code).
        let mut ok = true;
        for (p, (v, aspan)) in decl.params.iter().zip(&vals) {
            let Some(axes) = &v.axes else { continue };
            let n = self.axes_product(axes);
            let Some(size) = v.size.as_const() else {
                continue;
            };
            if n > 1 && size % n != 0 {
                ok = false;
                let pname = p.name.to_ascii_lowercase();
                if pname == "h" || pname.contains("head") {
                    self.report(Problem::HeadsIndivisible {
                        span: *aspan,
                        heads: size,
                        axes: Self::axes_text(axes),
                        n,
                    });
                } else {
                    let axis_decl = axes
                        .first()
                        .and_then(|a| self.mesh.and_then(|m| m.axis(a)).map(|x| x.2));
                    let lo = size / n * n;
                    let suggest = [lo, lo.saturating_add(n)]
                        .into_iter()
                        .filter(|x| *x > 0)
                        .collect();
                    self.report(Problem::Indivisible {
                        span: *aspan,
                        what: format!("argument `{}` of `{cname}`", p.name),
                        size,
                        axes: Self::axes_text(axes),
                        n,
                        axis_decl,
                        suggest,
                    });
                }
            }
        }
        if !ok {
            return None;
        }
        let vals: Vec<DimVal> = vals.into_iter().map(|(v, _)| v).collect();
        let label = format!(
            "{cname}({})",
            vals.iter().map(dimval_text).collect::<Vec<_>>().join(", ")
        );
        let env: HashMap<String, DimVal> = decl
            .params
            .iter()
            .map(|p| p.name.clone())
            .zip(vals)
            .collect();
        let _ = path;
        self.instantiate(&decl, env, label, value.span)
            .map(Val::Layer)
    }

    fn repeat(&mut self, inst: &Inst, args: &[Arg], span: Span, path: &str) -> Option<Val> {
        let pos: Vec<&Expr> = args
            .iter()
            .filter_map(|a| if let Arg::Pos(e) = a { Some(e) } else { None })
            .collect();
        if pos.len() != 2 {
            self.report(Problem::Arity {
                span,
                callee: "repeat".into(),
                expected: "2 positional arguments (count, layer)".into(),
                found: pos.len(),
                decl: None,
            });
            return None;
        }
        let (count_expr, _) = expr_to_dim(pos[0])?;
        let count = self.eval_dim(inst, &count_expr, &mut Scope::default(), false)?;
        let Some(n) = count.size.as_const().filter(|n| *n >= 1) else {
            self.report(Problem::BadDim {
                span: pos[0].span,
                expr: count.size.to_string(),
                reason: "a repeat count is a positive integer".into(),
            });
            return None;
        };
        let inner = self.sublayer(inst, pos[1], path)?;
        let Val::Layer(li) = inner else { return None };
        let mut stage_axis: Option<(String, Span)> = None;
        for a in args {
            if let Arg::Named(k, v) = a {
                match (k.name.as_str(), v) {
                    (
                        "stages",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Name(ax),
                            span,
                        }),
                    ) => {
                        if self.check_axis(&ast::Ident {
                            name: ax.clone(),
                            span: *span,
                        }) {
                            stage_axis = Some((ax.clone(), *span));
                        }
                    }
                    (
                        "schedule",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Name(s),
                            span,
                        }),
                    ) => {
                        if !["gpipe", "one_f_one_b"].contains(&s.as_str()) {
                            self.report(Problem::UnknownChoice {
                                span: *span,
                                kind: "pipeline schedule",
                                name: s.clone(),
                                known: vec!["gpipe", "one_f_one_b"],
                            });
                        }
                    }
                    (
                        "microbatches",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Int(m),
                            span,
                        }),
                    ) => {
                        if *m < 1 {
                            self.report(Problem::BadValue {
                                span: *span,
                                message: "microbatches must be at least 1".into(),
                                help: None,
                            });
                        }
                    }
                    _ => self.report(Problem::NamedArg {
                        span: k.span,
                        callee: "repeat".into(),
                        name: k.name.clone(),
                        known: vec!["stages".into(), "schedule".into(), "microbatches".into()],
                        missing: false,
                    }),
                }
            }
        }
        if let Some((ref ax, sspan)) = stage_axis {
            let stages = self.axis_size(ax);
            if n % stages != 0 {
                self.report(Problem::BadDirective {
                    span: sspan,
                    message: format!("{n} repeated layers cannot be split into {stages} pipeline stages over `{ax}`"),
                    help: Some(format!("use a layer count that is a multiple of {stages}, or a `{ax}` axis size that divides {n}")),
                });
            }
        }
        let stages = stage_axis
            .map(|(a, _)| a)
            .filter(|a| n % self.axis_size(a) == 0);
        Some(Val::Repeat(n, li, stages))
    }

    fn dim_arg(&mut self, inst: &Inst, e: &DimExpr, axes: Option<&[ast::Ident]>) -> Option<DimVal> {
        let mut v = self.eval_dim(inst, e, &mut Scope::default(), false)?;
        if let Some(ax) = axes {
            let mut names = Vec::new();
            for a in ax {
                if self.check_axis(a) {
                    names.push(a.name.clone());
                }
            }
            v.axes = Some(names);
        }
        Some(v)
    }

    /// Evaluate a size expression inside a layer: layer parameters, constants, and
    /// (when `symbols`) symbolic sizes.
    fn eval_dim(
        &mut self,
        inst: &Inst,
        e: &DimExpr,
        scope: &mut Scope,
        symbols: bool,
    ) -> Option<DimVal> {
        match e {
            DimExpr::Int(v, _) => Some(DimVal {
                size: Poly::constant(*v),
                axes: None,
            }),
            DimExpr::Name(id) => {
                if let Some(v) = inst.env.get(&id.name) {
                    return Some(v.clone());
                }
                if let Some((v, _)) = self.prog.consts.get(&id.name) {
                    return Some(DimVal {
                        size: Poly::constant(*v),
                        axes: None,
                    });
                }
                if symbols {
                    let p = scope
                        .tyvars
                        .get(&id.name)
                        .cloned()
                        .unwrap_or_else(|| Poly::sym(&id.name));
                    return Some(DimVal {
                        size: p,
                        axes: None,
                    });
                }
                let mut cands: Vec<&str> = inst.env.keys().map(|s| s.as_str()).collect();
                cands.extend(self.prog.consts.keys().map(|s| s.as_str()));
                let sug = did_you_mean(&id.name, cands);
                self.report(Problem::UnknownName {
                    span: id.span,
                    name: id.name.clone(),
                    what: "size",
                    suggestion: sug,
                });
                None
            }
            DimExpr::Bin(a, op, b, span) => {
                let x = self.eval_dim(inst, a, scope, symbols)?;
                let y = self.eval_dim(inst, b, scope, symbols)?;
                let r = match op {
                    DimOp::Add => x.size.add(&y.size),
                    DimOp::Sub => x.size.sub(&y.size),
                    DimOp::Mul => x.size.mul(&y.size),
                    DimOp::Div => x.size.div(&y.size),
                };
                let Some(size) = r else {
                    let reason = match op {
                        DimOp::Div => format!("{} / {} is not an integer", x.size, y.size),
                        _ => "overflows".into(),
                    };
                    self.report(Problem::BadDim {
                        span: *span,
                        expr: format!("{} {} {}", x.size, crate::resolve::op_str(*op), y.size),
                        reason,
                    });
                    return None;
                };
                // A sharded parameter keeps its sharding through scaling (`4*D` where D@mp).
                let axes = match (op, &x.axes, &y.axes) {
                    (DimOp::Mul | DimOp::Div, Some(a), None) if y.size.is_const() => {
                        Some(a.clone())
                    }
                    (DimOp::Mul, None, Some(b)) if x.size.is_const() => Some(b.clone()),
                    _ => None,
                };
                Some(DimVal { size, axes })
            }
        }
    }

    /// Evaluate a written type. `symbols`: unknown names are symbolic sizes. Dims
    /// without an annotation take `layout_of` (the value's layout) when given.
    fn eval_type(
        &mut self,
        te: &TypeExpr,
        inst: &Inst,
        scope: &mut Scope,
        symbols: bool,
        layout_of: Option<&TType>,
    ) -> Option<TType> {
        let mut dims = Vec::new();
        let n_explicit = te
            .dims
            .iter()
            .filter(|d| !matches!(d, DimSpec::Ellipsis(_)))
            .count();
        for (i, d) in te.dims.iter().enumerate() {
            match d {
                DimSpec::Ellipsis(span) => {
                    if let Some(e) = &scope.ellipsis {
                        dims.extend(e.iter().cloned());
                    } else if let Some(v) = layout_of {
                        let k = v.rank().saturating_sub(n_explicit);
                        dims.extend(v.dims[..k].iter().cloned());
                    } else {
                        self.report(Problem::WrongKind {
                            span: *span,
                            expected: "a dimension".into(),
                            found: "`...` outside a function parameter".into(),
                        });
                        return None;
                    }
                }
                DimSpec::Dim { size, axes, .. } => {
                    let v = self.eval_dim(inst, size, scope, symbols)?;
                    let ax = match axes {
                        Some(list) => {
                            let mut names = Vec::new();
                            for a in list {
                                if !self.check_axis(a) {
                                    return None;
                                }
                                names.push(a.name.clone());
                            }
                            names
                        }
                        None => match (&v.axes, layout_of) {
                            (Some(a), _) => a.clone(),
                            (None, Some(val)) => {
                                let off = dims.len();
                                let _ = i;
                                val.dims
                                    .get(off)
                                    .map(|d| d.axes.clone())
                                    .unwrap_or_default()
                            }
                            (None, None) => vec![],
                        },
                    };
                    dims.push(Dim {
                        size: v.size,
                        axes: ax,
                    });
                }
            }
        }
        let mut t = TType::new(te.dtype, dims);
        for (op, ax) in &te.pending {
            if self.check_axis(ax) {
                t.pending.insert(ax.name.clone(), *op);
            }
        }
        Some(t)
    }

    /// Which dims of a written type carry an explicit layout (annotation or sharded parameter).
    fn explicit_layout(&self, te: &TypeExpr, inst: &Inst, rank: usize) -> Vec<bool> {
        let mut out = Vec::new();
        let n_explicit = te
            .dims
            .iter()
            .filter(|d| !matches!(d, DimSpec::Ellipsis(_)))
            .count();
        for d in &te.dims {
            match d {
                DimSpec::Ellipsis(_) => out.extend(std::iter::repeat_n(false, rank.saturating_sub(n_explicit))),
                DimSpec::Dim { size, axes, .. } => out.push(axes.is_some() || matches!(size, DimExpr::Name(n) if inst.env.get(&n.name).is_some_and(|v| v.axes.is_some()))),
            }
        }
        out
    }

    /// Static checks on a type: axes exist (done when evaluating), no axis twice,
    /// sizes positive, sharded sizes divisible.
    fn validate_type(&mut self, t: &TType, te: &TypeExpr, owner: &str) -> bool {
        let spans: Vec<Span> = te.dims.iter().map(|d| d.span()).collect();
        let span_of = |i: usize| spans.get(i).copied().unwrap_or(te.span);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, d) in t.dims.iter().enumerate() {
            for a in &d.axes {
                if let Some(&j) = seen.get(a.as_str()) {
                    self.report(Problem::AxisTwice {
                        span: span_of(i),
                        axis: a.clone(),
                        first: span_of(j),
                        ty: t.to_string(),
                    });
                    return false;
                }
                seen.insert(a, i);
            }
        }
        let mut ok = true;
        for (i, d) in t.dims.iter().enumerate() {
            let what = if owner.is_empty() {
                format!("dimension {i}")
            } else {
                format!("dimension {i} {owner}")
            };
            ok &= self.check_dim(d, span_of(i), &what);
        }
        ok
    }

    fn check_dim(&mut self, d: &Dim, span: Span, what: &str) -> bool {
        if let Some(v) = d.size.as_const() {
            if v <= 0 {
                self.report(Problem::BadDim {
                    span,
                    expr: d.size.to_string(),
                    reason: format!("size {v}"),
                });
                return false;
            }
        }
        let size = d
            .size
            .substitute(&self.bound)
            .unwrap_or_else(|| d.size.clone());
        let n = self.axes_product(&d.axes);
        if n <= 1 {
            return true;
        }
        if let Some(v) = size.as_const() {
            if v % n != 0 {
                let lo = v / n * n;
                let hi = lo.saturating_add(n);
                let suggest: Vec<i64> = [lo, hi].into_iter().filter(|x| *x > 0).collect();
                let axis_decl = d
                    .axes
                    .first()
                    .and_then(|a| self.mesh.and_then(|m| m.axis(a)).map(|x| x.2));
                self.report(Problem::Indivisible {
                    span,
                    what: what.to_string(),
                    size: v,
                    axes: Self::axes_text(&d.axes),
                    n,
                    axis_decl,
                    suggest,
                });
                return false;
            }
        }
        true
    }

    fn local_text(&self, t: &TType) -> String {
        format!(
            "{}[{}]",
            t.dtype.name(),
            t.local_shape(&|a| self.axis_size(a)).join(", ")
        )
    }

    fn record(&mut self, mut e: TypeEntry, t: &TType) {
        if self
            .seen_types
            .insert((e.span, e.ty.clone(), e.scope.clone()))
        {
            e.layout = self.mesh.map(|m| {
                let axes = m.axes.iter().map(|a| (a.0.clone(), a.1)).collect();
                (t.clone(), axes)
            });
            self.out.types.push(e);
        }
    }

    // ── functions ────────────────────────────────────────────────────────

    fn call_fn(
        &mut self,
        inst: &Rc<Inst>,
        f: &ast::FnDecl,
        args: Vec<(Val, Span, Option<crate::spmd::Nid>)>,
        site: Span,
    ) -> Val {
        if args.len() != f.params.len() {
            self.report(Problem::Arity {
                span: site,
                callee: format!("{}.{}", inst.decl.name.name, f.name.name),
                expected: plural(f.params.len(), "argument"),
                found: args.len(),
                decl: Some(f.name.span),
            });
            return Val::Poison;
        }
        let fkey = format!("fn {}.{}", inst.label, f.name.name);
        if self.stack.contains(&fkey) {
            self.report(Problem::RecursiveLayer {
                span: site,
                chain: vec![f.name.name.clone(), f.name.name.clone()],
            });
            return Val::Poison;
        }
        let mut scope = Scope {
            scope_name: format!("{}.{}", inst.label, f.name.name),
            ..Scope::default()
        };
        for ((pname, te), (arg, aspan, nid)) in f.params.iter().zip(args) {
            self.last = nid;
            let Val::T(at) = arg else {
                if !matches!(arg, Val::Poison) {
                    self.report(Problem::WrongKind {
                        span: aspan,
                        expected: format!("a tensor for `{}`", pname.name),
                        found: arg.describe(),
                    });
                }
                return Val::Poison;
            };
            let Some(bound) = self.unify(te, &at, inst, &mut scope, aspan) else {
                return Val::Poison;
            };
            let local = self.local_text(&bound);
            let scope_name = scope.scope_name.clone();
            self.record(
                TypeEntry {
                    span: pname.span,
                    scope: scope_name,
                    name: pname.name.clone(),
                    kind: "param",
                    ty: bound.to_string(),
                    local,
                    used_as: None,
                    layout: None,
                },
                &bound,
            );
            scope.vars.insert(
                pname.name.clone(),
                Binding {
                    ty: bound,
                    nid: self.last,
                    span: pname.span,
                    deps: vec![],
                },
            );
        }
        self.stack.push(fkey);
        let result = self.block(inst, &f.body, &mut scope);
        self.stack.pop();
        let result_span = f.body.result.as_ref().map_or(f.body.span, |e| e.span);
        let Some(rt) = &f.ret else {
            return result;
        };
        let Val::T(t) = result else {
            if !matches!(result, Val::Poison) {
                self.report(Problem::WrongKind {
                    span: result_span,
                    expected: "a tensor result".into(),
                    found: result.describe(),
                });
            }
            return Val::Poison;
        };
        // Symbols only in the return type cannot be inferred: likely a typo.
        for d in &rt.dims {
            if let DimSpec::Dim { size, .. } = d {
                for id in dim_names(size) {
                    let known = inst.env.contains_key(&id.name)
                        || self.prog.consts.contains_key(&id.name)
                        || scope.tyvars.contains_key(&id.name);
                    if !known {
                        let mut c: Vec<&str> =
                            self.prog.consts.keys().map(|s| s.as_str()).collect();
                        c.extend(scope.tyvars.keys().map(|s| s.as_str()));
                        c.extend(inst.env.keys().map(|s| s.as_str()));
                        let sug = did_you_mean(&id.name, c);
                        self.report(Problem::UnknownName {
                            span: id.span,
                            name: id.name.clone(),
                            what: "size",
                            suggestion: sug,
                        });
                        return Val::Poison;
                    }
                }
            }
        }
        match self.conform(
            &t,
            rt,
            inst,
            &mut scope,
            result_span,
            "the declared return type",
        ) {
            Some(t) => Val::T(t),
            None => Val::Poison,
        }
    }

    /// Bind a signature type against an argument: dtype, rank, sizes (binding
    /// symbolic sizes), and layout (inserting a reshard where one is asked for).
    fn unify(
        &mut self,
        te: &TypeExpr,
        at: &TType,
        inst: &Inst,
        scope: &mut Scope,
        aspan: Span,
    ) -> Option<TType> {
        let n_explicit = te
            .dims
            .iter()
            .filter(|d| !matches!(d, DimSpec::Ellipsis(_)))
            .count();
        let has_ellipsis = te.dims.iter().any(|d| matches!(d, DimSpec::Ellipsis(_)));
        if at.rank() < n_explicit || !has_ellipsis && at.rank() != n_explicit {
            self.report(Problem::Rank {
                span: aspan,
                expected: n_explicit,
                found: at.rank(),
                ty: at.to_string(),
                decl: Some(te.span),
            });
            return None;
        }
        if te.dtype != at.dtype {
            self.report(Problem::DType {
                span: aspan,
                expected: te.dtype.name().into(),
                found: at.dtype.name().into(),
                other: Some(te.dtype_span),
            });
            return None;
        }
        let mut k = 0usize;
        for d in &te.dims {
            match d {
                DimSpec::Ellipsis(_) => {
                    let n = at.rank() - n_explicit;
                    scope.ellipsis = Some(at.dims[k..k + n].to_vec());
                    k += n;
                }
                DimSpec::Dim { size, .. } => {
                    if let DimExpr::Name(id) = size {
                        let free = !inst.env.contains_key(&id.name)
                            && !self.prog.consts.contains_key(&id.name)
                            && !scope.tyvars.contains_key(&id.name);
                        if free {
                            scope
                                .tyvars
                                .insert(id.name.clone(), at.dims[k].size.clone());
                        }
                    }
                    k += 1;
                }
            }
        }
        self.conform(at, te, inst, scope, aspan, "the parameter type")
    }

    /// Check `t` against a written type: sizes must match exactly; dims with an
    /// explicit layout are resharded to it (a reported collective).
    fn conform(
        &mut self,
        t: &TType,
        te: &TypeExpr,
        inst: &Inst,
        scope: &mut Scope,
        span: Span,
        what: &str,
    ) -> Option<TType> {
        let want = self.eval_type(te, inst, scope, true, Some(t))?;
        let want = self.apply_bound(want);
        let got = self.apply_bound(t.clone());
        if want.rank() != got.rank() {
            self.report(Problem::Rank {
                span,
                expected: want.rank(),
                found: got.rank(),
                ty: got.to_string(),
                decl: Some(te.span),
            });
            return None;
        }
        if want.dtype != got.dtype {
            self.report(Problem::DType {
                span,
                expected: want.dtype.name().into(),
                found: got.dtype.name().into(),
                other: Some(te.dtype_span),
            });
            return None;
        }
        for (i, (w, g)) in want.dims.iter().zip(&got.dims).enumerate() {
            if w.size != g.size {
                self.report(Problem::Mismatch {
                    span,
                    expected: want.to_string(),
                    found: got.to_string(),
                    decl: Some(te.span),
                    detail: format!("dimension {i} is {} but {what} says {}", g.size, w.size),
                });
                return None;
            }
        }
        let explicit = self.explicit_layout(te, inst, got.rank());
        // Only what the annotation asks for is checked here; inherited layouts were
        // checked where they arose.
        let mut asked = want.clone();
        for (d, e) in asked.dims.iter_mut().zip(&explicit) {
            if !e {
                d.axes.clear();
            }
        }
        self.validate_type(&asked, te, "");
        let target: Vec<Option<Vec<String>>> = want
            .dims
            .iter()
            .zip(&explicit)
            .map(|(d, e)| e.then(|| d.axes.clone()))
            .collect();
        let out = self.reshard(&got, &target, &want.pending, span, scope);
        Some(out)
    }

    fn block(&mut self, inst: &Rc<Inst>, b: &ast::Block, scope: &mut Scope) -> Val {
        let mut local_names = Vec::new();
        for l in &b.lets {
            self.hint = l.ty.as_ref().and_then(|te| {
                let mut h = Vec::new();
                for d in &te.dims {
                    match d {
                        DimSpec::Ellipsis(_) => return None,
                        DimSpec::Dim { axes, .. } => h.push(
                            axes.as_ref()
                                .map(|a| a.iter().map(|i| i.name.clone()).collect()),
                        ),
                    }
                }
                Some((l.value.span, h))
            });
            let v = self.expr(inst, &l.value, scope);
            self.hint = None;
            let deps = expr_names(&l.value);
            let Val::T(mut t) = v else {
                if !matches!(v, Val::Poison) {
                    self.report(Problem::WrongKind {
                        span: l.value.span,
                        expected: format!("a tensor for `{}`", l.name.name),
                        found: v.describe(),
                    });
                }
                scope.vars.remove(&l.name.name);
                scope.poisoned.insert(l.name.name.clone());
                continue;
            };
            if let Some(te) = &l.ty {
                match self.conform(&t, te, inst, scope, l.value.span, "the annotation") {
                    Some(c) => t = c,
                    None => {
                        scope.vars.remove(&l.name.name);
                        scope.poisoned.insert(l.name.name.clone());
                        continue;
                    }
                }
            }
            let local = self.local_text(&t);
            let name = scope.scope_name.clone();
            self.record(
                TypeEntry {
                    span: l.name.span,
                    scope: name,
                    name: l.name.name.clone(),
                    kind: "let",
                    ty: t.to_string(),
                    local,
                    used_as: None,
                    layout: None,
                },
                &t,
            );
            local_names.push(l.name.name.clone());
            scope.vars.insert(
                l.name.name.clone(),
                Binding {
                    ty: t,
                    nid: self.last,
                    span: l.name.span,
                    deps,
                },
            );
        }
        match &b.result {
            Some(e) => self.expr(inst, e, scope),
            None => {
                self.report(Problem::WrongKind {
                    span: b.span,
                    expected: "a result expression at the end of the block".into(),
                    found: "only `let` bindings".into(),
                });
                Val::Poison
            }
        }
    }

    /// The shape-flow trace for a diagnostic about `e`: the bindings its names came from.
    fn trace(&self, e: &Expr, scope: &Scope) -> Vec<Label> {
        let mut out: Vec<Label> = Vec::new();
        let mut todo = expr_names(e);
        let mut seen = HashSet::new();
        while let Some(n) = todo.pop() {
            if !seen.insert(n.clone()) || out.len() >= 8 {
                continue;
            }
            if let Some(b) = scope.vars.get(&n) {
                out.push(Label::new(b.span, format!("{n}: {}", b.ty)));
                todo.extend(b.deps.iter().cloned());
            }
        }
        out.sort_by_key(|l| l.span);
        out
    }

    fn report_traced(&mut self, p: Problem, e: &Expr, scope: &Scope) {
        let mut d = p.diagnostic();
        d.trace = self.trace(e, scope);
        self.add_context(&mut d);
        self.diags.push(d);
    }

    fn expr(&mut self, inst: &Rc<Inst>, e: &Expr, scope: &mut Scope) -> Val {
        self.last = None;
        let v = self.expr_inner(inst, e, scope);
        if !matches!(v, Val::T(_)) {
            self.last = None;
        }
        if let (Val::T(t), Some(_)) = (&v, &self.plan) {
            // Every computed value (not a name) is an activation kept for backward;
            // elementwise work is one FLOP per element (products add their own).
            // A layer call's value is its body's last value, already counted.
            let layer_call = matches!(&e.kind, ExprKind::Call(c, _)
                if matches!(&c.kind, ExprKind::Name(n) if !ops::is_builtin(n)));
            if !matches!(e.kind, ExprKind::Name(_) | ExprKind::Local(..)) && !layer_call {
                if let Some(n) = self.local_numel(&t.clone()) {
                    let m = self.mult as f64;
                    if let Some(p) = self.plan.as_mut() {
                        p.activations += n * t.dtype.bytes() as f64 * m;
                        p.forward_flops += n * m;
                    }
                }
            }
        }
        v
    }

    /// Add a node to the SPMD program being emitted (if any) and make it the current
    /// value. A missing operand (an error elsewhere) drops the node.
    pub(crate) fn emit_node(
        &mut self,
        op: crate::spmd::Op,
        args: Vec<Option<crate::spmd::Nid>>,
        ty: &TType,
        span: Span,
    ) -> Option<crate::spmd::Nid> {
        self.emit.as_ref()?;
        let ty = self.apply_bound(ty.clone());
        let args: Option<Vec<crate::spmd::Nid>> = args.into_iter().collect();
        let Some(args) = args else {
            self.last = None;
            return None;
        };
        let id = self.emit.as_mut()?.add(op, args, ty, span);
        self.last = Some(id);
        Some(id)
    }

    /// A weight used in forward: one parameter per layer path, gathered when FSDP
    /// stores it split.
    fn emit_param(&mut self, inst: &Inst, n: &str, stored: &TType, used: &TType, span: Span) {
        if self.emit.is_none() {
            return;
        }
        let mut full = self.path.clone();
        full.push(n.to_string());
        let init = inst
            .decl
            .members
            .iter()
            .find_map(|m| match m {
                Member::Weight {
                    name: w,
                    init: Some(i),
                    ..
                } if w.name == n => crate::init::Init::parse(i).ok(),
                _ => None,
            })
            .unwrap_or(crate::init::Init::Zeros);
        self.emit_parameter(full.join("."), stored, used, init, span);
    }

    /// A parameter node (once per name), gathered to its `used` layout when it is
    /// stored split (FSDP weights, embedding-table rows). Becomes the current value.
    pub(crate) fn emit_parameter(
        &mut self,
        name: String,
        stored: &TType,
        used: &TType,
        init: crate::init::Init,
        span: Span,
    ) -> Option<crate::spmd::Nid> {
        if let Some(id) = self.param_nodes.get(&name) {
            self.last = Some(*id);
            return Some(*id);
        }
        let p = self.emit.as_mut()?;
        p.params.push(crate::spmd::Param {
            name: name.clone(),
            stored: stored.clone(),
            used: used.clone(),
            init,
            span,
        });
        let idx = p.params.len() - 1;
        let mut id = self.emit_node(crate::spmd::Op::Param(idx), vec![], stored, span);
        if stored != used {
            let axes = stored
                .all_axes()
                .into_iter()
                .filter(|a| !used.all_axes().contains(a))
                .map(|s| s.to_string())
                .collect();
            id = self.emit_node(
                crate::spmd::Op::Collective("all_gather".into(), axes, vec![]),
                vec![id],
                used,
                span,
            );
        }
        if let Some(id) = id {
            self.param_nodes.insert(name, id);
        }
        id
    }

    /// Elements of one device's piece of `t`, when all sizes are known.
    pub(crate) fn local_numel(&self, t: &TType) -> Option<f64> {
        let n = t.numel()?.substitute(&self.bound)?.as_const()? as f64;
        let shards: f64 = t
            .dims
            .iter()
            .map(|d| self.axes_product(&d.axes) as f64)
            .product();
        Some(n / shards.max(1.0))
    }

    pub(crate) fn add_flops(&mut self, f: f64) {
        let m = self.mult as f64;
        if let Some(p) = self.plan.as_mut() {
            p.forward_flops += f * m;
        }
    }

    /// Record a collective in the plan (`count` per forward; backward transposes add as many).
    pub(crate) fn add_comm(
        &mut self,
        kind: &str,
        axes: Vec<String>,
        bytes: f64,
        span: Span,
        explicit: bool,
    ) {
        let m = self.mult;
        let source = self.sources.describe(span);
        if let Some(p) = self.plan.as_mut() {
            p.comms.push(crate::plan::Comm {
                kind: kind.to_string(),
                axes,
                bytes,
                count: 2 * m,
                span,
                source,
                explicit,
            });
        }
    }

    fn expr_inner(&mut self, inst: &Rc<Inst>, e: &Expr, scope: &mut Scope) -> Val {
        match &e.kind {
            ExprKind::Float(v) => Val::Num(*v),
            ExprKind::Int(v) => Val::Int(*v),
            ExprKind::Str(s) => Val::Str(s.clone()),
            ExprKind::Name(n) => self.name(inst, n, e.span, scope),
            ExprKind::Neg(x) => match self.expr(inst, x, scope) {
                Val::Num(v) => Val::Num(-v),
                Val::Int(v) => Val::Int(v.wrapping_neg()),
                Val::T(t) => {
                    let ix = self.last;
                    self.emit_node(crate::spmd::Op::Neg, vec![ix], &t, e.span);
                    Val::T(t)
                }
                Val::Poison => Val::Poison,
                v => {
                    self.report(Problem::WrongKind {
                        span: x.span,
                        expected: "a tensor or number".into(),
                        found: v.describe(),
                    });
                    Val::Poison
                }
            },
            ExprKind::Bin(a, op, b) => {
                let va = self.expr(inst, a, scope);
                let ia = self.last;
                let vb = self.expr(inst, b, scope);
                let ib = self.last;
                let num = |v: &Val| match v {
                    Val::Num(x) => Some(*x),
                    Val::Int(x) => Some(*x as f64),
                    _ => None,
                };
                let (na, nb) = (num(&va), num(&vb));
                let r = self.binary(*op, (va, a), (vb, b), e, scope);
                if let Val::T(t) = &r {
                    use crate::spmd::Op;
                    let (o, args) = match (na, nb) {
                        (None, Some(c)) => (Op::Binary(*op, Some(c)), vec![ia]),
                        (Some(c), None) => (Op::ScalarLeft(*op, c), vec![ib]),
                        _ if *op == ast::BinOp::MatMul => (Op::MatMul, vec![ia, ib]),
                        _ => (Op::Binary(*op, None), vec![ia, ib]),
                    };
                    self.emit_node(o, args, t, e.span);
                }
                r
            }
            ExprKind::Call(callee, args) => self.call(inst, callee, args, e, scope),
            ExprKind::Index(base, slices) => {
                let v = self.expr(inst, base, scope);
                let ib = self.last;
                let r = self.index(inst, v, slices, e, scope);
                if let Val::T(t) = &r {
                    let text = self.sources.get(e.span.file).snippet(e.span);
                    let sl = text.rfind('[').map_or("", |i| &text[i..]).to_string();
                    self.emit_node(
                        crate::spmd::Op::Builtin("index".into(), vec![(String::new(), sl)]),
                        vec![ib],
                        t,
                        e.span,
                    );
                }
                r
            }
            ExprKind::List(_) => {
                self.report(Problem::WrongKind {
                    span: e.span,
                    expected: "a tensor".into(),
                    found: "a list (lists are arguments of reshape and transpose)".into(),
                });
                Val::Poison
            }
            ExprKind::Local(axes, block) => {
                for a in axes {
                    self.check_axis(a);
                }
                let saved = scope.local.replace(e.span);
                let v = self.block(inst, block, scope);
                scope.local = saved;
                v
            }
        }
    }

    fn name(&mut self, inst: &Rc<Inst>, n: &str, span: Span, scope: &Scope) -> Val {
        if let Some(b) = scope.vars.get(n) {
            self.last = b.nid;
            return Val::T(b.ty.clone());
        }
        if scope.poisoned.contains(n) || inst.poisoned.contains(n) {
            return Val::Poison;
        }
        if let Some((stored, used, wspan)) = inst.weights.get(n) {
            self.emit_param(inst, n, stored, used, *wspan);
            return Val::T(used.clone());
        }
        if let Some(s) = inst.subs.get(n) {
            return s.clone();
        }
        if let Some(v) = inst.env.get(n) {
            if let Some(c) = v.size.as_const() {
                return Val::Int(c);
            }
        }
        if let Some((v, _)) = self.prog.consts.get(n) {
            return Val::Int(*v);
        }
        if let Some(v) = scope.tyvars.get(n) {
            if let Some(c) = v.substitute(&self.bound).and_then(|p| p.as_const()) {
                return Val::Int(c);
            }
        }
        let mut cands: Vec<&str> = scope.vars.keys().map(|s| s.as_str()).collect();
        cands.extend(inst.weights.keys().map(|s| s.as_str()));
        cands.extend(inst.subs.keys().map(|s| s.as_str()));
        cands.extend(self.prog.consts.keys().map(|s| s.as_str()));
        let sug = did_you_mean(n, cands);
        self.report(Problem::UnknownName {
            span,
            name: n.to_string(),
            what: "name",
            suggestion: sug,
        });
        Val::Poison
    }

    fn call(
        &mut self,
        inst: &Rc<Inst>,
        callee: &Expr,
        args: &[Arg],
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        if let ExprKind::Name(n) = &callee.kind {
            if inst.poisoned.contains(n) && !scope.vars.contains_key(n) {
                return Val::Poison;
            }
        }
        let ExprKind::Name(name) = &callee.kind else {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: "this expression".into(),
                found: "not a function or layer".into(),
            });
            return Val::Poison;
        };
        let sub = if scope.vars.contains_key(name) {
            None
        } else {
            inst.subs.get(name).cloned()
        };
        if let Some(sub) = sub {
            let mut vals = Vec::new();
            for a in args {
                match a {
                    Arg::Pos(x) => {
                        let v = self.expr(inst, x, scope);
                        vals.push((v, x.span, self.last));
                    }
                    other => {
                        self.report(Problem::WrongKind {
                            span: other.span(),
                            expected: "a positional tensor argument".into(),
                            found: "a named argument".into(),
                        });
                        return Val::Poison;
                    }
                }
            }
            return self.call_layer(name, &sub, vals, e, scope);
        }
        if !scope.vars.contains_key(name) {
            if let Some(f) = find_fn(&inst.decl, name) {
                let mut vals = Vec::new();
                for a in args {
                    if let Arg::Pos(x) = a {
                        let v = self.expr(inst, x, scope);
                        vals.push((v, x.span, self.last));
                    }
                }
                self.sites.push((e.span, inst.label.clone()));
                let r = self.call_fn(inst, f, vals, e.span);
                self.sites.pop();
                return r;
            }
        }
        if ops::is_builtin(name) {
            return self.builtin(inst, name, callee.span, args, e, scope);
        }
        if let Some(v) = scope.vars.get(name) {
            let found = format!("a tensor `{}`", v.ty);
            self.report(Problem::NotCallable {
                span: callee.span,
                name: name.clone(),
                found,
            });
            return Val::Poison;
        }
        if inst.weights.contains_key(name) {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: name.clone(),
                found: "a weight".into(),
            });
            return Val::Poison;
        }
        if self.prog.layers.contains_key(name) {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: name.clone(),
                found: "a layer declaration; instantiate it as a member (`mlp = MLP(D)`) and call the member".into(),
            });
            return Val::Poison;
        }
        let mut cands: Vec<&str> = ops::BUILTINS.to_vec();
        cands.extend(inst.subs.keys().map(|s| s.as_str()));
        let sug = did_you_mean(name, cands);
        self.report(Problem::UnknownName {
            span: callee.span,
            name: name.clone(),
            what: "function",
            suggestion: sug,
        });
        Val::Poison
    }

    fn call_layer(
        &mut self,
        name: &str,
        sub: &Val,
        vals: Vec<(Val, Span, Option<crate::spmd::Nid>)>,
        e: &Expr,
        scope: &Scope,
    ) -> Val {
        let (li, count, per_device) = match sub {
            Val::Layer(li) => (li.clone(), 1, 1),
            // Each pipeline stage runs only its share of the repeated layers.
            Val::Repeat(n, li, stages) => (
                li.clone(),
                *n,
                *n / stages.as_ref().map_or(1, |a| self.axis_size(a)).max(1),
            ),
            _ => return Val::Poison,
        };
        let Some(f) = find_fn(&li.decl, "forward") else {
            self.report(Problem::NoForward {
                span: li.decl.name.span,
                layer: li.label.clone(),
            });
            return Val::Poison;
        };
        let input = vals.first().map(|(v, _, _)| v.clone());
        self.sites.push((e.span, li.label.clone()));
        let key = (
            f.span,
            format!(
                "{:?}",
                vals.iter()
                    .map(|(v, _, _)| match v {
                        Val::T(t) => t.to_string(),
                        _ => String::new(),
                    })
                    .collect::<Vec<_>>()
            ),
        );
        let first = self.checked_fns.insert(key);
        let saved = self.diags.len();
        let saved_mult = self.mult;
        self.mult = self.mult.saturating_mul(per_device as u64);
        if count > MAX_UNROLL {
            // Too many layers to unroll into a program (a typo like `repeat(8000000, …)`
            // must not hang the checker): check and plan it, but do not lower it.
            self.emit = None;
        }
        let stage_axis = match sub {
            Val::Repeat(_, _, Some(a)) => Some(a.clone()),
            _ => None,
        };
        if let Some(ax) = &stage_axis {
            // A stage holds whole layers: nothing inside may be split over its axis.
            let mut bad: Vec<(Span, String)> = li
                .weights
                .values()
                .filter(|w| {
                    w.0.all_axes().contains(&ax.as_str()) || w.1.all_axes().contains(&ax.as_str())
                })
                .map(|w| (w.2, w.0.to_string()))
                .collect();
            if let Some((Val::T(t), sp, _)) = vals.first() {
                if t.all_axes().contains(&ax.as_str()) || t.pending.contains_key(ax) {
                    bad.push((*sp, t.to_string()));
                }
            }
            bad.sort();
            if let Some((span, ty)) = bad.into_iter().next() {
                self.report(Problem::StageAxisInside {
                    span,
                    axis: ax.clone(),
                    ty,
                    stack: e.span,
                });
                return Val::Poison;
            }
        }
        let acts_before = self.plan.as_ref().map(|p| p.activations);
        let out = if self.emit.is_some() && count > 1 {
            // The program gets every repetition, each with its own parameters
            // (`blocks.0`, `blocks.1`, ...); the plan counts the first one, scaled.
            let mut vals = vals;
            let mut out = Val::Poison;
            let mut saved_plan = None;
            let input = vals.first().and_then(|v| v.2);
            let mut ranges = Vec::new();
            for i in 0..count {
                let start = self.emit.as_ref().map_or(0, |p| p.nodes.len());
                self.path.push(format!("{name}.{i}"));
                out = self.call_fn(&li, f, vals.clone(), e.span);
                self.path.pop();
                let end = self.emit.as_ref().map_or(0, |p| p.nodes.len());
                ranges.push((start as crate::spmd::Nid, end as crate::spmd::Nid));
                if i == 0 {
                    saved_plan = self.plan.take();
                }
                vals = vec![(out.clone(), e.span, self.last)];
            }
            self.plan = saved_plan;
            let schedule = self.pipeline_schedule.clone();
            let stages = stage_axis
                .as_ref()
                .map_or(1, |ax| self.mesh.map_or(1, |m| m.size(ax)).max(1) as usize);
            let microbatches = self.pipeline_microbatches.unwrap_or(1);
            if let (Some(ax), Some(input), Some(p)) = (&stage_axis, input, self.emit.as_mut()) {
                p.pipeline = Some(crate::spmd::Pipeline {
                    axis: ax.clone(),
                    stages,
                    microbatches,
                    schedule,
                    blocks: ranges,
                    input,
                });
            }
            out
        } else {
            self.path.push(name.to_string());
            let o = self.call_fn(&li, f, vals, e.span);
            self.path.pop();
            o
        };
        self.mult = saved_mult;
        if stage_axis.is_some() {
            // Activations before the stack, and after its share on one stage.
            if let (Some(b), Some(p)) = (acts_before, self.plan.as_ref()) {
                self.stack_acts = Some((b, p.activations));
            }
        }
        if !first {
            // Same layer, same argument types: its diagnostics were already reported.
            self.diags.truncate(saved);
        }
        self.sites.pop();
        if count > 1 {
            if let (Some(Val::T(i)), Val::T(o)) = (&input, &out) {
                if i != o {
                    self.report_traced(
                        Problem::Mismatch {
                            span: e.span,
                            expected: i.to_string(),
                            found: o.to_string(),
                            decl: Some(li.decl.name.span),
                            detail: format!(
                                "a layer repeated {count} times must return its input type"
                            ),
                        },
                        e,
                        scope,
                    );
                    return Val::Poison;
                }
            }
        }
        out
    }
}

fn find_fn<'a>(decl: &'a LayerDecl, name: &str) -> Option<&'a ast::FnDecl> {
    decl.members.iter().find_map(|m| match m {
        Member::Fn(f) if f.name.name == name => Some(f),
        _ => None,
    })
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn dimval_text(v: &DimVal) -> String {
    let s = v.size.to_string();
    match &v.axes {
        Some(a) if a.len() == 1 => format!("{s}@{}", a[0]),
        Some(a) if a.is_empty() => format!("{s}@_"),
        Some(a) => format!("{s}@({})", a.join(", ")),
        None => s,
    }
}

fn dim_names(e: &DimExpr) -> Vec<ast::Ident> {
    match e {
        DimExpr::Int(..) => vec![],
        DimExpr::Name(i) => vec![i.clone()],
        DimExpr::Bin(a, _, b, _) => {
            let mut v = dim_names(a);
            v.extend(dim_names(b));
            v
        }
    }
}

/// Names an expression reads (for the shape-flow trace).
fn expr_names(e: &Expr) -> Vec<String> {
    let mut out = Vec::new();
    fn go(e: &Expr, out: &mut Vec<String>) {
        match &e.kind {
            ExprKind::Name(n) => out.push(n.clone()),
            ExprKind::Neg(x) => go(x, out),
            ExprKind::Bin(a, _, b) => {
                go(a, out);
                go(b, out)
            }
            ExprKind::Call(_, args) => {
                for a in args {
                    if let Arg::Pos(x) = a {
                        go(x, out)
                    }
                }
            }
            ExprKind::Index(b, _) => go(b, out),
            _ => {}
        }
    }
    go(e, &mut out);
    out
}

/// Read a positional layer argument written as an expression (`768`, `4*D`,
/// `VOCAB@mp`, which parses as a matmul by an axis name) as a size and sharding.
fn expr_to_dim(e: &Expr) -> Option<(DimExpr, Option<Vec<ast::Ident>>)> {
    fn go(e: &Expr, axes: &mut Option<Vec<ast::Ident>>) -> Option<DimExpr> {
        match &e.kind {
            ExprKind::Int(v) => Some(DimExpr::Int(*v, e.span)),
            ExprKind::Name(n) => Some(DimExpr::Name(ast::Ident {
                name: n.clone(),
                span: e.span,
            })),
            ExprKind::Bin(a, ast::BinOp::MatMul, b) => {
                let ExprKind::Name(ax) = &b.kind else {
                    return None;
                };
                if axes.is_some() {
                    return None;
                }
                *axes = Some(vec![ast::Ident {
                    name: ax.clone(),
                    span: b.span,
                }]);
                go(a, axes)
            }
            ExprKind::Bin(a, op, b) => {
                let op = match op {
                    ast::BinOp::Add => DimOp::Add,
                    ast::BinOp::Sub => DimOp::Sub,
                    ast::BinOp::Mul => DimOp::Mul,
                    ast::BinOp::Div => DimOp::Div,
                    ast::BinOp::MatMul => return None,
                };
                let x = go(a, axes)?;
                let y = go(b, axes)?;
                Some(DimExpr::Bin(Box::new(x), op, Box::new(y), e.span))
            }
            _ => None,
        }
    }
    let mut axes = None;
    let d = go(e, &mut axes)?;
    Some((d, axes))
}

pub(crate) fn reduce_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "psum",
        ReduceOp::Max => "pmax",
        ReduceOp::Min => "pmin",
    }
}
