//! Checks of the declarative items the spec does not cover — features against
//! their tables, a `train`'s batch against the model's inputs and pipeline —
//! and the plan of a trained model.

use super::{Checker, Val};
use crate::ast::{self, ExprKind, OptValue};
use crate::diag::{did_you_mean, LossFnProblem, Problem, ScheduleProblem};
use crate::source::Span;

/// A `repeat(n, Layer, stages: axis, microbatches: m, schedule: s)` member.
pub(super) struct Staged {
    pub axis: String,
    /// The schedule with its pieces per rank, or a schedule file.
    pub schedule: crate::schedule::Source,
    pub microbatches: Option<i64>,
    pub microbatches_span: Option<Span>,
    pub span: Span,
}

pub(super) fn staged_repeat(decl: &ast::LayerDecl) -> Option<Staged> {
    decl.members.iter().find_map(|m| {
        let ast::Member::Sub { value, .. } = m else {
            return None;
        };
        let ExprKind::Call(c, args) = &value.kind else {
            return None;
        };
        if !matches!(&c.kind, ExprKind::Name(n) if n == "repeat") {
            return None;
        }
        let named = |k: &str| {
            args.iter().find_map(|a| match a {
                ast::Arg::Named(n, OptValue::Expr(e)) if n.name == k => Some(e),
                _ => None,
            })
        };
        let axis = match named("stages").map(|e| &e.kind) {
            Some(ExprKind::Name(a)) => a.clone(),
            _ => return None,
        };
        let mb = named("microbatches");
        let chunks = match named("chunks").map(|e| &e.kind) {
            Some(ExprKind::Int(c)) if *c >= 1 => Some(*c as usize),
            _ => None,
        };
        // The default when left out; an unknown name is E0301 (`staging.rs`).
        let built = |pipe: crate::vocab::Pipe| crate::schedule::Source::Built {
            pipe,
            chunks: pipe.chunks(chunks),
        };
        let schedule = match named("schedule").map(|e| (&e.kind, e.span)) {
            Some((ExprKind::Name(s), _)) => {
                built(crate::vocab::Pipe::from_name(s).unwrap_or_default())
            }
            Some((ExprKind::Str(path), span)) => crate::schedule::Source::File {
                written: path.clone(),
                span,
                schedule: None,
            },
            _ => built(crate::vocab::Pipe::default()),
        };
        Some(Staged {
            axis,
            schedule,
            microbatches: mb.and_then(|e| match e.kind {
                ExprKind::Int(v) => Some(v),
                _ => None,
            }),
            microbatches_span: mb.map(|e| e.span),
            span: value.span,
        })
    })
}

impl<'p> Checker<'p> {
    /// A pipelined stack's microbatches against the step's batch `b`: the
    /// batch one microbatch holds and the pipeline (microbatches, schedule),
    /// or the problems (E0302, E0231; W0001 for fewer than the stages).
    fn staged_batch(
        &mut self,
        b: i64,
        st: &Staged,
    ) -> (Option<i64>, Option<(usize, crate::schedule::Source)>) {
        let stages = self.axis_size(&st.axis).max(1);
        let m = st.microbatches.unwrap_or(stages);
        let span = st.microbatches_span.unwrap_or(st.span);
        if m < 1 {
            // Reported where `repeat` is checked.
            return (None, None);
        } else if b % m != 0 {
            self.report(Problem::BadValue {
                span,
                message: format!("the batch of {b} examples per step (after `accumulate`) cannot be split into {m} pipeline microbatches"),
                help: Some(format!("use a number of microbatches that divides {b}, or a batch that is a multiple of {m}")),
            });
            return (None, None);
        } else if let Some(pipe) = match &st.schedule {
            crate::schedule::Source::Built { pipe, .. }
                if pipe.needs_multiple() && m % stages != 0 =>
            {
                Some(*pipe)
            }
            _ => None,
        } {
            self.report(Problem::Schedule {
                span,
                problem: ScheduleProblem::Microbatches {
                    schedule: pipe.label(),
                    microbatches: m as usize,
                    stages: stages as usize,
                },
            });
            return (None, None);
        } else if m < stages {
            let multiple = matches!(&st.schedule, crate::schedule::Source::Built { pipe, .. } if pipe.needs_multiple());
            let enough = (stages..=b)
                .find(|k| b % k == 0 && (!multiple || k % stages == 0))
                .and_then(|k| usize::try_from(k).ok());
            self.report(Problem::FewMicrobatches {
                span,
                microbatches: m as usize,
                stages: stages as usize,
                enough: enough.filter(|_| st.microbatches_span.is_some()),
            });
        }
        (Some(b / m), Some((m as usize, st.schedule.clone())))
    }

