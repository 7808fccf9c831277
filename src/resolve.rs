//! Stage 3 (resolve): load imports, collect every declaration into one namespace, evaluate
//! constants and meshes. Produces a [`Program`] for the checker.

use crate::ast::{self, DimExpr, DimOp, Item};
use crate::diag::{did_you_mean, Diagnostic, Problem};
use crate::files::Files;
use crate::source::{FileId, SourceFile, SourceMap, Span};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Stdlib modules ship inside the binary.
pub const STDLIB: &[(&str, &str)] = &[("nn", include_str!("../stdlib/nn.shard"))];

/// The most SparseCores a device may declare (real chips have 2 or 4).
/// The most devices a mesh may have (2^24): every size computed from a mesh
/// (device counts, per-device shards) stays far from overflowing.
pub const MAX_DEVICES: i64 = 1 << 24;
/// Imports nest at most this many files deep (loading recurses along them).
pub const MAX_IMPORT_DEPTH: usize = 64;
pub const MAX_SPARSECORES: i64 = 1 << 16;

#[derive(Clone, Debug)]
pub struct Mesh {
    pub name: String,
    pub axes: Vec<(String, i64, Span)>,
    pub kind: String,
    pub sparsecores: i64,
    pub span: Span,
    pub name_span: Span,
}

impl Mesh {
    pub fn axis(&self, name: &str) -> Option<&(String, i64, Span)> {
        self.axes.iter().find(|a| a.0 == name)
    }
    pub fn size(&self, name: &str) -> i64 {
        self.axis(name).map_or(1, |a| a.1)
    }
    pub fn devices(&self) -> i64 {
        self.axes
            .iter()
            .fold(1i64, |acc, a| acc.saturating_mul(a.1))
    }
    pub fn axis_names(&self) -> Vec<String> {
        self.axes.iter().map(|a| a.0.clone()).collect()
    }
}

#[derive(Debug, Default)]
pub struct Program {
    pub consts: HashMap<String, (i64, Span)>,
    pub meshes: Vec<Mesh>,
    pub layers: HashMap<String, Arc<ast::LayerDecl>>,
    pub layer_order: Vec<String>,
    pub tables: Vec<ast::TableDecl>,
    pub features: Vec<ast::FeatureDecl>,
    pub trains: Vec<ast::TrainDecl>,
    pub strict: Option<Span>,
    /// The file the user asked for.
    pub root: FileId,
    /// The syntax tree of every file that parsed (what the editor's index
    /// walks, so that it does not parse them again).
    pub syntax: Vec<(FileId, Arc<ast::File>)>,
}

impl Program {
    pub fn mesh(&self, name: &str) -> Option<&Mesh> {
        self.meshes.iter().find(|m| m.name == name)
    }
}

pub struct Loader<'a> {
    pub sources: &'a mut SourceMap,
    pub diags: &'a mut Vec<Diagnostic>,
    /// Where imports are read from.
    fs: &'a dyn Files,
    /// Real files read (for `watch`).
    pub read: Vec<PathBuf>,
    files: Vec<(FileId, Arc<ast::File>)>,
    stack: Vec<(FileId, String)>,
    done: HashMap<String, FileId>,
    /// Each import that loaded (or found loaded) a file: the importing file,
    /// the import's span and the file it names.
    edges: Vec<(FileId, Span, FileId)>,
}

impl<'a> Loader<'a> {
    pub fn new(
        sources: &'a mut SourceMap,
        diags: &'a mut Vec<Diagnostic>,
        fs: &'a dyn Files,
    ) -> Self {
        Loader {
            sources,
            diags,
            fs,
            read: vec![],
            files: vec![],
            stack: vec![],
            done: HashMap::new(),
            edges: vec![],
        }
    }

    /// Parse `id` and, depth first, everything it imports.
    pub fn load(&mut self, id: FileId) {
        let path = &self.sources.get(id).path;
        let key = self.fs.canonical(path).display().to_string();
        self.done.insert(key.clone(), id);
        self.stack.push((id, key));
        let text = self.sources.get(id).text.clone();
        match crate::reparse::parse(id, &text) {
            Err(p) => self.diags.push(p.diagnostic()),
            Ok(file) => {
                for item in &file.items {
                    if let Item::Import(imp) = item {
                        self.import(id, imp);
                    }
                }
                self.files.push((id, Arc::new(file)));
            }
        }
        self.stack.pop();
    }

