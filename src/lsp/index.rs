//! What the editor features navigate: every declaration (constants, meshes
//! and their axes, layers, their parameters, weights, sublayers and
//! functions, `let`s, tables, features, `train`s) and every name that refers
//! to one, in every file of a compilation (the root and all it imports), by
//! byte range. Built from the syntax trees with the resolver's scoping rules
//! (`let`s, then function parameters, then the layer's members and
//! parameters, then the one global namespace, then mesh axes, then built-in
//! ops), so it works on files whose types do not check. Definition,
//! references, rename, hover, completion, semantic tokens and document
//! symbols all read it.

use crate::ast::{
    self, Arg, Block, DimArg, DimExpr, DimSpec, Expr, ExprKind, Item, ListItem, Member, OptValue,
    Options, Slice, TypeExpr,
};
use crate::resolve::Program;
use crate::source::SourceMap;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Const,
    Mesh,
    Axis,
    Layer,
    Model,
    /// A layer's dimension parameter.
    Param,
    Weight,
    Sub,
    Fn,
    FnParam,
    Let,
    Table,
    Feature,
    Train,
}

impl Kind {
    pub fn word(self) -> &'static str {
        match self {
            Kind::Const => "constant",
            Kind::Mesh => "mesh",
            Kind::Axis => "mesh axis",
            Kind::Layer => "layer",
            Kind::Model => "model",
            Kind::Param => "layer parameter",
            Kind::Weight => "weight",
            Kind::Sub => "sublayer",
            Kind::Fn => "function",
            Kind::FnParam => "function parameter",
            Kind::Let => "let binding",
            Kind::Table => "table",
            Kind::Feature => "feature",
            Kind::Train => "train",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Def {
    pub kind: Kind,
    pub name: String,
    /// Index into [`Index::files`].
    pub file: usize,
    /// The name's byte range.
    pub name_span: (usize, usize),
    /// The whole declaration's byte range.
    pub full: (usize, usize),
    /// The enclosing declaration (a layer, mesh or function), by index.
    pub container: Option<usize>,
    /// A constant's value, an axis's size.
    pub value: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Def(usize),
    /// A built-in op (a row of the op registry).
    Op(&'static str),
    /// A name that is not an op but is known (initializers, optimizers,
    /// schedules, data sources, losses, metrics, `repeat`).
    Library(&'static str),
    /// An imported file, by index.
    File(usize),
}

#[derive(Clone, Copy, Debug)]
pub struct Occ {
    pub file: usize,
    pub start: usize,
    pub end: usize,
    pub target: Target,
    /// The name of a declaration (not a use).
    pub is_def: bool,
}

#[derive(Clone, Debug)]
pub struct FileIdx {
    /// See [`super::text::key`].
    pub key: PathBuf,
    pub name: String,
    pub text: String,
    pub parsed: bool,
    /// `import` statements: their range and the file they load.
    pub imports: Vec<(usize, usize, Option<usize>)>,
}

/// The index of one compilation. `files[i]` is the compilation's `FileId(i)`.
#[derive(Clone, Debug, Default)]
pub struct Index {
    pub files: Vec<FileIdx>,
    pub defs: Vec<Def>,
    /// Sorted by file, then start.
    pub occs: Vec<Occ>,
}

type Frame = HashMap<String, usize>;

impl Index {
    pub fn build(sources: &SourceMap, program: &Program) -> Index {
        let mut ix = Index::default();
        let mut asts = Vec::new();
        for (fid, sf) in sources.files() {
            // The compilation's own trees: a file not among them did not parse.
            let ast = program
                .syntax
                .iter()
                .find(|(f, _)| *f == fid)
                .map(|(_, a)| a.clone());
            ix.files.push(FileIdx {
                key: super::text::key(&sf.path),
                name: sf.name.clone(),
                text: sf.text.clone(),
                parsed: ast.is_some(),
                imports: vec![],
            });
            asts.push(ast);
        }
        let mut b = Builder {
            ix,
            globals: HashMap::new(),
            axes: HashMap::new(),
            item_defs: HashMap::new(),
            sub_layers: HashMap::new(),
            members: Vec::new(),
        };
        for (f, ast) in asts.iter().enumerate() {
            if let Some(ast) = ast {
                b.declare(f, ast, sources);
            }
        }
        b.values(program);
        for (f, ast) in asts.iter().enumerate() {
            if let Some(ast) = ast {
                b.uses(f, ast);
            }
        }
        b.resolve_members();
        let mut ix = b.ix;
        ix.occs.sort_by_key(|o| (o.file, o.start, o.end));
        ix
    }

    pub fn file_of(&self, key: &std::path::Path) -> Option<usize> {
        self.files.iter().position(|f| f.key == key)
    }

    /// The occurrence under a byte offset of a file (a name the cursor is in
    /// or just after).
    pub fn occ_at(&self, file: usize, at: usize) -> Option<&Occ> {
        let i = self
            .occs
            .partition_point(|o| (o.file, o.start) <= (file, at));
        let mut best: Option<&Occ> = None;
        for o in self.occs[..i].iter().rev().take(8) {
            if o.file == file && o.start <= at && at <= o.end {
                // The innermost (latest starting) wins; imports span names.
                if best.is_none_or(|b| o.end - o.start < b.end - b.start) {
                    best = Some(o);
                }
            }
        }
        best
    }

    pub fn occs_of(&self, target: Target) -> impl Iterator<Item = &Occ> {
        self.occs.iter().filter(move |o| o.target == target)
    }

    /// A declaration by its file and the start of its name: how declarations
    /// of different compilations are matched.
    pub fn def_at(&self, key: &std::path::Path, start: usize) -> Option<usize> {
        let f = self.file_of(key)?;
        self.defs
            .iter()
            .position(|d| d.file == f && d.name_span.0 == start)
    }

    /// The innermost declaration of one of `kinds` whose range holds `at`.
    pub fn enclosing(&self, file: usize, at: usize, kinds: &[Kind]) -> Option<usize> {
        self.defs
            .iter()
            .enumerate()
            .filter(|(_, d)| {
                d.file == file && kinds.contains(&d.kind) && d.full.0 <= at && at <= d.full.1
            })
            .min_by_key(|(_, d)| d.full.1 - d.full.0)
            .map(|(i, _)| i)
    }

    /// The declaration's first line of source (`layer Block(D, H)`).
    pub fn header(&self, d: &Def) -> String {
        let text = &self.files[d.file].text;
        let s = text.get(d.full.0..d.full.1).unwrap_or("");
        let line = s.lines().next().unwrap_or("").trim_end();
        let line = line.strip_suffix('{').unwrap_or(line).trim_end();
        // Trailing comments are not part of the declaration.
        match line.find("//") {
            Some(i) => line[..i].trim_end().to_string(),
            None => line.to_string(),
        }
    }

    /// The `//` comment lines right above a declaration, without the slashes.
    pub fn doc_comment(&self, d: &Def) -> String {
        let text = &self.files[d.file].text;
        let before = text.get(..d.full.0).unwrap_or("");
        let Some((above, _)) = before.rsplit_once('\n') else {
            return String::new();
        };
        let doc: Vec<&str> = above
            .lines()
            .rev()
            .map(str::trim)
            .take_while(|l| l.starts_with("//"))
            .map(|l| l.trim_start_matches('/').trim())
            .collect();
        doc.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

struct Builder {
    ix: Index,
    /// The one namespace of constants, meshes, layers, tables, features.
    globals: Frame,
    axes: Frame,
    /// Per file, per item (in order): its declaration.
    item_defs: HashMap<(usize, usize), usize>,
    /// A sublayer's declaration → the name of the layer it instantiates.
    sub_layers: HashMap<usize, String>,
    /// `embed.w` members, resolved once every layer's members are declared:
    /// (file, the member's span, the sublayer's declaration, the path after it).
    members: Vec<(usize, crate::source::Span, usize, Vec<String>)>,
}

impl Builder {
    fn def(
        &mut self,
        kind: Kind,
        file: usize,
        name: &ast::Ident,
        full: crate::source::Span,
        container: Option<usize>,
    ) -> usize {
        let id = self.ix.defs.len();
        self.ix.defs.push(Def {
            kind,
            name: name.name.clone(),
            file,
            name_span: (name.span.start as usize, name.span.end as usize),
            full: (
                full.start.min(name.span.start) as usize,
                full.end.max(name.span.end) as usize,
            ),
            container,
            value: None,
        });
        if kind != Kind::Train {
            self.ix.occs.push(Occ {
                file,
                start: name.span.start as usize,
                end: name.span.end as usize,
                target: Target::Def(id),
                is_def: true,
            });
        }
        id
    }

    fn occ(&mut self, file: usize, span: crate::source::Span, target: Target) {
        self.ix.occs.push(Occ {
            file,
            start: span.start as usize,
            end: span.end as usize,
            target,
            is_def: false,
        });
    }

    /// Pass 1: the global declarations, mesh axes and imports.
    fn declare(&mut self, f: usize, ast: &ast::File, sources: &SourceMap) {
        for (i, item) in ast.items.iter().enumerate() {
            let id = match item {
                Item::Import(imp) => {
                    let target = self.import_target(f, imp, sources);
                    let (s, e) = (imp.span.start as usize, imp.span.end as usize);
                    self.ix.files[f].imports.push((s, e, target));
                    if let Some(t) = target {
                        self.occ(f, imp.span, Target::File(t));
                    }
                    continue;
                }
                Item::Pragma(_) => continue,
                Item::Const(c) => self.def(Kind::Const, f, &c.name, c.span, None),
                Item::Mesh(m) => {
                    let id = self.def(Kind::Mesh, f, &m.name, m.span, None);
                    for (a, size) in &m.axes {
                        let full = a.span.to(size.span());
                        let ax = self.def(Kind::Axis, f, a, full, Some(id));
                        self.axes.entry(a.name.clone()).or_insert(ax);
                    }
                    id
                }
                Item::Layer(l) => {
                    let kind = if l.is_model { Kind::Model } else { Kind::Layer };
                    self.def(kind, f, &l.name, l.span, None)
                }
                Item::Table(t) => self.def(Kind::Table, f, &t.name, t.span, None),
                Item::Feature(t) => self.def(Kind::Feature, f, &t.name, t.span, None),
                Item::Train(t) => {
                    let id = self.def(Kind::Train, f, &t.model, t.span, None);
                    self.item_defs.insert((f, i), id);
                    continue;
                }
            };
            self.item_defs.insert((f, i), id);
            let name = self.ix.defs[id].name.clone();
            self.globals.entry(name).or_insert(id);
        }
    }

    fn import_target(&self, f: usize, imp: &ast::Import, sources: &SourceMap) -> Option<usize> {
        let path = if imp.is_std {
            PathBuf::from(format!("<std>/{}.shard", imp.target))
        } else {
            let (_, sf) = sources.files().nth(f)?;
            sf.path.parent()?.join(&imp.target)
        };
        let key = super::text::key(&path);
        self.ix.files.iter().position(|x| x.key == key)
    }

    /// Constants' values and axes' sizes, as the resolver evaluated them.
    fn values(&mut self, program: &Program) {
        let meshes: Vec<Option<(usize, usize)>> = self
            .ix
            .defs
            .iter()
            .map(|d| (d.kind == Kind::Mesh).then_some((d.file, d.name_span.0)))
            .collect();
        for d in &mut self.ix.defs {
            match d.kind {
                Kind::Const => {
                    if let Some((v, s)) = program.consts.get(&d.name) {
                        if s.file.0 as usize == d.file {
                            d.value = Some(*v);
                        }
                    }
                }
                Kind::Axis => {
                    let mesh = d.container.and_then(|c| meshes.get(c).copied().flatten());
                    let m = program.meshes.iter().find(|m| {
                        mesh == Some((m.name_span.file.0 as usize, m.name_span.start as usize))
                    });
                    if let Some(a) = m.and_then(|m| m.axis(&d.name)) {
                        d.value = Some(a.1);
                    }
                }
                _ => {}
            }
        }
    }

    /// Pass 2: every use of a name.
    fn uses(&mut self, f: usize, ast: &ast::File) {
        for (i, item) in ast.items.iter().enumerate() {
            match item {
                Item::Import(_) | Item::Pragma(_) => {}
                Item::Const(c) => self.dim(f, &c.value, &[]),
                Item::Mesh(m) => {
                    for (_, size) in &m.axes {
                        self.dim(f, size, &[]);
                    }
                    if let Some(o) = &m.options {
                        self.options(f, o, &[]);
                    }
                }
                Item::Layer(l) => {
                    if let Some(&id) = self.item_defs.get(&(f, i)) {
                        self.layer(f, l, id);
                    }
                }
                Item::Table(t) => self.options(f, &t.options, &[]),
                Item::Feature(t) => {
                    self.ty(f, &t.ty, &[]);
                    self.global(f, &t.table);
                }
                Item::Train(t) => {
                    self.global(f, &t.model);
                    self.global(f, &t.mesh);
                    self.options(f, &t.options, &[]);
                }
            }
        }
    }

    fn global(&mut self, f: usize, name: &ast::Ident) {
        if let Some(&d) = self.globals.get(&name.name) {
            self.occ(f, name.span, Target::Def(d));
        }
    }

    fn axis(&mut self, f: usize, name: &ast::Ident) {
        if let Some(&d) = self.axes.get(&name.name) {
            self.occ(f, name.span, Target::Def(d));
        }
    }

    fn layer(&mut self, f: usize, l: &ast::LayerDecl, id: usize) {
        let mut frame = Frame::new();
        for p in &l.params {
            let d = self.def(Kind::Param, f, p, p.span, Some(id));
            frame.insert(p.name.clone(), d);
        }
        let mut members = Vec::new();
        for m in &l.members {
            let d = match m {
                Member::Weight { name, span, .. } => {
                    Some(self.def(Kind::Weight, f, name, *span, Some(id)))
                }
                Member::Sub {
                    name, span, value, ..
                } => {
                    let d = self.def(Kind::Sub, f, name, *span, Some(id));
                    if let ExprKind::Call(c, _) = &value.kind {
                        if let ExprKind::Name(layer) = &c.kind {
                            self.sub_layers.insert(d, layer.clone());
                        }
                    }
                    Some(d)
                }
                Member::Fn(func) => Some(self.def(Kind::Fn, f, &func.name, func.span, Some(id))),
                Member::Directive { .. } => None,
            };
            if let Some(d) = d {
                let name = self.ix.defs[d].name.clone();
                frame.insert(name, d);
            }
            members.push(d);
        }
        let frames = [frame];
        for (m, d) in l.members.iter().zip(members) {
            match m {
                Member::Weight { ty, init, .. } => {
                    self.ty(f, ty, &frames);
                    if let Some(e) = init {
                        self.expr(f, e, &frames);
                    }
                }
                Member::Sub { value, .. } => self.expr(f, value, &frames),
                Member::Directive { name, args, .. } => {
                    self.name(f, &name.name, name.span, &frames);
                    self.args(f, args, &frames);
                }
                Member::Fn(func) => {
                    let mut fnf = Frame::new();
                    for (p, ty) in &func.params {
                        self.ty(f, ty, &frames);
                        let pd = self.def(Kind::FnParam, f, p, p.span.to(ty.span), d);
                        fnf.insert(p.name.clone(), pd);
                    }
                    if let Some(r) = &func.ret {
                        self.ty(f, r, &frames);
                    }
                    let mut inner = frames.to_vec();
                    inner.push(fnf);
                    self.block(f, &func.body, &mut inner, d);
                }
            }
        }
    }

    fn block(&mut self, f: usize, b: &Block, frames: &mut Vec<Frame>, container: Option<usize>) {
        frames.push(Frame::new());
        for l in &b.lets {
            if let Some(t) = &l.ty {
                self.ty(f, t, frames);
            }
            self.expr(f, &l.value, frames);
            // `let (a, b) = ...` defines each name.
            for n in std::iter::once(&l.name).chain(&l.rest) {
                let d = self.def(Kind::Let, f, n, l.span, container);
                if let Some(top) = frames.last_mut() {
                    top.insert(n.name.clone(), d);
                }
            }
        }
        if let Some(r) = &b.result {
            self.expr(f, r, frames);
        }
        frames.pop();
    }

    fn resolve(&self, name: &str, frames: &[Frame]) -> Option<Target> {
        for fr in frames.iter().rev() {
            if let Some(&d) = fr.get(name) {
                return Some(Target::Def(d));
            }
        }
        if let Some(&d) = self.globals.get(name) {
            return Some(Target::Def(d));
        }
        if let Some(&d) = self.axes.get(name) {
            return Some(Target::Def(d));
        }
        if let Some(op) = crate::prim::find(name) {
            return Some(Target::Op(op.name));
        }
        crate::prim::docs::LIBRARY
            .iter()
            .copied()
            .find(|n| *n == name)
            .or_else(|| crate::vocab::word(name).map(|(_, e)| e.name()))
            .map(Target::Library)
    }

    /// Point each `embed.w` member at its declaration in the sublayer's layer.
    fn resolve_members(&mut self) {
        for (f, span, root, path) in std::mem::take(&mut self.members) {
            let mut at = root;
            let mut found = true;
            for seg in &path {
                let layer = self
                    .sub_layers
                    .get(&at)
                    .and_then(|l| self.globals.get(l))
                    .copied();
                let next = layer.and_then(|l| {
                    self.ix
                        .defs
                        .iter()
                        .position(|d| d.container == Some(l) && &d.name == seg)
                });
                match next {
                    Some(n) => at = n,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            if found {
                self.occ(f, span, Target::Def(at));
            }
        }
    }

    fn name(&mut self, f: usize, name: &str, span: crate::source::Span, frames: &[Frame]) {
        if let Some(t) = self.resolve(name, frames) {
            self.occ(f, span, t);
        }
    }

    fn expr(&mut self, f: usize, e: &Expr, frames: &[Frame]) {
        match &e.kind {
            ExprKind::Float(_) | ExprKind::Int(_) | ExprKind::Str(_) => {}
            ExprKind::Name(n) => self.name(f, n, e.span, frames),
            ExprKind::Neg(x) => self.expr(f, x, frames),
            ExprKind::Member(x, field) => {
                self.expr(f, x, frames);
                // `embed.w`, `lm.embed.w`: the path from a sublayer of this layer.
                let mut path = vec![field.name.clone()];
                let mut cur: &Expr = x;
                while let ExprKind::Member(b, seg) = &cur.kind {
                    path.push(seg.name.clone());
                    cur = b;
                }
                if let ExprKind::Name(root) = &cur.kind {
                    if let Some(Target::Def(d)) = self.resolve(root, frames) {
                        path.reverse();
                        self.members.push((f, field.span, d, path));
                    }
                }
            }
            ExprKind::Bin(a, _, b) => {
                self.expr(f, a, frames);
                self.expr(f, b, frames);
            }
            ExprKind::Call(c, args) => {
                self.expr(f, c, frames);
                self.args(f, args, frames);
            }
            ExprKind::Index(x, slices) => {
                self.expr(f, x, frames);
                for s in slices {
                    match s {
                        Slice::Range(a, b, _) => {
                            for d in [a, b].into_iter().flatten() {
                                self.dim(f, d, frames);
                            }
                        }
                        Slice::At(d) => self.dim(f, d, frames),
                    }
                }
            }
            ExprKind::List(items) => {
                for it in items {
                    match it {
                        ListItem::Dim(d) => self.dimspec(f, d, frames),
                        ListItem::Expr(x) => self.expr(f, x, frames),
                    }
                }
            }
            ExprKind::Local(axes, block) => {
                for a in axes {
                    self.axis(f, a);
                }
                let mut inner = frames.to_vec();
                self.block(f, block, &mut inner, None);
            }
        }
    }

    fn args(&mut self, f: usize, args: &[Arg], frames: &[Frame]) {
        for a in args {
            match a {
                Arg::Pos(e) => self.expr(f, e, frames),
                Arg::Named(_, v) => self.optvalue(f, v, frames),
                Arg::Arrow(x, y, _) => {
                    self.dimarg(f, x, frames);
                    self.dimarg(f, y, frames);
                }
            }
        }
    }

    fn optvalue(&mut self, f: usize, v: &OptValue, frames: &[Frame]) {
        match v {
            OptValue::Expr(e) => self.expr(f, e, frames),
            OptValue::Options(o) => self.options(f, o, frames),
        }
    }

    fn options(&mut self, f: usize, o: &Options, frames: &[Frame]) {
        for (_, v) in &o.entries {
            self.optvalue(f, v, frames);
        }
    }

    fn dimarg(&mut self, f: usize, d: &DimArg, frames: &[Frame]) {
        self.dim(f, &d.size, frames);
        for a in d.axes.iter().flatten() {
            self.axis(f, a);
        }
    }

    fn dimspec(&mut self, f: usize, d: &DimSpec, frames: &[Frame]) {
        if let DimSpec::Dim { size, axes, .. } = d {
            self.dim(f, size, frames);
            for a in axes.iter().flatten() {
                self.axis(f, a);
            }
        }
    }

    fn dim(&mut self, f: usize, d: &DimExpr, frames: &[Frame]) {
        match d {
            DimExpr::Int(..) => {}
            DimExpr::Name(n) => {
                // Sizes name constants and layer parameters (symbolic sizes
                // like `B` are declared by their first use: not indexed).
                let t = frames
                    .iter()
                    .rev()
                    .find_map(|fr| fr.get(&n.name))
                    .or_else(|| self.globals.get(&n.name));
                if let Some(&t) = t {
                    self.occ(f, n.span, Target::Def(t));
                }
            }
            DimExpr::Bin(a, _, b, _) => {
                self.dim(f, a, frames);
                self.dim(f, b, frames);
            }
        }
    }

    fn ty(&mut self, f: usize, t: &TypeExpr, frames: &[Frame]) {
        for d in &t.dims {
            self.dimspec(f, d, frames);
        }
        for (_, a) in &t.pending {
            self.axis(f, a);
        }
    }
}