    pub(super) fn check_features(&mut self) {
        let tables = self.prog.tables.clone();
        for f in self.prog.features.clone() {
            let Some(table) = tables.iter().find(|t| t.name.name == f.table.name) else {
                let sug = did_you_mean(&f.table.name, tables.iter().map(|t| t.name.name.as_str()));
                self.report(Problem::UnknownName {
                    span: f.table.span,
                    name: f.table.name.clone(),
                    what: "table",
                    suggestion: sug,
                });
                continue;
            };
            if f.ty.dtype.is_float() {
                self.report(Problem::FeatureTable {
                    span: f.ty.dtype_span,
                    message: format!(
                        "feature `{}` has float ids (`{}`)",
                        f.name.name,
                        f.ty.dtype.name()
                    ),
                    label: "in this feature",
                    table: (table.name.span, "table declared here"),
                });
            }
            if f.ty.dims.len() != 2 {
                self.report(Problem::FeatureTable {
                    span: f.ty.span,
                    message: format!(
                        "feature `{}` must be `[samples, valency]`, found rank {}",
                        f.name.name,
                        f.ty.dims.len()
                    ),
                    label: "in this feature",
                    table: (table.name.span, "table declared here"),
                });
            }
        }
    }

    pub(super) fn check_train(&mut self, t: &crate::spec::Train) {
        let prog = self.prog;
        // The spec reported an unknown model or mesh; it has neither here.
        let (Some(decl), Some(mesh)) = (prog.layers.get(&t.model).cloned(), prog.mesh(&t.mesh))
        else {
            return;
        };
        self.mesh = Some(mesh);
        // The model runs on microbatches of batch / accumulate.
        let mut batch = t.micro_batch().map(|b| b as i64);
        self.bound.clear();
        // The batch is split over the axes written on the model input's first
        // dimension; check that before binding it, so the error is about the batch.
        let fwd = decl.members.iter().find_map(|m| match m {
            ast::Member::Fn(f) if f.name.name == "forward" => Some(f),
            _ => None,
        });
        // A pipelined stack runs the (micro)batch in `microbatches` pieces: the model
        // is checked and lowered for one of them.
        let staged = staged_repeat(&decl);
        let mut pipeline = None;
        if let (Some(b), Some(st)) = (batch, &staged) {
            (batch, pipeline) = self.staged_batch(b, st);
        }
        if let (Some(b), Some(f)) = (batch, fwd) {
            if let Some((_, te)) = f.params.first() {
                if let Some(ast::DimSpec::Dim {
                    axes: Some(axes), ..
                }) = te.dims.first()
                {
                    let names: Vec<String> = axes.iter().map(|a| a.name.clone()).collect();
                    let n = self.axes_product(&names);
                    if n > 1 && b % n != 0 {
                        let span = t.batch_span.unwrap_or(t.model_span);
                        self.report(Problem::BatchIndivisible {
                            span,
                            batch: b,
                            axes: Self::axes_text(&names),
                            n,
                            mesh_span: mesh.name_span,
                            written: t.batch_span.is_some(),
                            pieces: t.batch.map_or(1, |w| (w as i64 / b.max(1)).max(1)),
                        });
                        batch = None;
                    }
                }
            }
        }
        let errors_before = self.diags.iter().filter(|d| d.is_error()).count();
        let Some((inst, out, _, body)) = self.check_model(&decl, batch) else {
            return;
        };
        if !self.run_f64 {
            self.float_types(&inst, t);
        }
        // (A body cut short by an error reads less than it would.)
        if self.diags.iter().filter(|d| d.is_error()).count() == errors_before {
            self.unused_weights(&inst);
        }
        // (The model's body holds its inputs and the call of `forward`.)
        if let Some(f) = self.out.bodies.callees_of(body).first() {
            self.step_totals(*f, None);
        }
        let loss = match (&out, &t.loss_fn) {
            (Val::T(ty), Some(name)) => self.check_loss_fn(&inst, &decl, t, name, ty),
            _ => None,
        };
        if let Val::T(ty) = &out {
            if !ty.pending.is_empty() {
                let axes: Vec<String> = ty.pending.keys().cloned().collect();
                self.report(Problem::PendingUsed {
                    span: t.model_span,
                    ty: ty.to_string(),
                    op: "the loss".into(),
                    axes: Self::axes_text(&axes),
                    reduce: None,
                });
            }
        }
        // Every size of the inputs must be known to run: `train` binds the batch.
        let fwd = decl.members.iter().find_map(|m| match m {
            ast::Member::Fn(f) if f.name.name == "forward" => Some(f),
            _ => None,
        });
        let inputs_of: Vec<(usize, crate::types::TType)> = self
            .out
            .bodies
            .get(body)
            .map(|b| {
                b.values
                    .iter()
                    .filter_map(|v| match v.op {
                        super::Op::Input(i) => Some((i, v.ty.clone())),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        // (Without a valid batch, its error says enough.)
        for (i, ty) in inputs_of.into_iter().filter(|_| batch.is_some()) {
            let Some((pname, te)) = fwd.and_then(|f| f.params.get(i)) else {
                continue;
            };
            if let Some(d) = ty.dims.iter().find(|d| !d.size.is_const()) {
                let batch = self
                    .bound
                    .iter()
                    .next()
                    .and_then(|(k, v)| v.as_const().map(|n| (k.clone(), n)));
                self.report(Problem::UnboundSize {
                    span: te.span,
                    size: d.size.to_string(),
                    input: pname.name.clone(),
                    batch,
                    train: t.model_span,
                });
            }
        }
        if self.diags.iter().filter(|d| d.is_error()).count() == errors_before {
            let inputs = decl
                .members
                .iter()
                .find_map(|m| match m {
                    ast::Member::Fn(f) if f.name.name == "forward" => {
                        Some(f.params.iter().map(|p| p.0.name.clone()).collect())
                    }
                    _ => None,
                })
                .unwrap_or_default();
            self.out.models.push(super::Model {
                name: decl.name.name.clone(),
                mesh: mesh.axes.iter().map(|a| (a.0.clone(), a.1)).collect(),
                batch,
                bound: self.bound.clone(),
                inputs,
                body,
                loss_inputs: loss_inputs(&decl, t),
                loss,
                pipeline,
            });
        }
    }

    /// W0005: each declaration of a weight (in the model and every layer it
    /// holds) that no checked function read.
    fn unused_weights(&mut self, model: &std::sync::Arc<super::Inst>) {
        let mut found = std::collections::BTreeMap::new();
        for inst in instances(model) {
            for (name, (_, _, span)) in &inst.weights {
                if !self.used_weights.contains(span) {
                    // The declaration whose name this is.
                    let decl = inst.decl.members.iter().find_map(|m| match m {
                        // From the name to the end of its type or `init`
                        // (a member's own span runs on over what follows).
                        ast::Member::Weight { name, ty, init, .. } if name.span == *span => {
                            let end = init.as_ref().map_or(ty.span.end, |e| e.span.end);
                            Some(Span { end, ..name.span })
                        }
                        _ => None,
                    });
                    found.insert(*span, (name.clone(), inst.decl.name.name.clone(), decl));
                }
            }
        }
        for (span, (weight, layer, decl)) in found {
            if self.unused_said.insert(span) {
                self.report(Problem::UnusedWeight {
                    span,
                    weight,
                    layer,
                    decl,
                });
            }
        }
    }

    /// W0002: each declaration of a weight (in the model and every layer it
    /// holds) whose float type is neither the run's nor f32, the type mixed
    /// precision keeps its master weights in. The runtime holds it in the
    /// run's type whatever it declares.
    fn float_types(&mut self, model: &std::sync::Arc<super::Inst>, t: &crate::spec::Train) {
        use crate::ast::DType;
        let compute = t.precision.compute();
        let run = compute.unwrap_or(DType::F32);
        let mut found = std::collections::BTreeMap::new();
        for inst in instances(model) {
            for (name, (stored, _, span)) in &inst.weights {
                let d = stored.dtype;
                if d.is_float() && d != DType::F32 && d != run {
                    found.insert(*span, (name.clone(), d));
                }
            }
        }
        for (span, (weight, d)) in found {
            self.report(Problem::RunFloatType {
                span,
                weight,
                declared: d.name().to_string(),
                run: run.name().to_string(),
                mixed: compute.is_some(),
                train: t.model_span,
            });
        }
    }

    /// E0230: each `step_total` of body `id` (the model's `forward`, or the
    /// loss function, whose argument `output` is the model's output) must
    /// sum data, and none may sit in a function either calls.
    fn step_totals(&mut self, id: super::BodyId, output: Option<usize>) {
        for (span, problem) in self.out.bodies.step_totals(id, output) {
            self.report(Problem::StepTotal { span, problem });
        }
    }

    /// `loss: NAME` naming a `fn` of the model: checked on the forward's
    /// output and the targets its second parameter declares, as a body of its
    /// own. It must return a reduced float scalar and read no weight, table
    /// or added loss (E0226).
    fn check_loss_fn(
        &mut self,
        inst: &std::sync::Arc<super::Inst>,
        decl: &ast::LayerDecl,
        t: &crate::spec::Train,
        name: &str,
        out: &crate::types::TType,
    ) -> Option<super::BodyId> {
        let f = super::find_fn(decl, name)?;
        let chosen = t.loss_span.unwrap_or(t.model_span);
        let fail = |c: &mut Self, span: Span, problem: LossFnProblem| {
            c.report(Problem::LossFn {
                span,
                name: name.to_string(),
                chosen,
                problem,
            });
        };
        if !(2..=3).contains(&f.params.len()) {
            fail(self, f.name.span, LossFnProblem::Params(f.params.len()));
            return None;
        }
        // The targets, and the weights when it takes them: data, whose
        // sizes must all be known.
        let mut data = Vec::new();
        for (pname, pte) in &f.params[1..] {
            let mut scope = super::Scope::default();
            let ty = self.eval_type(pte, inst, &mut scope, true, None)?;
            let ty = self.apply_bound(ty);
            if !self.validate_type(&ty, pte, &format!("of `{}`", pname.name)) {
                return None;
            }
            if let Some(d) = ty.dims.iter().find(|d| !d.size.is_const()) {
                self.report(Problem::UnboundSize {
                    span: pte.span,
                    size: d.size.to_string(),
                    input: pname.name.clone(),
                    batch: None,
                    train: t.model_span,
                });
                return None;
            }
            data.push((ty, pname.span));
        }
        self.open_body();
        let a0 = self.record(super::Op::Input(0), out, f.params[0].0.span);
        let mut args = vec![(Val::T(out.clone()), chosen, a0)];
        for (i, (ty, span)) in data.into_iter().enumerate() {
            let a = self.record(super::Op::Input(i + 1), &ty, span);
            args.push((Val::T(ty), span, a));
        }
        self.sites.push((chosen, name.to_string()));
        let res = self.call_fn(inst, f, args, chosen, None);
        self.sites.pop();
        let result = matches!(res, Val::T(_)).then_some(self.last).flatten();
        let body = self.close_body(result);
        if let Some(f) = self.out.bodies.callees_of(body).first() {
            self.step_totals(*f, Some(0));
        }
        let Val::T(ty) = res else {
            return None;
        };
        if ty.rank() != 0 || !ty.dtype.is_float() || !ty.pending.is_empty() {
            fail(self, f.name.span, LossFnProblem::Result(ty.to_string()));
            return None;
        }
        if let Some((what, span)) = self.out.bodies.reads_state(body) {
            fail(self, span, LossFnProblem::Reads(what));
            return None;
        }
        Some(body)
    }
}

/// The parameter names of the loss function a `train` names.
fn loss_inputs(decl: &ast::LayerDecl, t: &crate::spec::Train) -> Vec<String> {
    t.loss_fn
        .as_deref()
        .and_then(|n| super::find_fn(decl, n))
        .map(|f| f.params.iter().map(|p| p.0.name.clone()).collect())
        .unwrap_or_default()
}

/// The model's instance and every layer instance below it, each once.
fn instances(model: &std::sync::Arc<super::Inst>) -> Vec<std::sync::Arc<super::Inst>> {
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![model.clone()];
    let mut out = Vec::new();
    while let Some(inst) = todo.pop() {
        if !seen.insert(inst.key.clone()) {
            continue;
        }
        for v in inst.subs.values() {
            if let Val::Layer(sub) | Val::Repeat(_, sub, ..) = v {
                todo.push(sub.clone());
            }
        }
        out.push(inst);
    }
    out
}