    fn import(&mut self, from: FileId, imp: &ast::Import) {
        if self.stack.len() >= MAX_IMPORT_DEPTH {
            self.diags.push(
                Problem::TooDeep {
                    span: imp.span,
                    what: "imports",
                    depth: self.stack.len() + 1,
                    limit: MAX_IMPORT_DEPTH,
                }
                .diagnostic(),
            );
            return;
        }
        let (path, name, text) = if imp.is_std {
            match STDLIB.iter().find(|(n, _)| *n == imp.target) {
                Some((n, t)) => (
                    PathBuf::from(format!("<std>/{n}.shard")),
                    format!("<std>/{n}.shard"),
                    Ok(t.to_string()),
                ),
                None => {
                    let known: Vec<String> = STDLIB.iter().map(|(n, _)| n.to_string()).collect();
                    let reason = match did_you_mean(&imp.target, known.iter().map(|s| s.as_str())) {
                        Some(s) => {
                            format!("no stdlib module `{}`; did you mean `{s}`?", imp.target)
                        }
                        None => format!("no stdlib module `{}`", imp.target),
                    };
                    self.diags.push(
                        Problem::ImportNotFound {
                            span: imp.span,
                            target: imp.target.clone(),
                            tried: format!("stdlib modules: {}", known.join(", ")),
                            reason,
                        }
                        .diagnostic(),
                    );
                    return;
                }
            }
        } else {
            let base = self
                .sources
                .get(from)
                .path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            let p = base.join(&imp.target);
            // Only `.shard` files: a diagnostic quotes the file it is about, and
            // nothing else a model names may be echoed (`import "/etc/shadow"`).
            let text = if p.extension().is_some_and(|e| e == "shard") {
                self.fs.read_text(&p).map_err(|e| e.to_string())
            } else {
                Err("imports name `.shard` files; this file was not read".to_string())
            };
            let name = p.display().to_string();
            (p, name, text)
        };
        // Compare files, not spellings: `a/../b.shard` is `b.shard`.
        let key = self.fs.canonical(&path).display().to_string();
        if let Some(pos) = self.stack.iter().position(|(_, k)| *k == key) {
            let mut chain: Vec<String> = self.stack[pos..]
                .iter()
                .map(|(id, _)| self.sources.get(*id).name.clone())
                .collect();
            chain.push(self.sources.get(self.stack[pos].0).name.clone());
            // Recorded, so that no import on the cycle is called unused.
            self.edges.push((from, imp.span, self.stack[pos].0));
            self.diags.push(
                Problem::RecursiveImport {
                    span: imp.span,
                    chain,
                }
                .diagnostic(),
            );
            return;
        }
        if let Some(id) = self.done.get(&key) {
            self.edges.push((from, imp.span, *id));
            return;
        }
        match text {
            Err(e) => self.diags.push(
                Problem::ImportNotFound {
                    span: imp.span,
                    target: imp.target.clone(),
                    tried: format!("`{}`", path.display()),
                    reason: e,
                }
                .diagnostic(),
            ),
            Ok(text) => {
                if !imp.is_std {
                    self.read.push(path.clone());
                }
                let id = self.sources.add(SourceFile::new(path, name, text));
                self.edges.push((from, imp.span, id));
                self.load(id);
            }
        }
    }

    /// W0007: the root file's imports that bring nothing a file outside
    /// them names. An import brings its file and, transitively, what that
    /// file imports; it is used when any declaration among them (a constant,
    /// mesh, layer, table or feature) is named as a word in any other file
    /// of the compilation. Words are compared, not resolutions, so a local
    /// name spelled like a declaration keeps an import (never the reverse).
    fn unused_imports(&self, root: FileId) -> Vec<Diagnostic> {
        let declared = |id: FileId| -> Vec<&str> {
            let Some((_, file)) = self.files.iter().find(|(f, _)| *f == id) else {
                return Vec::new();
            };
            file.items
                .iter()
                .filter_map(|item| match item {
                    Item::Const(c) => Some(c.name.name.as_str()),
                    Item::Mesh(m) => Some(m.name.name.as_str()),
                    Item::Layer(l) => Some(l.name.name.as_str()),
                    Item::Table(t) => Some(t.name.name.as_str()),
                    Item::Feature(f) => Some(f.name.name.as_str()),
                    Item::Import(_) | Item::Pragma(_) | Item::Train(_) => None,
                })
                .collect()
        };
        let mut out = Vec::new();
        for (_, span, target) in self.edges.iter().filter(|(from, _, _)| *from == root) {
            // The files this import brings.
            let mut brought: Vec<FileId> = vec![*target];
            let mut i = 0;
            while let Some(f) = brought.get(i).copied() {
                for (_, _, to) in self.edges.iter().filter(|(from, _, _)| *from == f) {
                    if !brought.contains(to) {
                        brought.push(*to);
                    }
                }
                i += 1;
            }
            if brought.contains(&root) {
                continue;
            }
            let names: HashSet<&str> = brought.iter().flat_map(|f| declared(*f)).collect();
            let used = self
                .files
                .iter()
                .filter(|(f, _)| !brought.contains(f))
                .any(|(f, _)| words(&self.sources.get(*f).text).any(|w| names.contains(w)));
            if !used {
                out.push(
                    Problem::UnusedImport {
                        span: *span,
                        target: self.sources.get(*target).name.clone(),
                    }
                    .diagnostic(),
                );
            }
        }
        out
    }

