//! Syntax tree produced by `parse`. Plain data; every node carries its span.

use crate::source::Span;

#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct File {
    pub items: Vec<Item>,
}

#[derive(Clone, Debug)]
pub enum Item {
    Import(Import),
    Pragma(Ident),
    Const(ConstDecl),
    Mesh(MeshDecl),
    Layer(LayerDecl),
    Table(TableDecl),
    Feature(FeatureDecl),
    Train(TrainDecl),
}

#[derive(Clone, Debug)]
pub struct Import {
    /// `import nn` names a stdlib module; `import "x.shard"` a file relative to the importer.
    pub target: String,
    pub is_std: bool,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct ConstDecl {
    pub name: Ident,
    pub value: DimExpr,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct MeshDecl {
    pub name: Ident,
    pub axes: Vec<(Ident, DimExpr)>,
    pub options: Option<Options>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct LayerDecl {
    pub name: Ident,
    pub params: Vec<Ident>,
    pub is_model: bool,
    pub members: Vec<Member>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum Member {
    Weight {
        name: Ident,
        ty: TypeExpr,
        init: Option<Expr>,
        span: Span,
    },
    Sub {
        name: Ident,
        value: Expr,
        span: Span,
    },
    Directive {
        name: Ident,
        args: Vec<Arg>,
        span: Span,
    },
    Fn(FnDecl),
}

#[derive(Clone, Debug)]
pub struct FnDecl {
    pub name: Ident,
    pub params: Vec<(Ident, TypeExpr)>,
    pub ret: Option<TypeExpr>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Block {
    pub lets: Vec<Let>,
    pub result: Option<Box<Expr>>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Let {
    pub name: Ident,
    /// `let (a, b, c) = ...`: the names after the first (`b`, `c`), one per
    /// further result of a multi-result op; empty for `let a = ...`.
    pub rest: Vec<Ident>,
    pub ty: Option<TypeExpr>,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct TableDecl {
    pub name: Ident,
    pub options: Options,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct FeatureDecl {
    pub name: Ident,
    pub ty: TypeExpr,
    pub table: Ident,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct TrainDecl {
    pub model: Ident,
    pub mesh: Ident,
    pub options: Options,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub entries: Vec<(Ident, OptValue)>,
    pub span: Span,
}

impl Options {
    pub fn get(&self, key: &str) -> Option<&OptValue> {
        self.entries
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(_, v)| v)
    }
    /// The option `key` when it is an expression (not a block).
    pub fn expr(&self, key: &str) -> Option<&Expr> {
        match self.get(key) {
            Some(OptValue::Expr(e)) => Some(e),
            _ => None,
        }
    }
}

impl Expr {
    /// `name` or `name(k: v, ...)`: the name and the named expression arguments.
    pub fn as_call(&self) -> Option<(&str, Vec<(&str, &Expr)>)> {
        match &self.kind {
            ExprKind::Name(n) => Some((n, vec![])),
            ExprKind::Call(c, args) => match &c.kind {
                ExprKind::Name(n) => Some((
                    n,
                    args.iter()
                        .filter_map(|a| match a {
                            Arg::Named(k, OptValue::Expr(v)) => Some((k.name.as_str(), v)),
                            _ => None,
                        })
                        .collect(),
                )),
                _ => None,
            },
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub enum OptValue {
    Expr(Expr),
    Options(Options),
}

impl OptValue {
    pub fn span(&self) -> Span {
        match self {
            OptValue::Expr(e) => e.span,
            OptValue::Options(o) => o.span,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I32,
    I64,
    Bool,
}

impl DType {
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "f64" => DType::F64,
            "i32" => DType::I32,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

#[derive(Clone, Debug)]
pub struct TypeExpr {
    pub dtype: DType,
    pub dtype_span: Span,
    pub dims: Vec<DimSpec>,
    pub pending: Vec<(ReduceOp, Ident)>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum DimSpec {
    Ellipsis(Span),
    Dim {
        size: DimExpr,
        /// `None`: no annotation; `Some(vec![])`: explicitly replicated (`@_`).
        axes: Option<Vec<Ident>>,
        span: Span,
    },
}

impl DimSpec {
    pub fn span(&self) -> Span {
        match self {
            DimSpec::Ellipsis(s) => *s,
            DimSpec::Dim { span, .. } => *span,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Debug)]
pub enum DimExpr {
    Int(i64, Span),
    Name(Ident),
    Bin(Box<DimExpr>, DimOp, Box<DimExpr>, Span),
}

impl DimExpr {
    pub fn span(&self) -> Span {
        match self {
            DimExpr::Int(_, s) => *s,
            DimExpr::Name(i) => i.span,
            DimExpr::Bin(_, _, _, s) => *s,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    MatMul,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::MatMul => "@",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Float(f64),
    Int(i64),
    Str(String),
    Name(String),
    Neg(Box<Expr>),
    Bin(Box<Expr>, BinOp, Box<Expr>),
    Call(Box<Expr>, Vec<Arg>),
    Index(Box<Expr>, Vec<Slice>),
    /// `embed.w`: a member (weight) of a sublayer, by path.
    Member(Box<Expr>, Ident),
    List(Vec<ListItem>),
    Local(Vec<Ident>, Block),
}

#[derive(Clone, Debug)]
pub enum ListItem {
    Dim(DimSpec),
    Expr(Expr),
}

impl ListItem {
    /// A bare name (`[accuracy, auc]`, `[h, y]`: the parser reads a list of
    /// names as dims), with its span.
    pub fn as_name(&self) -> Option<(&str, Span)> {
        match self {
            ListItem::Expr(Expr {
                kind: ExprKind::Name(n),
                span,
            }) => Some((n.as_str(), *span)),
            ListItem::Dim(DimSpec::Dim {
                size: DimExpr::Name(i),
                axes: None,
                ..
            }) => Some((i.name.as_str(), i.span)),
            _ => None,
        }
    }

    pub fn span(&self) -> Span {
        match self {
            ListItem::Expr(e) => e.span,
            ListItem::Dim(d) => d.span(),
        }
    }
}

#[derive(Clone, Debug)]
pub enum Slice {
    Range(Option<DimExpr>, Option<DimExpr>, Span),
    At(DimExpr),
}

#[derive(Clone, Debug)]
pub enum Arg {
    Pos(Expr),
    Named(Ident, OptValue),
    /// `IN -> OUT` in a layer instantiation, e.g. `Dense(D -> 4*D@mp)`.
    Arrow(DimArg, DimArg, Span),
}

impl Arg {
    pub fn span(&self) -> Span {
        match self {
            Arg::Pos(e) => e.span,
            Arg::Named(k, v) => k.span.to(v.span()),
            Arg::Arrow(_, _, s) => *s,
        }
    }
}

#[derive(Clone, Debug)]
pub struct DimArg {
    pub size: DimExpr,
    pub axes: Option<Vec<Ident>>,
    pub span: Span,
}
