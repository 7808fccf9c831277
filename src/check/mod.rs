//! Stage 6 (check): shape, dtype and sharding checking.
//!
//! Layers are checked per instantiation (like templates): `Block(768, 12)` binds the
//! layer's dimension parameters to concrete sizes (and shardings), so every error
//! can quote real numbers. Symbolic sizes (`B`, `T`) in function signatures unify at
//! call sites. Each ops's type comes from its primitive's rule ([`crate::prim`]).
//!
//! What the checker records ([`Checked`]): every binding's type (for
//! `check --types` and editor hovers), and for each trained model its typed
//! function bodies ([`body::Body`]): every op with its result type, the
//! reshards the checker inserts, weights by name and calls of sublayers. The
//! next stage ([`crate::lower`]) turns those into the SPMD program.

mod body;
mod calls;
mod decls;
mod layers;
mod lint;
mod policy;
mod reuse;
mod rules;
mod staging;

pub use body::{Bodies, Body, BodyId, Call, Op, Repeat, VId};
pub use reuse::{forget, remember, replayed};

use crate::ast::{self, LayerDecl};
use crate::diag::{Diagnostic, Label, Problem};
use crate::resolve::{Mesh, Program};
use crate::source::Span;
use crate::types::{Poly, TType};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A mesh's axes and their sizes, shared by the type entries checked on it.
pub type MeshAxes = Arc<[(String, i64)]>;

/// One line of `shardc check --types`. The type is kept as a type, not as
/// text: the checker records every binding and most are never shown, so
/// [`TypeEntry::ty`] and [`TypeEntry::local`] print only when asked.
#[derive(Clone, Debug)]
pub struct TypeEntry {
    pub span: Span,
    /// `Model`, `Block(768, 12).forward`, ...
    pub scope: String,
    pub name: String,
    pub kind: &'static str,
    pub t: TType,
    /// The mesh the model was checked on: its axes and their sizes.
    pub mesh: Option<MeshAxes>,
    /// For FSDP weights: the layout used in `forward` after gathering.
    pub used_as: Option<String>,
}

impl TypeEntry {
    /// The global type: `f32[B@dp, 768]`.
    pub fn ty(&self) -> String {
        self.t.to_string()
    }

    /// The per-device shape on the mesh: `f32[4, 768]`.
    pub fn local(&self) -> String {
        let mesh = self.mesh.as_deref().unwrap_or(&[]);
        let size = |a: &str| mesh.iter().find(|m| m.0 == a).map_or(1, |m| m.1);
        format!(
            "{}[{}]",
            self.t.dtype.name(),
            self.t.local_shape(&size).join(", ")
        )
    }
}

impl serde::Serialize for TypeEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("TypeEntry", 6)?;
        st.serialize_field("scope", &self.scope)?;
        st.serialize_field("name", &self.name)?;
        st.serialize_field("kind", self.kind)?;
        st.serialize_field("ty", &self.ty())?;
        st.serialize_field("local", &self.local())?;
        st.serialize_field("used_as", &self.used_as)?;
        st.end()
    }
}

/// A trained model as checked: its mesh, the batch its program runs, the body
/// of its forward (inputs first), and its pipelined stack.
#[derive(Clone, Debug)]
pub struct Model {
    pub name: String,
    pub mesh: Vec<(String, i64)>,
    /// The batch one (micro)batch of the program holds, when known.
    pub batch: Option<i64>,
    /// Values of the symbolic sizes (the batch).
    pub bound: BTreeMap<String, Poly>,
    /// The forward's parameter names.
    pub inputs: Vec<String>,
    pub body: BodyId,
    /// `loss: NAME` naming a `fn` of the model: its body, whose inputs are the
    /// forward's output and the targets.
    pub loss: Option<BodyId>,
    /// The loss function's parameter names: the output, the targets and,
    /// when it takes them, the weights (the array they are read from).
    pub loss_inputs: Vec<String>,
    /// `repeat(..., stages: axis)`: microbatches and schedule.
    pub pipeline: Option<(usize, crate::schedule::Source)>,
}

/// What the checker learned, for tools and later stages.
#[derive(Debug, Default)]
pub struct Checked {
    pub types: Vec<TypeEntry>,
    /// One per `train` whose model checked without errors.
    pub models: Vec<Model>,
    pub bodies: Bodies,
}

/// A layer dimension parameter's value: a size and, when written, its sharding.
#[derive(Clone, Debug, PartialEq)]
struct DimVal {
    size: Poly,
    axes: Option<Vec<String>>,
}