    pub fn resolve(self, root: FileId) -> Program {
        let mut prog = Program {
            root,
            ..Program::default()
        };
        let unused = self.unused_imports(root);
        let diags = self.diags;
        diags.extend(unused);
        let mut names: HashMap<String, Span> = HashMap::new();
        let mut define = |name: &ast::Ident, diags: &mut Vec<Diagnostic>| -> bool {
            if let Some(first) = names.get(&name.name) {
                diags.push(
                    Problem::Duplicate {
                        span: name.span,
                        name: name.name.clone(),
                        first: *first,
                    }
                    .diagnostic(),
                );
                false
            } else {
                names.insert(name.name.clone(), name.span);
                true
            }
        };
        let mut const_decls = Vec::new();
        for (_, file) in &self.files {
            for item in &file.items {
                match item {
                    Item::Import(_) => {}
                    Item::Pragma(p) => {
                        if p.name == "strict" {
                            // Strictness is a property of the file the user checks.
                            if p.span.file == root {
                                prog.strict = Some(p.span);
                            }
                        } else {
                            diags.push(
                                Problem::UnknownPragma {
                                    span: p.span,
                                    name: p.name.clone(),
                                }
                                .diagnostic(),
                            );
                        }
                    }
                    Item::Const(c) => {
                        if define(&c.name, diags) {
                            const_decls.push(c.clone());
                        }
                    }
                    Item::Mesh(m) => {
                        if define(&m.name, diags) {
                            const_decls.push(ast::ConstDecl {
                                name: m.name.clone(),
                                value: DimExpr::Int(0, m.span),
                                span: Span::default(),
                            });
                        }
                    }
                    Item::Layer(l) => {
                        if define(&l.name, diags) {
                            prog.layer_order.push(l.name.name.clone());
                            prog.layers.insert(l.name.name.clone(), Arc::new(l.clone()));
                        }
                    }
                    Item::Table(t) => {
                        if define(&t.name, diags) {
                            prog.tables.push(t.clone());
                        }
                    }
                    Item::Feature(f) => {
                        if define(&f.name, diags) {
                            prog.features.push(f.clone());
                        }
                    }
                    Item::Train(t) => prog.trains.push(t.clone()),
                }
            }
        }
        // Constants may refer to constants declared later; evaluate on demand.
        let real_consts: BTreeMap<String, ast::ConstDecl> = const_decls
            .into_iter()
            .filter(|c| c.span != Span::default())
            .map(|c| (c.name.name.clone(), c))
            .collect();
        eval_consts(&real_consts, &mut prog.consts, diags);
        for (_, file) in &self.files {
            for item in &file.items {
                if let Item::Mesh(m) = item {
                    if let Some(mesh) = eval_mesh(m, &prog.consts, diags) {
                        if prog.mesh(&mesh.name).is_none() {
                            prog.meshes.push(mesh);
                        }
                    }
                }
            }
        }
        prog.syntax = self.files;
        prog
    }
}

