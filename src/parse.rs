//! Stage 1 (syntax): source text → AST, with the pest grammar in `grammar/shard.pest`.

use crate::ast::*;
use crate::diag::Problem;
use crate::source::{FileId, Span};
use pest::iterators::Pair;
use pest::Parser as _;

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/shard.pest"]
struct ShardParser;

type P<'a> = Pair<'a, Rule>;
type PResult<T> = Result<T, Box<Problem>>;

/// Parse one file. On a syntax error returns the problem; the file is then skipped
/// by later stages (one syntax error per file, like most compilers with PEG parsers).
pub fn parse(file: FileId, text: &str) -> Result<File, Box<Problem>> {
    // pest's call limit guards against runaway backtracking; honest input needs
    // a bounded number of calls per byte (a long comment is many calls).
    pest::set_call_limit(std::num::NonZeroUsize::new(
        5_000_000usize.saturating_add(text.len().saturating_mul(64)),
    ));
    // Deeply nested input would overflow the stack in pest's recursive descent;
    // a huge name would be copied into every type and diagnostic that holds it.
    match prescan(text) {
        Some(Limit::Nesting { depth, at }) => {
            return Err(Box::new(Problem::TooDeep {
                span: Span::new(file, at, at + 1),
                what: "brackets",
                depth,
                limit: MAX_NESTING,
            }))
        }
        Some(Limit::Name { len, at }) => {
            return Err(Box::new(Problem::NameTooLong {
                span: Span::new(file, at, at + len),
                len,
                limit: MAX_NAME,
            }))
        }
        None => {}
    }
    let mut pairs =
        ShardParser::parse(Rule::file, text).map_err(|e| Box::new(syntax_error(file, text, e)))?;
    let cx = Cx {
        file,
        path: std::cell::Cell::new(0),
    };
    let mut items = Vec::new();
    let Some(root) = pairs.next() else {
        return Ok(File { items });
    };
    for p in root.into_inner() {
        if p.as_rule() == Rule::EOI {
            continue;
        }
        items.push(cx.item(p)?);
    }
    Ok(File { items })
}

/// Brackets nested deeper than this are refused before pest sees them.
pub const MAX_NESTING: usize = 200;
/// Operators, signs, calls and indexings chained along one path of the syntax
/// tree (`-x`, `a + b + …`, `f()()`, `2 * 3 * …`, across brackets): the depth
/// of the tree every later stage walks, so it is bounded here, where it is cheap.
pub const MAX_CHAIN: usize = 1_000;

/// The longest name (identifier) a file may use, in bytes. Names are copied into
/// types, the index and diagnostics wherever they are used; bounding them keeps
/// the front end's memory a small multiple of the source's.
pub const MAX_NAME: usize = 1_024;

/// A limit the source passes before pest sees it.
#[derive(Debug, PartialEq, Eq)]
enum Limit {
    Nesting { depth: usize, at: usize },
    Name { len: usize, at: usize },
}