#[derive(Clone, Debug)]
struct Inst {
    decl: Arc<LayerDecl>,
    /// `Block(768, 12)`: shown in diagnostics and `--types`.
    label: String,
    /// The instance's identity (label, mesh, FSDP): equal keys check alike.
    key: String,
    env: HashMap<String, DimVal>,
    /// Weight name → (storage type, type used in forward, span).
    weights: HashMap<String, (TType, TType, Span)>,
    subs: HashMap<String, Val>,
    /// Members whose declaration had an error: uses of them report nothing more.
    poisoned: HashSet<String>,
    /// Weights that are frozen: named by `freeze(...)` here, or every weight
    /// of an instance inside a frozen sublayer.
    frozen: HashSet<String>,
    /// Weights whose `init` is an expression (buffers like RoPE tables): the
    /// body that computes each one's whole value.
    computed: HashMap<String, BodyId>,
    /// `checkpoint(...)` in the layer: the policy each call of its `forward`
    /// is checkpointed with (`Some([])`: full; names: those `let`s kept).
    checkpoint: Option<Vec<String>>,
}

#[derive(Clone, Debug)]
enum Val {
    T(TType),
    Num(f64),
    Int(i64),
    Str(String),
    Layer(Arc<Inst>),
    /// `repeat(n, layer)`, optionally split into pipeline stages over an axis,
    /// optionally checkpointed (each repetition's values recomputed in
    /// backward, but for the `let`s named).
    Repeat(i64, Arc<Inst>, Option<String>, Option<Vec<String>>),
    /// The results of a multi-result op (`split`), each with its value in
    /// the body: named by `let (a, b, ...) = ...`.
    Tuple(&'static str, Vec<(TType, Option<VId>)>),
    /// Already reported; stop cascading.
    Poison,
}

impl Val {
    pub(super) fn describe(&self) -> String {
        match self {
            Val::T(t) => format!("a tensor `{t}`"),
            Val::Num(_) => "a number".into(),
            Val::Int(_) => "an integer".into(),
            Val::Str(s) => format!("the string \"{s}\""),
            Val::Layer(i) => format!("the layer `{}`", i.label),
            Val::Repeat(n, i, _, _) => format!("the layer stack `repeat({n}, {})`", i.label),
            Val::Tuple(op, parts) => format!(
                "the {} results of `{op}` (name each: `let (a, b, ...) = {op}(...)`)",
                parts.len()
            ),
            Val::Poison => "an invalid value".into(),
        }
    }
}

#[derive(Clone, Debug)]
struct Binding {
    ty: TType,
    /// The value in the body being checked.
    vid: Option<VId>,
    span: Span,
    /// Names this binding was computed from, for the shape-flow trace.
    deps: Vec<String>,
}

#[derive(Default)]
struct Scope {
    vars: HashMap<String, Binding>,
    tyvars: BTreeMap<String, Poly>,
    ellipsis: Option<Vec<crate::types::Dim>>,
    /// Bindings whose value had an error: using them reports nothing more.
    poisoned: HashSet<String>,
    /// Innermost `local { }` block, if any: no implicit collectives inside.
    local: Option<Span>,
    scope_name: String,
}

/// What the command line asks of a check, beyond the file.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flags {
    /// Every collective must be written explicitly (also `pragma strict`).
    pub strict: bool,
    /// The run holds every float in f64 (`shardc run --f64`): no declared
    /// float type is one it does not hold, so W0002 does not apply.
    pub f64: bool,
}

