//! Models and layer instances: instantiation (dimension parameters bound,
//! FSDP applied), sublayers and `repeat`, and the evaluation and validation of
//! written sizes and types.

use super::{body::Op, find_fn, plural, Checker, DimVal, Inst, Scope, TypeEntry, Val};
use crate::ast::{self, Arg, DimExpr, DimOp, DimSpec, Expr, ExprKind, LayerDecl, Member, TypeExpr};
use crate::diag::{did_you_mean, ComputedInitProblem, Problem};
use crate::prim::rules::expr_to_dim;
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

/// Whether a weight's `init` is an expression computed from sizes and ops
/// (`init cos(angles())`) rather than an initializer (`normal(0.02)`): anything
/// but a name, or a call of a name that is neither an op nor a function of
/// the layer (`decl`).
fn is_computed(e: &Expr, decl: &LayerDecl) -> bool {
    match &e.kind {
        ExprKind::Name(_) => false,
        ExprKind::Call(c, _) => match &c.kind {
            ExprKind::Name(n) => {
                !crate::init::NAMES.contains(&n.as_str())
                    && (crate::prim::find(n).is_some() || find_fn(decl, n).is_some())
            }
            _ => true,
        },
        _ => true,
    }
}

/// Layers contain layers at most this deep (checking, lowering and planning
/// recurse along the nesting).
pub const MAX_LAYER_DEPTH: usize = 256;

impl<'p> Checker<'p> {
    /// Check a model's forward on its own declared input types; the batch (the
    /// first dimension of the first input) is bound by `train`. Returns the
    /// instance, the forward's result, the first input's first dim, and the
    /// model's body: its inputs, then the call of `forward`.
    pub(super) fn check_model(
        &mut self,
        decl: &Arc<LayerDecl>,
        batch: Option<i64>,
    ) -> Option<(Arc<Inst>, Val, Vec<Dim>, super::BodyId)> {
        let inst = self.instantiate(
            decl,
            HashMap::default(),
            decl.name.name.clone(),
            decl.name.span,
        )?;
        let Some(fwd) = find_fn(decl, "forward") else {
            self.report(Problem::NoForward {
                span: decl.name.span,
                layer: decl.name.name.clone(),
            });
            return None;
        };
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
        let mut types = Vec::new();
        for (i, (name, te)) in fwd.params.iter().enumerate() {
            let ty = self.eval_type(te, &inst, &mut scope, true, None)?;
            if i == 0 {
                first_dim = ty.dims.first().cloned().into_iter().collect();
            }
            let ty = self.apply_bound(ty);
            self.validate_type(&ty, te, &format!("of `{}`", name.name));
            types.push(ty);
        }
        self.open_body();
        let mut args = Vec::new();
        for (i, ((name, _), ty)) in fwd.params.iter().zip(types).enumerate() {
            let vid = self.record(Op::Input(i), &ty, name.span);
            args.push((Val::T(ty), name.span, vid));
        }
        self.sites.push((decl.name.span, decl.name.name.clone()));
        let out = self.call_fn(&inst, fwd, args, decl.name.span, None);
        self.sites.pop();
        let result = matches!(out, Val::T(_)).then_some(self.last).flatten();
        let body = self.close_body(result);
        Some((inst, out, first_dim, body))
    }

    /// An instance's identity: its label and what it is checked under (the
    /// mesh by name and sizes, not by its spans, so that the key is the same
    /// wherever the text moved: `reuse`).
    fn instance_key(&self, label: &str) -> String {
        let mesh: Option<(&str, Vec<(&str, i64)>)> = self.mesh.map(|m| {
            let axes = m.axes.iter().map(|a| (a.0.as_str(), a.1)).collect();
            (m.name.as_str(), axes)
        });
        format!(
            "{label}|{mesh:?}|{:?}|{}|{}",
            self.fsdp, self.freezing, self.checkpoint_repeats
        )
    }