/// The first place brackets nest past [`MAX_NESTING`] or a name is longer than
/// [`MAX_NAME`] (skipping comments and strings).
fn prescan(text: &str) -> Option<Limit> {
    let b = text.as_bytes();
    let (mut d, mut i) = (0usize, 0usize);
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        match b[i] {
            c if (c.is_ascii_alphabetic() || c == b'_') => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                if i - start > MAX_NAME {
                    return Some(Limit::Name {
                        len: i - start,
                        at: start,
                    });
                }
                continue;
            }
            c if c.is_ascii_digit() => {
                // A number's digits (and a suffix such as `e5`) are not a name.
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 1;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => {
                d += 1;
                if d > MAX_NESTING {
                    return Some(Limit::Nesting { depth: d, at: i });
                }
            }
            b')' | b']' | b'}' => d = d.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

fn syntax_error(file: FileId, text: &str, e: pest::error::Error<Rule>) -> Problem {
    use pest::error::{ErrorVariant, InputLocation};
    let (start, end) = match e.location {
        InputLocation::Pos(p) => (p, p),
        InputLocation::Span((s, e)) => (s, e),
    };
    // Point at the whole offending token, not an empty position.
    let end = if end > start {
        end
    } else {
        let rest = text.get(start.min(text.len())..).unwrap_or("");
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let tok = match rest.chars().next() {
            Some(c) if word(c) => rest
                .char_indices()
                .find(|(_, c)| !word(*c))
                .map_or(rest.len(), |(i, _)| i),
            Some(c) => c.len_utf8(),
            None => 0,
        };
        start + tok
    };
    let found = text
        .get(start..end)
        .filter(|s| !s.is_empty())
        .map_or("end of file".to_string(), |s| format!("`{s}`"));
    let message = match e.variant {
        ErrorVariant::ParsingError { positives, .. } => {
            let mut names: Vec<&str> = positives.iter().filter_map(|r| rule_name(*r)).collect();
            names.sort();
            names.dedup();
            let word = text.get(start..end).unwrap_or("");
            if names.is_empty() {
                format!("unexpected {found}")
            } else if names.contains(&"a name") && KEYWORDS.contains(&word) {
                // `mesh m(data: 2, model: 2)`, as JAX names its axes.
                let instead = if word == "model" { "`mp`" } else { "" };
                let or = if instead.is_empty() { "" } else { " or " };
                format!(
                    "expected {}, found `{word}`, a keyword: name it otherwise ({instead}{or}`{word}_`)",
                    join_or(&names)
                )
            } else {
                format!("expected {}, found {found}", join_or(&names))
            }
        }
        ErrorVariant::CustomError { message } => message,
    };
    Problem::Syntax {
        span: Span::new(file, start, end),
        message,
    }
}

/// The words `grammar/shard.pest`'s `keyword` rule reserves (a test keeps the
/// two the same): never a name.
pub const KEYWORDS: &[&str] = &[
    "import", "pragma", "const", "mesh", "layer", "model", "table", "feature", "train", "fn",
    "let", "init", "local", "on",
];

fn join_or(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [a] => a.to_string(),
        _ => format!(
            "{} or {}",
            names[..names.len() - 1].join(", "),
            names[names.len() - 1]
        ),
    }
}

fn rule_name(r: Rule) -> Option<&'static str> {
    Some(match r {
        Rule::ident | Rule::key => "a name",
        Rule::int | Rule::dim_expr | Rule::dim_atom | Rule::dim_term => "a size",
        Rule::float => "a number",
        Rule::string => "a string",
        Rule::expr | Rule::postfix | Rule::unary => "an expression",
        Rule::tensor_type => "a tensor type like `f32[B, D]`",
        Rule::dtype => "a dtype (f32, bf16, f16, f64, i32, i64, bool)",
        Rule::dim | Rule::ellipsis => "a dimension",
        Rule::axes | Rule::replicated => "a mesh axis",
        Rule::bin_op => "an operator",
        Rule::call_args => "`(`",
        Rule::index => "`[`",
        Rule::member_access => "`.name`",
        Rule::options => "`{`",
        Rule::option => "`name: value`",
        Rule::block => "`{`",
        Rule::let_stmt => "`let`",
        Rule::let_names => "names like `(a, b)`",
        Rule::fn_decl => "`fn`",
        Rule::weight_decl | Rule::sublayer | Rule::directive => "a layer member",
        Rule::import
        | Rule::pragma
        | Rule::const_decl
        | Rule::mesh_decl
        | Rule::layer_decl
        | Rule::model_decl
        | Rule::table_decl
        | Rule::feature_decl
        | Rule::train_decl => "a declaration",
        Rule::EOI => "end of file",
        Rule::pending => "`partial(...)`",
        Rule::arg | Rule::named_arg | Rule::arrow_arg => "an argument",
        Rule::kw_on => "`on`",
        Rule::kw_init => "`init`",
        Rule::dim_add_op | Rule::dim_mul_op => "an operator",
        Rule::reduce_op => "`sum`, `max` or `min`",
        Rule::param_list | Rule::fn_params | Rule::fn_param => "a parameter",
        Rule::axis_list | Rule::axis_def => "an axis like `dp: 4`",
        Rule::list | Rule::list_item => "a list",
        Rule::slice => "a slice",
        _ => return None,
    })
}