pub struct Checker<'p> {
    prog: &'p Program,
    spec: &'p crate::spec::Spec,
    pub diags: Vec<Diagnostic>,
    mesh: Option<&'p Mesh>,
    strict: Option<Span>,
    run_f64: bool,
    pub out: Checked,
    /// Types recorded, by a hash of (place, type, scope): their indices in
    /// `out.types` (each binding is listed once however often it is checked).
    seen_types: HashMap<u64, Vec<usize>>,
    /// The mesh being checked on, as type entries keep it (one copy per mesh).
    mesh_axes: Option<MeshAxes>,
    stack: Vec<String>,
    /// Instantiation sites, innermost last: errors inside a stdlib layer point here too.
    sites: Vec<(Span, String)>,
    /// Symbolic sizes bound by a `train` declaration (the batch).
    bound: BTreeMap<String, Poly>,
    insts: HashMap<String, Arc<Inst>>,
    /// `shard_params` in force for the layers being instantiated (FSDP applies to
    /// every weight below the model or layer that asks for it).
    fsdp: Option<(String, i64)>,
    /// Inside a sublayer named by an enclosing `freeze(...)`: every weight frozen.
    freezing: bool,
    /// A model's `checkpoint(full)` in force: every `repeat` below it
    /// checkpoints its blocks unless the repeat or its layer names a policy.
    checkpoint_repeats: bool,
    /// Layout asked for by the annotation of the `let` whose value is being
    /// checked: (span of that value, per-dim axes, None = not annotated). An
    /// elementwise op whose operands disagree takes it instead of being ambiguous.
    hint: Option<(Span, Vec<Option<Vec<String>>>)>,
    /// The bodies being checked, innermost last, and the value of the
    /// expression just checked in the innermost one.
    open: Vec<Body>,
    last: Option<VId>,
    /// Bodies already checked: (instance, function, argument types, bound) → body
    /// and result; and each such body's key.
    memo: HashMap<String, (BodyId, Val)>,
    memo_of: HashMap<BodyId, String>,
    /// Calls kept from earlier compilations ([`reuse`]), when on.
    reuse: Option<reuse::Reuse<'p>>,
    /// Declarations of the weights read, in order, repeats included (what
    /// a kept call replays).
    weight_log: Vec<Span>,
    /// Declarations of the weights some checked function reads (W0005 for
    /// the others), and those already warned about.
    used_weights: HashSet<Span>,
    unused_said: HashSet<Span>,
    /// Operands of the built-in being checked, in order; and whether we are
    /// inside one (its internal reshards are implied by its result).
    arg_ids: Vec<Option<VId>>,
    in_builtin: bool,
}

impl<'p> Checker<'p> {
    pub fn new(prog: &'p Program, spec: &'p crate::spec::Spec, flags: Flags) -> Self {
        let strict = prog.strict.or(flags.strict.then(Span::default));
        Checker {
            prog,
            spec,
            diags: vec![],
            mesh: None,
            strict,
            run_f64: flags.f64,
            out: Checked::default(),
            seen_types: HashMap::default(),
            mesh_axes: None,
            stack: vec![],
            sites: vec![],
            bound: BTreeMap::new(),
            insts: HashMap::default(),
            fsdp: None,
            freezing: false,
            checkpoint_repeats: false,
            hint: None,
            open: Vec::new(),
            last: None,
            memo: HashMap::default(),
            memo_of: HashMap::default(),
            reuse: None,
            weight_log: Vec::new(),
            used_weights: HashSet::default(),
            unused_said: HashSet::default(),
            arg_ids: Vec::new(),
            in_builtin: false,
        }
    }

    /// Replays calls kept from the last compilation of the same root file,
    /// and keeps this one's, where [`remember`] turned that on.
    /// A trial compilation (`commit` false: a fix-it tried) reads what was
    /// kept but keeps nothing of its own.
    pub fn reusing(mut self, sources: &'p crate::source::SourceMap, commit: bool) -> Self {
        let flags = (self.strict.is_some(), self.run_f64);
        self.reuse = reuse::Reuse::new(sources, self.prog, flags, commit);
        self
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
        if let Some(r) = self.reuse.take() {
            r.commit();
        }
        // Same problem found through two instantiations: report once.
        let mut seen = HashSet::default();
        self.diags
            .retain(|d| seen.insert((d.code, d.primary.span, d.message.clone())));
        (self.diags, self.out)
    }

    pub(super) fn report(&mut self, p: Problem) {
        let mut d = p.diagnostic();
        self.add_context(&mut d);
        self.diags.push(d);
    }

    pub(super) fn add_context(&self, d: &mut Diagnostic) {
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

    pub(super) fn axis_size(&self, a: &str) -> i64 {
        self.mesh.map_or(1, |m| m.size(a))
    }

    pub(super) fn axes_product(&self, axes: &[String]) -> i64 {
        axes.iter()
            .fold(1i64, |acc, a| acc.saturating_mul(self.axis_size(a)))
    }

    pub(super) fn axes_text(axes: &[String]) -> String {
        crate::prim::rules::axes_text(axes)
    }

    pub(super) fn check_axis(&mut self, axis: &ast::Ident) -> bool {
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

    pub(super) fn apply_bound(&self, mut t: TType) -> TType {
        if self.bound.is_empty() {
            return t;
        }
        for d in t.dims.iter_mut().filter(|d| d.size.names_any(&self.bound)) {
            if let Some(s) = d.size.substitute(&self.bound) {
                d.size = s;
            }
        }
        t
    }
}

fn find_fn<'a>(decl: &'a LayerDecl, name: &str) -> Option<&'a ast::FnDecl> {
    decl.members.iter().find_map(|m| match m {
        ast::Member::Fn(f) if f.name.name == name => Some(f),
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