    pub(super) fn instantiate(
        &mut self,
        decl: &Arc<LayerDecl>,
        env: HashMap<String, DimVal>,
        label: String,
        site: Span,
    ) -> Option<Arc<Inst>> {
        let key = self.instance_key(&label);
        if let Some(i) = self.insts.get(&key) {
            return Some(i.clone());
        }
        if self.stack.len() >= MAX_LAYER_DEPTH {
            self.report(Problem::TooDeep {
                span: site,
                what: "layers inside layers",
                depth: self.stack.len() + 1,
                limit: MAX_LAYER_DEPTH,
            });
            return None;
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
            key: key.clone(),
            env,
            weights: HashMap::default(),
            subs: HashMap::default(),
            poisoned: HashSet::default(),
            frozen: HashSet::default(),
            computed: HashMap::default(),
            checkpoint: None,
        };
        let outer_fsdp = self.fsdp.clone();
        let outer_checkpoint = self.checkpoint_repeats;
        // Members named by `freeze(...)`.
        let mut freeze: HashSet<String> = HashSet::default();
        for m in &decl.members {
            if let Member::Directive { name, args, span } = m {
                match name.name.as_str() {
                    "shard_params" => {
                        if let Some(f) = self.shard_params_directive(args, *span) {
                            self.fsdp = Some(f);
                        }
                    }
                    "freeze" => freeze.extend(self.freeze_directive(decl, args, *span)),
                    "checkpoint" if decl.is_model => match args.as_slice() {
                        [Arg::Pos(Expr {
                            kind: ExprKind::Name(n),
                            ..
                        })] if n == "full" => self.checkpoint_repeats = true,
                        _ => self.report(Problem::BadDirective {
                            span: *span,
                            message: "a model's `checkpoint` takes `full` only: it checkpoints every `repeat` below the model (its `forward` is the whole step)".into(),
                            help: Some(
                                "write `checkpoint(full)`, or put `checkpoint(...)` with the values to keep in the layers to recompute".into(),
                            ),
                        }),
                    },
                    "checkpoint" => {
                        inst.checkpoint = self.checkpoint_directive(decl, args, *span)
                    }
                    _ => self.report(Problem::BadDirective {
                        span: name.span,
                        message: format!("unknown directive `{}`", name.name),
                        help: Some(
                            "layer directives are `shard_params(axis, min_size: N)`, `freeze(member, ...)` and `checkpoint(full | value, ...)`".into(),
                        ),
                    }),
                }
            }
        }
        let outer_freezing = self.freezing;
        let mut member_names: HashMap<String, Span> = HashMap::default();
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
                            self.report(Problem::WeightPending { span: ty.span });
                        }
                        inst.weights
                            .insert(name.name.clone(), (t.clone(), t, name.span));
                        if self.freezing || freeze.contains(&name.name) {
                            inst.frozen.insert(name.name.clone());
                        }
                    }
                    match init {
                        Some(e) if is_computed(e, decl) => {}
                        Some(e) => {
                            if let Err(p) = crate::init::Init::parse(e) {
                                self.report(*p);
                            }
                        }
                        None => {}
                    }
                }
                Member::Sub { name, value, .. } => {
                    let path = format!("{label}.{}", name.name);
                    self.freezing = outer_freezing || freeze.contains(&name.name);
                    let sub = self.sublayer(&inst, value, &path);
                    self.freezing = outer_freezing;
                    match sub {
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
        self.computed_inits(&mut inst);
        if let Some((axis, min)) = self.fsdp.clone() {
            self.apply_fsdp(&mut inst, &axis, min);
        }
        // Record weights for --types.
        let label = match &self.fsdp {
            Some((a, _)) if !inst.weights.is_empty() => format!("{label} [shard_params({a})]"),
            _ => label,
        };
        self.fsdp = outer_fsdp;
        self.checkpoint_repeats = outer_checkpoint;
        let mut ws: Vec<(&String, &(TType, TType, Span))> = inst.weights.iter().collect();
        ws.sort_by_key(|(_, w)| w.2);
        for (n, (stored, used, span)) in ws {
            let used_as = (stored != used).then(|| used.to_string());
            self.record_type(*span, &label, n, "weight", stored, used_as);
        }
        self.sites.pop();
        self.stack.pop();
        let rc = Arc::new(inst);
        self.insts.insert(key, rc.clone());
        Some(rc)
    }

    /// Check each weight's computed `init` (a buffer: `w: f32[T, E] init
    /// cos(angles)`) as a body of its own: no inputs, only sizes, constants
    /// and ops; every value whole on each device; the result the weight's
    /// dtype and shape. The runtime evaluates it once, before training.
    fn computed_inits(&mut self, inst: &mut Inst) {
        let decl = inst.decl.clone();
        let mut shared: Option<Arc<Inst>> = None;
        for m in &decl.members {
            let Member::Weight {
                name,
                init: Some(e),
                ..
            } = m
            else {
                continue;
            };
            if !is_computed(e, &decl) {
                continue;
            }
            let Some((declared, _, _)) = inst.weights.get(&name.name).cloned() else {
                continue;
            };
            let here = shared.get_or_insert_with(|| Arc::new(inst.clone())).clone();
            self.open_body();
            let mut scope = Scope::default();
            let v = self.expr(&here, e, &mut scope);
            let result = matches!(v, Val::T(_)).then_some(self.last).flatten();
            let body = self.close_body(result);
            match v {
                Val::T(t) => {
                    if !self.computed_init_ok(body, &name.name, e.span) {
                        inst.poisoned.insert(name.name.clone());
                        continue;
                    }
                    let same_shape = t.dtype == declared.dtype
                        && t.dims.len() == declared.dims.len()
                        && t.dims
                            .iter()
                            .zip(&declared.dims)
                            .all(|(a, b)| a.size == b.size);
                    if !same_shape {
                        let mut whole = declared.clone();
                        for d in &mut whole.dims {
                            d.axes.clear();
                        }
                        self.report(Problem::Mismatch {
                            span: e.span,
                            expected: whole.to_string(),
                            found: t.to_string(),
                            decl: Some(name.span),
                            detail: "the computed initial value".into(),
                        });
                        inst.poisoned.insert(name.name.clone());
                        continue;
                    }
                    inst.computed.insert(name.name.clone(), body);
                }
                Val::Poison => {
                    inst.poisoned.insert(name.name.clone());
                }
                other => {
                    self.report(Problem::WrongKind {
                        span: e.span,
                        expected: "a tensor (the weight's initial value)".into(),
                        found: other.describe(),
                    });
                    inst.poisoned.insert(name.name.clone());
                }
            }
        }
    }

    /// A computed initial value uses no parameter or input and keeps every
    /// value whole (it is computed on each device, before the mesh runs).
    fn computed_init_ok(&mut self, body: super::BodyId, weight: &str, at: Span) -> bool {
        let mut todo = vec![body];
        let mut seen = HashSet::default();
        while let Some(b) = todo.pop() {
            if !seen.insert(b) {
                continue;
            }
            let Some(values) = self.out.bodies.get(b).map(|b| b.values.clone()) else {
                continue;
            };
            for v in values {
                if let Op::Prim {
                    prim: crate::prim::Prim::Aux(a),
                    ..
                } = &v.op
                {
                    // Computed once before training: nothing to add to a loss.
                    self.report(Problem::ComputedInit {
                        span: v.span,
                        weight: weight.to_string(),
                        problem: ComputedInitProblem::Adds(a.name().to_string()),
                    });
                    return false;
                }
                let uses = match &v.op {
                    Op::Weight { name, .. } => Some(name.clone()),
                    Op::Table { name, .. } => Some(format!("tables.{name}")),
                    Op::Input(_) | Op::Arg(_) => Some("an input".into()),
                    Op::Call(c) => {
                        todo.push(c.body);
                        None
                    }
                    Op::Prim { .. } => None,
                };
                if let Some(uses) = uses.filter(|_| b == body || !matches!(v.op, Op::Arg(_))) {
                    self.report(Problem::ComputedInit {
                        span: at,
                        weight: weight.to_string(),
                        problem: ComputedInitProblem::Uses(uses),
                    });
                    return false;
                }
                if !v.ty.all_axes().is_empty() || !v.ty.pending.is_empty() {
                    self.report(Problem::ComputedInit {
                        span: v.span,
                        weight: weight.to_string(),
                        problem: ComputedInitProblem::Split(v.ty.to_string()),
                    });
                    return false;
                }
            }
        }
        true
    }

    /// `freeze(a, b, ...)`: the names of this layer's weights and sublayers to
    /// freeze (no gradient step, no optimizer state: constants like RoPE tables,
    /// or a pretrained part kept fixed).
    fn freeze_directive(&mut self, decl: &LayerDecl, args: &[Arg], span: Span) -> Vec<String> {
        let members: Vec<&str> = decl
            .members
            .iter()
            .filter_map(|m| match m {
                Member::Weight { name, .. } | Member::Sub { name, .. } => Some(name.name.as_str()),
                _ => None,
            })
            .collect();
        if args.is_empty() {
            self.report(Problem::BadDirective {
                span,
                message: "`freeze` needs the weights or sublayers it freezes".into(),
                help: Some("write `freeze(rope, w_out)`: members of this layer".into()),
            });
        }
        let mut out = Vec::new();
        for a in args {
            match a {
                Arg::Pos(Expr {
                    kind: ExprKind::Name(n),
                    span,
                }) => {
                    if members.contains(&n.as_str()) {
                        out.push(n.clone());
                    } else {
                        let suggestion = did_you_mean(n, members.iter().copied());
                        self.report(Problem::FreezeUnknown {
                            span: *span,
                            layer: decl.name.name.clone(),
                            name: n.clone(),
                            suggestion,
                        });
                    }
                }
                other => self.report(Problem::BadDirective {
                    span: other.span(),
                    message: "`freeze` takes the names of this layer's weights and sublayers"
                        .into(),
                    help: Some("write `freeze(rope, w_out)`".into()),
                }),
            }
        }
        out
    }

    pub(super) fn shard_params_directive(
        &mut self,
        args: &[Arg],
        span: Span,
    ) -> Option<(String, i64)> {
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
    pub(super) fn apply_fsdp(&mut self, inst: &mut Inst, axis: &str, min: i64) {
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

    pub(super) fn sublayer(&mut self, inst: &Inst, value: &Expr, path: &str) -> Option<Val> {
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
        // A model is a layer without size parameters: it may be held by
        // another (a trained backbone inside a bigger model).
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

    pub(super) fn dim_arg(
        &mut self,
        inst: &Inst,
        e: &DimExpr,
        axes: Option<&[ast::Ident]>,
    ) -> Option<DimVal> {
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
    pub(super) fn eval_dim(
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
    pub(super) fn eval_type(
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
                DimSpec::Dim { size, axes, span } => {
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
                            // A size argument split by its caller, split
                            // otherwise here: one of the two would be lost.
                            // (`@_`, replicated on purpose, is not a split.)
                            let given = v
                                .axes
                                .as_ref()
                                .filter(|g| !g.is_empty() && !names.is_empty() && **g != names);
                            if let Some(given) = given {
                                self.report(Problem::ShardingTwice {
                                    span: *span,
                                    given: given.clone(),
                                    here: names.clone(),
                                    site: self.sites.last().map(|s| s.0),
                                });
                                return None;
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
    pub(super) fn explicit_layout(&self, te: &TypeExpr, inst: &Inst, rank: usize) -> Vec<bool> {
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
    pub(super) fn validate_type(&mut self, t: &TType, te: &TypeExpr, owner: &str) -> bool {
        let spans: Vec<Span> = te.dims.iter().map(|d| d.span()).collect();
        let span_of = |i: usize| spans.get(i).copied().unwrap_or(te.span);
        let mut seen: HashMap<&str, usize> = HashMap::default();
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

    pub(super) fn check_dim(&mut self, d: &Dim, span: Span, what: &str) -> bool {
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

    /// Records a binding's type (once per place, type and scope).
    pub(super) fn record_type(
        &mut self,
        span: Span,
        scope: &str,
        name: &str,
        kind: &'static str,
        t: &TType,
        used_as: Option<String>,
    ) {
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = rustc_hash::FxHasher::default();
            (span, t, scope).hash(&mut h);
            h.finish()
        };
        let types = &self.out.types;
        let seen = self.seen_types.get(&key).is_some_and(|ix| {
            ix.iter().any(|&i| {
                types
                    .get(i)
                    .is_some_and(|e| e.span == span && e.t == *t && e.scope == scope)
            })
        });
        if seen {
            return;
        }
        self.seen_types
            .entry(key)
            .or_default()
            .push(self.out.types.len());
        let mesh = self.mesh.map(|m| match &self.mesh_axes {
            Some(axes)
                if axes
                    .iter()
                    .map(|a| (&a.0, a.1))
                    .eq(m.axes.iter().map(|a| (&a.0, a.1))) =>
            {
                axes.clone()
            }
            _ => {
                let axes: super::MeshAxes = m.axes.iter().map(|a| (a.0.clone(), a.1)).collect();
                self.mesh_axes = Some(axes.clone());
                axes
            }
        });
        self.out.types.push(TypeEntry {
            span,
            scope: scope.to_string(),
            name: name.to_string(),
            kind,
            t: t.clone(),
            mesh,
            used_as,
        });
    }

    // ── functions ────────────────────────────────────────────────────────
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

pub(super) fn dim_names(e: &DimExpr) -> Vec<ast::Ident> {
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