struct Cx {
    file: FileId,
    /// Chained operators on the path from the root to the node being built
    /// (see [`MAX_CHAIN`]).
    path: std::cell::Cell<usize>,
}

/// Gives back a chain's length to the path when its subtree is built.
struct Chain<'a> {
    path: &'a std::cell::Cell<usize>,
    n: usize,
}

impl Drop for Chain<'_> {
    fn drop(&mut self) {
        self.path.set(self.path.get().saturating_sub(self.n));
    }
}

impl Cx {
    /// Count `n` chained operators on the current path; refuse past [`MAX_CHAIN`].
    fn chain(&self, n: usize, span: Span) -> PResult<Chain<'_>> {
        let depth = self.path.get().saturating_add(n);
        if depth > MAX_CHAIN {
            return Err(Box::new(Problem::TooDeep {
                span,
                what: "chained operators",
                depth,
                limit: MAX_CHAIN,
            }));
        }
        self.path.set(depth);
        Ok(Chain {
            path: &self.path,
            n,
        })
    }

    fn span(&self, p: &P) -> Span {
        let s = p.as_span();
        Span::new(self.file, s.start(), s.end())
    }

    fn ident(&self, p: P) -> Ident {
        Ident {
            name: p.as_str().to_string(),
            span: self.span(&p),
        }
    }

    fn int(&self, p: &P) -> PResult<i64> {
        let s: String = p.as_str().chars().filter(|c| *c != '_').collect();
        s.parse::<i64>().map_err(|_| {
            Box::new(Problem::BadLiteral {
                span: self.span(p),
                text: p.as_str().to_string(),
            })
        })
    }

    fn item(&self, p: P) -> PResult<Item> {
        let span = self.span(&p);
        let rule = p.as_rule();
        let mut it = p.into_inner();
        Ok(match rule {
            Rule::import => {
                let t = next(&mut it);
                let is_std = t.as_rule() == Rule::ident;
                let s = t.as_str();
                let target = if is_std {
                    s.to_string()
                } else {
                    s[1..s.len() - 1].to_string()
                };
                Item::Import(Import {
                    target,
                    is_std,
                    span,
                })
            }
            Rule::pragma => Item::Pragma(self.ident(next(&mut it))),
            Rule::const_decl => {
                let name = self.ident(next(&mut it));
                let value = self.dim_expr(next(&mut it))?;
                Item::Const(ConstDecl { name, value, span })
            }
            Rule::mesh_decl => {
                let name = self.ident(next(&mut it));
                let mut axes = Vec::new();
                let mut options = None;
                for q in it {
                    match q.as_rule() {
                        Rule::axis_list => {
                            for a in q.into_inner() {
                                let mut ai = a.into_inner();
                                let n = self.ident(next(&mut ai));
                                axes.push((n, self.dim_expr(next(&mut ai))?));
                            }
                        }
                        _ => options = Some(self.options(q)?),
                    }
                }
                Item::Mesh(MeshDecl {
                    name,
                    axes,
                    options,
                    span,
                })
            }
            Rule::layer_decl | Rule::model_decl => {
                let name = self.ident(next(&mut it));
                let mut params = Vec::new();
                let mut members = Vec::new();
                for q in it {
                    match q.as_rule() {
                        Rule::param_list => {
                            params = q.into_inner().map(|i| self.ident(i)).collect()
                        }
                        _ => {
                            for m in q.into_inner() {
                                members.push(self.member(m)?);
                            }
                        }
                    }
                }
                Item::Layer(LayerDecl {
                    name,
                    params,
                    is_model: rule == Rule::model_decl,
                    members,
                    span,
                })
            }
            Rule::table_decl => {
                let name = self.ident(next(&mut it));
                let options = self.options(next(&mut it))?;
                Item::Table(TableDecl {
                    name,
                    options,
                    span,
                })
            }
            Rule::feature_decl => {
                let name = self.ident(next(&mut it));
                let ty = self.ty(next(&mut it))?;
                let table = self.ident(next(&mut it));
                Item::Feature(FeatureDecl {
                    name,
                    ty,
                    table,
                    span,
                })
            }
            Rule::train_decl => {
                let model = self.ident(next(&mut it));
                let _on = next(&mut it);
                let mesh = self.ident(next(&mut it));
                let options = self.options(next(&mut it))?;
                Item::Train(TrainDecl {
                    model,
                    mesh,
                    options,
                    span,
                })
            }
            r => unreachable!("grammar produced {r:?} as an item"),
        })
    }

    fn member(&self, p: P) -> PResult<Member> {
        let span = self.span(&p);
        let rule = p.as_rule();
        let mut it = p.into_inner();
        Ok(match rule {
            Rule::weight_decl => {
                let name = self.ident(next(&mut it));
                let ty = self.ty(next(&mut it))?;
                let init = match it.next() {
                    Some(_kw) => Some(self.expr(next(&mut it))?),
                    None => None,
                };
                Member::Weight {
                    name,
                    ty,
                    init,
                    span,
                }
            }
            Rule::sublayer => {
                let name = self.ident(next(&mut it));
                let value = self.expr(next(&mut it))?;
                Member::Sub { name, value, span }
            }
            Rule::directive => {
                let name = self.ident(next(&mut it));
                let args = self.call_args(next(&mut it))?;
                Member::Directive { name, args, span }
            }
            Rule::fn_decl => {
                let name = self.ident(next(&mut it));
                let mut params = Vec::new();
                let mut ret = None;
                let mut body = None;
                for q in it {
                    match q.as_rule() {
                        Rule::fn_params => {
                            for fp in q.into_inner() {
                                let mut fi = fp.into_inner();
                                let n = self.ident(next(&mut fi));
                                params.push((n, self.ty(next(&mut fi))?));
                            }
                        }
                        Rule::tensor_type => ret = Some(self.ty(q)?),
                        _ => body = Some(self.block(q)?),
                    }
                }
                let body = body.unwrap_or(Block {
                    lets: vec![],
                    result: None,
                    span,
                });
                Member::Fn(FnDecl {
                    name,
                    params,
                    ret,
                    body,
                    span,
                })
            }
            r => unreachable!("grammar produced {r:?} as a member"),
        })
    }

    fn block(&self, p: P) -> PResult<Block> {
        let span = self.span(&p);
        let mut lets = Vec::new();
        let mut result = None;
        for q in p.into_inner() {
            match q.as_rule() {
                Rule::let_stmt => {
                    let lspan = self.span(&q);
                    let mut it = q.into_inner();
                    let first = next(&mut it);
                    let (name, rest) = if first.as_rule() == Rule::let_names {
                        let mut names = first.into_inner();
                        let name = self.ident(next(&mut names));
                        (name, names.map(|n| self.ident(n)).collect())
                    } else {
                        (self.ident(first), Vec::new())
                    };
                    let a = next(&mut it);
                    let (ty, value) = if a.as_rule() == Rule::tensor_type {
                        (Some(self.ty(a)?), self.expr(next(&mut it))?)
                    } else {
                        (None, self.expr(a)?)
                    };
                    lets.push(Let {
                        name,
                        rest,
                        ty,
                        value,
                        span: lspan,
                    });
                }
                _ => result = Some(Box::new(self.expr(q)?)),
            }
        }
        Ok(Block { lets, result, span })
    }

    fn options(&self, p: P) -> PResult<Options> {
        let span = self.span(&p);
        let mut entries = Vec::new();
        for o in p.into_inner() {
            let mut it = o.into_inner();
            let k = self.ident(next(&mut it));
            entries.push((k, self.opt_value(next(&mut it))?));
        }
        Ok(Options { entries, span })
    }

    fn opt_value(&self, p: P) -> PResult<OptValue> {
        Ok(if p.as_rule() == Rule::options {
            OptValue::Options(self.options(p)?)
        } else {
            OptValue::Expr(self.expr(p)?)
        })
    }

    fn ty(&self, p: P) -> PResult<TypeExpr> {
        let span = self.span(&p);
        let mut it = p.into_inner();
        let d = next(&mut it);
        let dtype_span = self.span(&d);
        let dtype = DType::parse(d.as_str()).unwrap_or(DType::F32);
        let mut dims = Vec::new();
        let mut pending = Vec::new();
        for q in it {
            match q.as_rule() {
                Rule::dim => dims.push(self.dim(q)?),
                _ => {
                    for item in q.into_inner() {
                        let mut ii = item.into_inner().peekable();
                        let mut op = ReduceOp::Sum;
                        if ii.peek().map(|x| x.as_rule()) == Some(Rule::reduce_op) {
                            op = match next(&mut ii).as_str() {
                                "max" => ReduceOp::Max,
                                "min" => ReduceOp::Min,
                                _ => ReduceOp::Sum,
                            };
                        }
                        pending.push((op, self.ident(next(&mut ii))));
                    }
                }
            }
        }
        Ok(TypeExpr {
            dtype,
            dtype_span,
            dims,
            pending,
            span,
        })
    }

    fn dim(&self, p: P) -> PResult<DimSpec> {
        let span = self.span(&p);
        let mut it = p.into_inner();
        let first = next(&mut it);
        if first.as_rule() == Rule::ellipsis {
            return Ok(DimSpec::Ellipsis(span));
        }
        let size = self.dim_expr(first)?;
        let axes = it.next().map(|a| self.axes(a));
        Ok(DimSpec::Dim { size, axes, span })
    }

    fn axes(&self, p: P) -> Vec<Ident> {
        p.into_inner()
            .filter(|q| q.as_rule() == Rule::ident)
            .map(|q| self.ident(q))
            .collect()
    }

    fn dim_expr(&self, p: P) -> PResult<DimExpr> {
        match p.as_rule() {
            Rule::dim_expr | Rule::dim_term => {
                let ops = p.clone().into_inner().count() / 2;
                let _chain = self.chain(ops, self.span(&p))?;
                let mut it = p.into_inner();
                let mut lhs = self.dim_expr(next(&mut it))?;
                while let Some(op) = it.next() {
                    let rhs = self.dim_expr(next(&mut it))?;
                    let op = match op.as_str() {
                        "+" => DimOp::Add,
                        "-" => DimOp::Sub,
                        "*" => DimOp::Mul,
                        _ => DimOp::Div,
                    };
                    let span = lhs.span().to(rhs.span());
                    lhs = DimExpr::Bin(Box::new(lhs), op, Box::new(rhs), span);
                }
                Ok(lhs)
            }
            Rule::dim_atom => {
                let q = next(&mut p.into_inner());
                match q.as_rule() {
                    Rule::int => Ok(DimExpr::Int(self.int(&q)?, self.span(&q))),
                    Rule::ident => Ok(DimExpr::Name(self.ident(q))),
                    _ => self.dim_expr(q),
                }
            }
            r => unreachable!("grammar produced {r:?} as a dim"),
        }
    }

    fn expr(&self, p: P) -> PResult<Expr> {
        // Precedence climbing over a flat `unary* postfix (op unary* postfix)*` list.
        let ops = p
            .clone()
            .into_inner()
            .filter(|q| matches!(q.as_rule(), Rule::unary | Rule::bin_op))
            .count();
        let _chain = self.chain(ops, self.span(&p))?;
        let mut operands: Vec<Expr> = Vec::new();
        let mut ops: Vec<BinOp> = Vec::new();
        let mut negs = 0usize;
        for q in p.into_inner() {
            match q.as_rule() {
                Rule::unary => negs += 1,
                Rule::bin_op => ops.push(match q.as_str() {
                    "+" => BinOp::Add,
                    "-" => BinOp::Sub,
                    "*" => BinOp::Mul,
                    "/" => BinOp::Div,
                    _ => BinOp::MatMul,
                }),
                _ => {
                    let start = self.span(&q);
                    let mut e = self.postfix(q)?;
                    for _ in 0..negs {
                        e = Expr {
                            span: e.span.to(Span {
                                start: start.start.saturating_sub(1),
                                ..start
                            }),
                            kind: ExprKind::Neg(Box::new(e)),
                        };
                    }
                    negs = 0;
                    operands.push(e);
                }
            }
        }
        fn prec(op: BinOp) -> u8 {
            match op {
                BinOp::Add | BinOp::Sub => 1,
                BinOp::Mul | BinOp::Div => 2,
                BinOp::MatMul => 3,
            }
        }
        // Shunting-yard.
        let mut out: Vec<Expr> = Vec::new();
        let mut stack: Vec<BinOp> = Vec::new();
        let mut operands = operands.into_iter();
        if let Some(first) = operands.next() {
            out.push(first);
        }
        fn reduce(out: &mut Vec<Expr>, op: BinOp) {
            let (Some(r), Some(l)) = (out.pop(), out.pop()) else {
                return;
            };
            let span = l.span.to(r.span);
            out.push(Expr {
                kind: ExprKind::Bin(Box::new(l), op, Box::new(r)),
                span,
            });
        }
        for (op, rhs) in ops.into_iter().zip(operands) {
            while let Some(&top) = stack.last() {
                if prec(top) >= prec(op) {
                    stack.pop();
                    reduce(&mut out, top);
                } else {
                    break;
                }
            }
            stack.push(op);
            out.push(rhs);
        }
        while let Some(top) = stack.pop() {
            reduce(&mut out, top);
        }
        Ok(out.pop().expect("grammar guarantees one operand"))
    }

    fn postfix(&self, p: P) -> PResult<Expr> {
        let ops = p.clone().into_inner().count().saturating_sub(1);
        let _chain = self.chain(ops, self.span(&p))?;
        let mut it = p.into_inner();
        let mut e = self.primary(next(&mut it))?;
        for q in it {
            let span = e.span.to(self.span(&q));
            e = match q.as_rule() {
                Rule::call_args => Expr {
                    kind: ExprKind::Call(Box::new(e), self.call_args(q)?),
                    span,
                },
                Rule::member_access => {
                    let name = q.into_inner().next().map(|n| Ident {
                        name: n.as_str().to_string(),
                        span: self.span(&n),
                    });
                    match name {
                        Some(name) => Expr {
                            kind: ExprKind::Member(Box::new(e), name),
                            span,
                        },
                        None => e,
                    }
                }
                _ => {
                    let mut slices = Vec::new();
                    for s in q.into_inner() {
                        slices.push(self.slice(s)?);
                    }
                    Expr {
                        kind: ExprKind::Index(Box::new(e), slices),
                        span,
                    }
                }
            };
        }
        Ok(e)
    }

    fn slice(&self, p: P) -> PResult<Slice> {
        let span = self.span(&p);
        let text = p.as_str();
        let parts: Vec<P> = p.into_inner().collect();
        if !text.contains(':') {
            let Some(q) = parts.into_iter().next() else {
                return Err(Box::new(Problem::Syntax {
                    span,
                    message: "empty index".into(),
                }));
            };
            return Ok(Slice::At(self.dim_expr(q)?));
        }
        let colon = text.find(':').unwrap_or(0) as u32 + span.start;
        let mut lo = None;
        let mut hi = None;
        for q in parts {
            let e = self.dim_expr(q)?;
            if e.span().start < colon {
                lo = Some(e)
            } else {
                hi = Some(e)
            }
        }
        Ok(Slice::Range(lo, hi, span))
    }

    fn call_args(&self, p: P) -> PResult<Vec<Arg>> {
        let mut args = Vec::new();
        for a in p.into_inner() {
            let q = next(&mut a.into_inner());
            args.push(match q.as_rule() {
                Rule::named_arg => {
                    let mut it = q.into_inner();
                    let k = self.ident(next(&mut it));
                    Arg::Named(k, self.opt_value(next(&mut it))?)
                }
                Rule::arrow_arg => {
                    let span = self.span(&q);
                    let mut it = q.into_inner();
                    let a = self.dim_arg(next(&mut it))?;
                    let b = self.dim_arg(next(&mut it))?;
                    Arg::Arrow(a, b, span)
                }
                _ => Arg::Pos(self.expr(q)?),
            });
        }
        Ok(args)
    }

    fn dim_arg(&self, p: P) -> PResult<DimArg> {
        let span = self.span(&p);
        let mut it = p.into_inner();
        let size = self.dim_expr(next(&mut it))?;
        let axes = it.next().map(|a| self.axes(a));
        Ok(DimArg { size, axes, span })
    }

    fn primary(&self, p: P) -> PResult<Expr> {
        let span = self.span(&p);
        let kind = match p.as_rule() {
            Rule::float => match p.as_str().replace('_', "").parse::<f64>() {
                // `1e400` parses as infinity: refused like any unrepresentable literal.
                Ok(v) if v.is_finite() => ExprKind::Float(v),
                _ => {
                    return Err(Box::new(Problem::BadLiteral {
                        span,
                        text: p.as_str().into(),
                    }))
                }
            },
            Rule::int => ExprKind::Int(self.int(&p)?),
            Rule::string => {
                let s = p.as_str();
                ExprKind::Str(s[1..s.len() - 1].to_string())
            }
            Rule::ident => ExprKind::Name(p.as_str().to_string()),
            Rule::paren => return self.expr(next(&mut p.into_inner())),
            Rule::list => {
                let mut items = Vec::new();
                for li in p.into_inner() {
                    let q = next(&mut li.into_inner());
                    items.push(if q.as_rule() == Rule::dim {
                        ListItem::Dim(self.dim(q)?)
                    } else {
                        ListItem::Expr(self.expr(q)?)
                    });
                }
                ExprKind::List(items)
            }
            Rule::local_block => {
                let mut axes = Vec::new();
                let mut block = None;
                for q in p.into_inner() {
                    match q.as_rule() {
                        Rule::ident => axes.push(self.ident(q)),
                        Rule::block => block = Some(self.block(q)?),
                        _ => {}
                    }
                }
                let block = block.unwrap_or(Block {
                    lets: vec![],
                    result: None,
                    span,
                });
                ExprKind::Local(axes, block)
            }
            r => unreachable!("grammar produced {r:?} as a primary"),
        };
        Ok(Expr { kind, span })
    }
}

fn next<'a>(it: &mut impl Iterator<Item = P<'a>>) -> P<'a> {
    it.next().expect("grammar guarantees this child")
}

#[cfg(test)]
mod keyword_tests {
    /// `KEYWORDS` is the grammar's `keyword` rule, word for word.
    #[test]
    fn keywords_are_the_grammars() {
        let g = include_str!("../grammar/shard.pest");
        let rule = g
            .split("keyword  = @{")
            .nth(1)
            .and_then(|r| r.split("~ !ident_char").next())
            .expect("the keyword rule");
        let words: Vec<&str> = rule
            .split('"')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, w)| w)
            .collect();
        assert_eq!(words, super::KEYWORDS);
    }
}