/// The words of a source text that could name a declaration: identifiers
/// outside comments and strings.
fn words(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() {
            let c = b[i];
            if b[i..].starts_with(b"//") {
                i += b[i..]
                    .iter()
                    .position(|c| *c == b'\n')
                    .unwrap_or(b.len() - i);
            } else if b[i..].starts_with(b"/*") {
                i += b[i + 2..]
                    .windows(2)
                    .position(|w| w == b"*/")
                    .map_or(b.len() - i, |k| k + 4);
            } else if c == b'"' {
                i += 1 + b[i + 1..]
                    .iter()
                    .position(|c| *c == b'"' || *c == b'\n')
                    .map_or(b.len() - i - 1, |k| k + 1);
            } else if c.is_ascii_alphabetic() || c == b'_' {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                return text.get(start..i);
            } else if c.is_ascii_digit() {
                // A number's digits and suffix (`1e3`, `0x1f`) name nothing.
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.')
                {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
        None
    })
}

/// Evaluate every constant, each after the constants it names (a depth-first
/// walk with an explicit stack: a chain of thousands of constants is fine).
fn eval_consts(
    decls: &BTreeMap<String, ast::ConstDecl>,
    out: &mut HashMap<String, (i64, Span)>,
    diags: &mut Vec<Diagnostic>,
) {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        /// On the current path: its dependencies are being evaluated.
        Open,
        /// Evaluated, or failed (reported).
        Done,
    }
    let mut mark: HashMap<&str, Mark> = HashMap::new();
    for root in decls.keys() {
        let mut stack: Vec<(&str, bool)> = vec![(root.as_str(), false)];
        while let Some((name, expanded)) = stack.pop() {
            let Some(decl) = decls.get(name) else {
                continue;
            };
            if expanded {
                mark.insert(name, Mark::Done);
                let v = eval_int(&decl.value, &mut |n, span| {
                    if let Some((v, _)) = out.get(n) {
                        Ok(*v)
                    } else if decls.contains_key(n) {
                        Err(()) // failed, and said so
                    } else {
                        let sug = did_you_mean(n, decls.keys().map(|s| s.as_str()));
                        diags.push(
                            Problem::UnknownName {
                                span,
                                name: n.to_string(),
                                what: "constant",
                                suggestion: sug,
                            }
                            .diagnostic(),
                        );
                        Err(())
                    }
                });
                match v {
                    Ok(v) => {
                        out.insert(name.to_string(), (v, decl.name.span));
                    }
                    Err(Some(p)) => diags.push(p.diagnostic()),
                    Err(None) => {}
                }
                continue;
            }
            match mark.get(name) {
                Some(Mark::Done) => continue,
                Some(Mark::Open) => {
                    diags.push(
                        Problem::BadDim {
                            span: decl.value.span(),
                            expr: name.to_string(),
                            reason: format!("`{name}` is defined in terms of itself"),
                        }
                        .diagnostic(),
                    );
                    // Its own evaluation then fails on the missing value.
                    continue;
                }
                None => {}
            }
            mark.insert(name, Mark::Open);
            stack.push((name, true));
            let mut names = Vec::new();
            dim_names(&decl.value, &mut names);
            for n in names.into_iter().rev() {
                if let Some((k, _)) = decls.get_key_value(n) {
                    if mark.get(k.as_str()) != Some(&Mark::Done) {
                        stack.push((k.as_str(), false));
                    }
                }
            }
        }
    }
}

/// The names a size expression refers to, in order.
fn dim_names<'e>(e: &'e DimExpr, out: &mut Vec<&'e str>) {
    match e {
        DimExpr::Int(..) => {}
        DimExpr::Name(i) => out.push(&i.name),
        DimExpr::Bin(a, _, b, _) => {
            dim_names(a, out);
            dim_names(b, out);
        }
    }
}

/// Evaluate an integer size expression. `Err(None)` means the lookup already reported.
pub fn eval_int(
    e: &DimExpr,
    lookup: &mut dyn FnMut(&str, Span) -> Result<i64, ()>,
) -> Result<i64, Option<Box<Problem>>> {
    match e {
        DimExpr::Int(v, _) => Ok(*v),
        DimExpr::Name(i) => lookup(&i.name, i.span).map_err(|_| None),
        DimExpr::Bin(a, op, b, span) => {
            let x = eval_int(a, lookup)?;
            let y = eval_int(b, lookup)?;
            let bad = |reason: String| {
                Some(Box::new(Problem::BadDim {
                    span: *span,
                    expr: format!("{x} {} {y}", op_str(*op)),
                    reason,
                }))
            };
            match op {
                DimOp::Add => x.checked_add(y).ok_or_else(|| bad("overflows".into())),
                DimOp::Sub => x.checked_sub(y).ok_or_else(|| bad("overflows".into())),
                DimOp::Mul => x.checked_mul(y).ok_or_else(|| bad("overflows".into())),
                DimOp::Div => {
                    if y == 0 {
                        Err(bad("division by zero".into()))
                    } else if x.checked_rem(y) != Some(0) {
                        Err(bad(format!("{x} / {y} is not an integer")))
                    } else {
                        x.checked_div(y).ok_or_else(|| bad("overflows".into()))
                    }
                }
            }
        }
    }
}

pub fn op_str(op: DimOp) -> &'static str {
    match op {
        DimOp::Add => "+",
        DimOp::Sub => "-",
        DimOp::Mul => "*",
        DimOp::Div => "/",
    }
}

fn eval_mesh(
    m: &ast::MeshDecl,
    consts: &HashMap<String, (i64, Span)>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Mesh> {
    let mut axes: Vec<(String, i64, Span)> = Vec::new();
    let mut ok = true;
    if m.axes.is_empty() {
        diags.push(
            Problem::BadMesh {
                span: m.name.span,
                message: format!("mesh `{}` has no axes", m.name.name),
                help: Some(format!(
                    "give it at least one axis: `mesh {}(data: 8)`",
                    m.name.name
                )),
            }
            .diagnostic(),
        );
        return None;
    }
    for (name, size) in &m.axes {
        if axes.iter().any(|a| a.0 == name.name) {
            diags.push(
                Problem::BadMesh {
                    span: name.span,
                    message: format!("mesh axis `{}` is declared twice", name.name),
                    help: Some("give each axis of a mesh a distinct name".into()),
                }
                .diagnostic(),
            );
            ok = false;
            continue;
        }
        let v = eval_int(size, &mut |n, span| match consts.get(n) {
            Some((v, _)) => Ok(*v),
            None => {
                diags.push(
                    Problem::UnknownName {
                        span,
                        name: n.to_string(),
                        what: "constant",
                        suggestion: did_you_mean(n, consts.keys().map(|s| s.as_str())),
                    }
                    .diagnostic(),
                );
                Err(())
            }
        });
        match v {
            Ok(v) if v >= 1 => axes.push((name.name.clone(), v, size.span())),
            Ok(v) => {
                diags.push(
                    Problem::BadMesh {
                        span: size.span(),
                        message: format!("mesh axis `{}` has size {v}", name.name),
                        help: Some("axis sizes are at least 1".into()),
                    }
                    .diagnostic(),
                );
                ok = false;
            }
            Err(p) => {
                if let Some(p) = p {
                    diags.push(p.diagnostic());
                }
                ok = false;
            }
        }
    }
    let mut kind = "virtual".to_string();
    let mut sparsecores = 1;
    if let Some(opts) = &m.options {
        for (k, v) in &opts.entries {
            let expr = match v {
                ast::OptValue::Expr(e) => Some(e),
                _ => None,
            };
            match (k.name.as_str(), expr.map(|e| &e.kind)) {
                ("kind", Some(ast::ExprKind::Name(n)))
                    if ["virtual", "cuda", "mpi"].contains(&n.as_str()) =>
                {
                    kind = n.clone()
                }
                ("kind", _) => {
                    diags.push(
                        Problem::BadMesh {
                            span: v.span(),
                            message: "unknown mesh kind".into(),
                            help: Some("mesh kinds are `virtual` (devices in this process), `cuda` and `mpi`".into()),
                        }
                        .diagnostic(),
                    );
                    ok = false;
                }
                // Bounded so that devices × SparseCores partitions stay countable.
                ("sparsecores", Some(ast::ExprKind::Int(n)))
                    if (1..=MAX_SPARSECORES).contains(n) =>
                {
                    sparsecores = *n
                }
                ("sparsecores", _) => {
                    diags.push(
                        Problem::BadMesh {
                            span: v.span(),
                            message: format!(
                                "`sparsecores` must be an integer from 1 to {MAX_SPARSECORES}"
                            ),
                            help: Some(
                                "the number of SparseCores per device, e.g. `sparsecores: 4`"
                                    .into(),
                            ),
                        }
                        .diagnostic(),
                    );
                    ok = false;
                }
                _ => {
                    diags.push(
                        Problem::BadMesh {
                            span: k.span,
                            message: format!("unknown mesh option `{}`", k.name),
                            help: Some("mesh options are `kind` and `sparsecores`".into()),
                        }
                        .diagnostic(),
                    );
                    ok = false;
                }
            }
        }
    }
    let devices = axes.iter().fold(1i64, |acc, a| acc.saturating_mul(a.1));
    if ok && devices > MAX_DEVICES {
        diags.push(
            Problem::BadMesh {
                span: m.name.span,
                message: format!(
                    "mesh `{}` has {devices} devices, more than the {MAX_DEVICES} shardc plans for",
                    m.name.name
                ),
                help: Some("the largest machines today have tens of thousands of devices; check the axis sizes".into()),
            }
            .diagnostic(),
        );
        ok = false;
    }
    ok.then(|| Mesh {
        name: m.name.name.clone(),
        axes,
        kind,
        sparsecores,
        span: m.span,
        name_span: m.name.span,
    })
}
