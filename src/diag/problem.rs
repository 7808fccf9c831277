//! What went wrong, as plain data. All wording lives in [`Problem::diagnostic`]
//! and the functions it calls (a pipeline schedule's in `schedule.rs`).

use super::schedule::{schedule_file, schedule_problem, ScheduleFileProblem, ScheduleProblem};
use super::{Code, Diagnostic, Label};
use crate::source::Span;

/// Why a computed initial value is refused.
#[derive(Clone, Debug, PartialEq)]
pub enum ComputedInitProblem {
    /// It reads a parameter or an input (named).
    Uses(String),
    /// One of its values is split or pending (its type).
    Split(String),
    /// It adds to the loss or logs a value (`add_loss` / `observe`, by name),
    /// though it runs once, before training.
    Adds(String),
}

/// Why a loss function (`loss: NAME` naming a `fn` of the model) is refused.
#[derive(Clone, Debug, PartialEq)]
pub enum LossFnProblem {
    /// It takes this many parameters, not (output, targets).
    Params(usize),
    /// It returns this type, not a reduced float scalar.
    Result(String),
    /// It reads model state or adds to the loss (what).
    Reads(String),
}

/// Why a `step_total` is refused (E0230).
#[derive(Clone, Debug, PartialEq)]
pub enum TotalProblem {
    /// Its operand depends on a weight, a table or the model's output (what).
    NotData(String),
    /// It is in a layer's function or a helper, not in `forward` of the
    /// trained model or its loss function.
    Nested,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    Syntax {
        span: Span,
        message: String,
    },
    BadLiteral {
        span: Span,
        text: String,
    },
    /// A finite number past the largest value of the float type it meets
    /// (it would be ±inf at run time).
    FloatOutOfRange {
        span: Span,
        value: f64,
        dtype: &'static str,
        max: f64,
    },
    /// Brackets, chained operators, constants or layers nested past a limit.
    TooDeep {
        span: Span,
        what: &'static str,
        depth: usize,
        limit: usize,
    },
    /// A name longer than the parser's limit.
    NameTooLong {
        span: Span,
        len: usize,
        limit: usize,
    },
    /// An output directory in a model file that would leave the run directory.
    OutputEscapes {
        span: Span,
        what: &'static str,
        dir: String,
        escape: crate::access::Escape,
    },
    /// A source file that is not UTF-8 text: where its first bad byte is.
    NotUtf8 {
        span: Span,
        offset: usize,
    },
    /// `shardc shard`: no layout of the model fits the device (E0700): the
    /// best one's peak, and what it would fit on.
    NoLayoutFits {
        span: Span,
        model: String,
        device: String,
        memory: f64,
        peak: f64,
        mesh: Vec<(String, i64)>,
        /// The smallest named device with room for that peak.
        smallest_device: Option<String>,
        /// The smallest mesh (one axis doubled, again and again) on which
        /// the same layout fits.
        smallest_mesh: Option<Vec<(String, i64)>>,
        /// Whether the search could already use bf16.
        bf16: bool,
    },
    UnknownName {
        span: Span,
        name: String,
        what: &'static str,
        suggestion: Option<String>,
    },
    Duplicate {
        span: Span,
        name: String,
        first: Span,
    },
    ImportNotFound {
        span: Span,
        target: String,
        tried: String,
        reason: String,
    },
    RecursiveImport {
        span: Span,
        chain: Vec<String>,
    },
    Arity {
        span: Span,
        callee: String,
        expected: String,
        found: usize,
        decl: Option<Span>,
    },
    NamedArg {
        span: Span,
        callee: String,
        name: String,
        known: Vec<String>,
        missing: bool,
    },
    WrongKind {
        span: Span,
        expected: String,
        found: String,
    },
    NotCallable {
        span: Span,
        name: String,
        found: String,
    },
    NoForward {
        span: Span,
        layer: String,
    },
    UnknownPragma {
        span: Span,
        name: String,
    },
    UnknownAxis {
        span: Span,
        axis: String,
        mesh: Option<(String, Span)>,
        axes: Vec<String>,
    },
    AxisTwice {
        span: Span,
        axis: String,
        first: Span,
        ty: String,
    },
    BadMesh {
        span: Span,
        message: String,
        help: Option<String>,
    },
    Indivisible {
        span: Span,
        what: String,
        size: i64,
        axes: String,
        n: i64,
        axis_decl: Option<Span>,
        suggest: Vec<i64>,
    },
    IndivisibleSymbolic {
        span: Span,
        what: String,
        axes: String,
        n: i64,
    },
    HeadsIndivisible {
        span: Span,
        heads: i64,
        axes: String,
        n: i64,
    },
    BadDim {
        span: Span,
        expr: String,
        reason: String,
    },
    ReshapeCount {
        span: Span,
        from: String,
        to: String,
        from_n: String,
        to_n: String,
    },
    ReshapeSharding {
        span: Span,
        message: String,
        help: String,
    },
    Contraction {
        span: Span,
        lhs: (Span, String),
        rhs: (Span, String),
        lhs_dim: String,
        rhs_dim: String,
    },
    Broadcast {
        span: Span,
        lhs: (Span, String),
        rhs: (Span, String),
        detail: String,
    },
    DType {
        span: Span,
        expected: String,
        found: String,
        other: Option<Span>,
    },
    Rank {
        span: Span,
        expected: usize,
        found: usize,
        ty: String,
        decl: Option<Span>,
    },
    Mismatch {
        span: Span,
        expected: String,
        found: String,
        decl: Option<Span>,
        detail: String,
    },
    Ambiguous {
        span: Span,
        lhs: (Span, String),
        rhs: (Span, String),
        detail: String,
    },
    PendingUsed {
        span: Span,
        ty: String,
        op: String,
        axes: String,
        /// The call that reduces it, wrapped around the expression at `span`
        /// (`psum(`, `, mp)`), when `span` is an expression.
        reduce: Option<(String, String)>,
    },
    BadCollective {
        span: Span,
        message: String,
        help: String,
    },
    ImplicitCollective {
        span: Span,
        what: String,
        bytes: String,
        strict: Option<Span>,
        local: Option<Span>,
        /// The calls that write the collectives (`psum(` … `, mp)`).
        explicit: Option<(String, String)>,
    },
    Einsum {
        span: Span,
        message: String,
    },
    DimIndex {
        span: Span,
        index: i64,
        rank: usize,
    },
    /// A `repeat` split into pipeline stages called with more than its input.
    StageSideInputs {
        span: Span,
        axis: String,
        stack: Span,
    },
    /// A count (`top_k`'s `k`) outside 1 to the size of the dim it takes from.
    CountRange {
        span: Span,
        op: String,
        count: i64,
        dim: usize,
        size: String,
    },
    /// A checkpoint policy naming a value the repeated layer does not have.
    CheckpointName {
        span: Span,
        name: String,
        layer: String,
        suggestion: Option<String>,
    },
    /// `split`'s parts do not cut the dimension exactly.
    SplitSizes {
        span: Span,
        message: String,
        dim: usize,
        size: String,
    },
    RecursiveLayer {
        span: Span,
        chain: Vec<String>,
    },
    Field {
        span: Span,
        message: String,
        known: Vec<String>,
        /// The field it was probably meant as: an automatic fix.
        suggestion: Option<String>,
    },
    UnknownChoice {
        span: Span,
        kind: &'static str,
        name: String,
        known: Vec<&'static str>,
    },
    /// A table's `shard:` that is not `rows(axis)`; `axis` as written in it.
    ShardNotRows {
        span: Span,
        axis: Option<String>,
    },
    /// A weight's type with `partial(...)`: `span` is the whole type.
    WeightPending {
        span: Span,
    },
    BadValue {
        span: Span,
        message: String,
        help: Option<String>,
    },
    /// `add_loss`'s term or `observe`'s value is not a reduced float value of
    /// the size it must have.
    AuxValue {
        span: Span,
        callee: &'static str,
        what: String,
        problem: String,
        /// The most elements allowed (1: a scalar).
        max: i64,
    },
    /// A metric the run's loss does not define (AUC of a softmax, accuracy of
    /// a regression).
    MetricLoss {
        span: Span,
        metric: &'static str,
        loss: String,
        loss_span: Option<Span>,
    },
    BatchIndivisible {
        span: Span,
        batch: i64,
        axes: String,
        n: i64,
        mesh_span: Span,
        /// Whether `span` is the written batch (the fix replaces it).
        written: bool,
        /// The pieces the written batch is cut into before the model sees
        /// `batch` of it (`accumulate` × a pipeline's `microbatches`; 1).
        pieces: i64,
    },
    UnknownCombiner {
        span: Span,
        name: String,
    },
    TableField {
        span: Span,
        message: String,
        help: Option<String>,
    },
    FeatureTable {
        span: Span,
        message: String,
        label: &'static str,
        table: (Span, &'static str),
    },
    BadDirective {
        span: Span,
        message: String,
        help: Option<String>,
    },
    /// `freeze(name)` naming no weight or sublayer of its layer.
    FreezeUnknown {
        span: Span,
        layer: String,
        name: String,
        suggestion: Option<String>,
    },
    /// A weight's computed `init` that is not a constant computable whole on
    /// every device.
    ComputedInit {
        span: Span,
        weight: String,
        problem: ComputedInitProblem,
    },
    /// A loss function that is not a function of the output and targets to
    /// a float scalar.
    LossFn {
        span: Span,
        name: String,
        /// `loss: NAME` in the `train`.
        chosen: Span,
        problem: LossFnProblem,
    },
    /// A `step_total` the runtime cannot sum before the step (E0230).
    StepTotal {
        span: Span,
        problem: TotalProblem,
    },
    /// A `frozen: true` table that also names its own optimizer.
    FrozenTableOptimizer {
        span: Span,
        table: String,
        frozen: Span,
    },
    StageAxisInside {
        span: Span,
        axis: String,
        ty: String,
        stack: Span,
    },
    /// A trained model's input keeps a size `train` does not bind.
    UnboundSize {
        span: Span,
        size: String,
        input: String,
        batch: Option<(String, i64)>,
        train: Span,
    },
    /// A schedule file that cannot be read or does not fit (E0232).
    ScheduleFile {
        span: Span,
        problem: ScheduleFileProblem,
    },
    /// A schedule file the verifier refuses (E0233).
    ScheduleUnsound {
        span: Span,
        problem: ScheduleFileProblem,
    },
    /// A pipelined stack its schedule cannot run (E0231).
    Schedule {
        span: Span,
        problem: ScheduleProblem,
    },
    FewMicrobatches {
        span: Span,
        microbatches: usize,
        stages: usize,
        /// The fewest microbatches at least `stages` that the batch (and
        /// the schedule) allow, when some do.
        enough: Option<usize>,
    },
    /// A weight declared in a float type that the run neither computes in
    /// nor keeps as master weights (f32).
    /// A dimension whose size argument arrives split over `given` (the
    /// caller's `L(8@dp)`) written split over `here`: one would be dropped.
    ShardingTwice {
        span: Span,
        given: Vec<String>,
        here: Vec<String>,
        /// Where the layer was instantiated with the split size.
        site: Option<Span>,
    },
    /// A weight no function the model runs reads: it is not a parameter.
    UnusedWeight {
        span: Span,
        weight: String,
        layer: String,
        /// The whole declaration (the quick fix removes it).
        decl: Option<Span>,
    },
    /// An import of the root file that brings nothing another file names (W0007).
    UnusedImport {
        span: Span,
        /// The imported file as diagnostics name it (`<std>/nn.shard`).
        target: String,
    },
    /// A `let` name no later `let` nor the block's result reads (W0006).
    UnusedLet {
        span: Span,
        name: String,
        /// The whole `let`, when it binds this name alone (the quick fix
        /// removes it; a tuple's unused part is renamed `_name` instead).
        stmt: Option<Span>,
    },
    RunFloatType {
        span: Span,
        weight: String,
        declared: String,
        /// The run's float type (`f32`, or the mixed-precision type).
        run: String,
        /// The run computes in a 16-bit type (`precision: bf16 | f16`).
        mixed: bool,
        train: Span,
    },
    DataUnreadable {
        span: Span,
        path: String,
        reason: String,
    },
    DataMismatch {
        span: Span,
        path: String,
        message: String,
        label: &'static str,
        help: Option<String>,
    },
    DataOutOfRange {
        span: Span,
        message: String,
        label: String,
        help: String,
    },
    /// A `no_decay` or `lr_scale` name that no parameter's path contains.
    UnmatchedGroup {
        span: Span,
        pattern: String,
        option: &'static str,
        model: String,
        /// Names the parameters' paths are made of, the closest first.
        near: Vec<String>,
    },
    Reshard {
        span: Span,
        what: String,
        from: String,
        to: String,
        bytes: String,
    },
}

fn list(v: &[String]) -> String {
    v.iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A name as a message quotes it: names past 80 characters are abbreviated
/// (a generated 100,000-character identifier would flood the terminal).
fn short(name: &str) -> String {
    const MAX: usize = 80;
    if name.chars().count() <= MAX {
        return name.to_string();
    }
    let head: String = name.chars().take(MAX / 2).collect();
    format!("{head}… ({} characters)", name.chars().count())
}

impl Problem {
    pub fn code(&self) -> Code {
        self.diagnostic().code
    }

    pub fn diagnostic(&self) -> Diagnostic {
        use Problem::*;
        let d = |code, msg: String, span: Span, label: String| {
            Diagnostic::new(code, msg, Label::new(span, label))
        };
        match self {
            Syntax { span, message } => d(Code::E0001, format!("syntax error: {message}"), *span, "here".into()),
            OutputEscapes { span, what, dir, escape } => {
                use crate::access::Escape;
                let why = match escape {
                    Escape::Absolute => "an absolute path outside every granted directory",
                    Escape::Parent => "it climbs out of the run directory",
                    Escape::Empty => "it is the run directory itself",
                };
                d(Code::E0307, format!("the {what} directory `{dir}` is outside the run directory"), *span, why.into())
                    .help("name a directory inside the run directory (e.g. `\"ckpt\"`, placed under `--out`); to write elsewhere, grant the place on the command line with `--allow-path DIR` and name it absolutely")
            }
            NameTooLong { span, len, limit } => d(Code::E0005, format!("a name of {len} characters; names are at most {limit}"), *span, "this name".into()).help("use a shorter name"),
            TooDeep { span, what, depth, limit } => d(Code::E0003, format!("{what} nested too deeply: {depth} levels, at most {limit}"), *span, format!("{what} past the limit start here")).help("split the expression with `let` bindings, or the declarations into fewer levels"),
            NoLayoutFits { span, model, device, memory, peak, mesh, smallest_device, smallest_mesh, bf16 } => no_layout_fits(*span, model, device, *memory, *peak, mesh, smallest_device.as_deref(), smallest_mesh.as_deref(), *bf16),
            NotUtf8 { span, offset } => d(Code::E0004, format!("the file is not UTF-8 text: byte {offset} is not valid UTF-8"), *span, "here".into()).help("save the file as UTF-8"),
            BadLiteral { span, text } => d(Code::E0002, format!("invalid number `{text}`"), *span, "does not fit in 64 bits".into())
                .help("sizes are integers below 2^63"),
            FloatOutOfRange { span, value, dtype, max } => {
                let sign = if *value < 0.0 { "-" } else { "" };
                let article = if dtype.starts_with('f') { "an" } else { "a" };
                d(Code::E0002, format!("the number {value:e} is past the largest {dtype} ({max:.4e}): it would be {sign}inf at run time"), *span, format!("used with {article} {dtype} tensor"))
                    .help(format!("write `{sign}inf` if infinity is meant (0 × inf is NaN: mask with `where`, not by multiplying), or a value within ±{max:.4e}"))
                    .fix(*span, format!("{sign}inf"))
            }
            UnknownName { span, name, what, suggestion } => {
                let mut x = d(Code::E0100, format!("unknown {what} `{}`", short(name)), *span, "not found in this scope".into());
                if let Some(s) = suggestion {
                    x = x.help(format!("a {what} with a similar name exists: `{s}`")).fix(*span, s.clone());
                }
                x
            }
            Duplicate { span, name, first } => d(Code::E0101, format!("`{}` is defined more than once", short(name)), *span, "defined again here".into())
                .secondary(*first, "first defined here")
                .help("rename one of them"),
            ImportNotFound { span, target, tried, reason } => d(Code::E0102, format!("cannot import `{target}`"), *span, reason.clone())
                .note(format!("looked for {tried}"))
                .help("stdlib modules are imported by name (`import nn`), files by a path relative to the importing file (`import \"layers.shard\"`)"),
            RecursiveImport { span, chain } => d(Code::E0103, "recursive import".into(), *span, "this import leads back to the importing file".into())
                .note(format!("import cycle: {}", chain.join(" → "))),
            Arity { span, callee, expected, found, decl } => {
                let mut x = d(Code::E0104, format!("`{callee}` takes {expected}, but {found} {} given", if *found == 1 { "was" } else { "were" }), *span, format!("{found} given"));
                if let Some(s) = decl {
                    x = x.secondary(*s, "declared here");
                }
                x
            }
            NamedArg { span, callee, name, known, missing } => {
                if *missing {
                    d(Code::E0105, format!("`{callee}` needs the argument `{name}`"), *span, format!("`{name}` missing"))
                } else {
                    let mut x = d(Code::E0105, format!("`{callee}` has no argument named `{name}`"), *span, "unknown argument".into());
                    if let Some(s) = super::did_you_mean(name, known.iter().map(|s| s.as_str())) {
                        x = x.help(format!("did you mean `{s}`?")).fix(*span, s);
                    } else if !known.is_empty() {
                        x = x.help(format!("its arguments are {}", list(known)));
                    } else {
                        x = x.help(format!("`{callee}` takes no named arguments"));
                    }
                    x
                }
            }
            WrongKind { span, expected, found } => d(Code::E0106, format!("expected {expected}, found {found}"), *span, format!("this is {found}")),
            NotCallable { span, name, found } => d(Code::E0107, format!("`{name}` is not callable"), *span, format!("`{name}` is {found}"))
                .help("call layers, sublayers and built-in functions; see `docs/language.md` for the list of built-ins"),
            NoForward { span, layer } => d(Code::E0108, format!("`{layer}` has no `forward` function"), *span, "needs `fn forward(...)`".into())
                .help("add `fn forward(x: f32[B, D]) -> f32[B, D] { ... }`"),
            UnknownPragma { span, name } => d(Code::E0109, format!("unknown pragma `{name}`"), *span, "not a pragma".into())
                .help("the only pragma is `pragma strict` (every collective must be written explicitly)")
                .fix(*span, "strict"),
            UnknownAxis { span, axis, mesh, axes } => {
                let mut x = d(Code::E0200, format!("unknown mesh axis `{axis}`"), *span, match mesh {
                    Some((m, _)) => format!("mesh `{m}` has no axis `{axis}`"),
                    None => "no mesh is declared".into(),
                });
                if let Some((m, s)) = mesh {
                    x = x.secondary(*s, format!("`{m}` is declared here"));
                }
                let near = super::did_you_mean_all(axis, axes.iter().map(|s| s.as_str()));
                if let Some(s) = near.first() {
                    // With several as near, the compile keeps the one that
                    // checks best and rewrites this help to name it.
                    x = x.help(format!("did you mean `{s}`?")).fix_among(*span, near.clone());
                } else if !axes.is_empty() {
                    x = x.help(format!("the mesh axes are {}", list(axes)));
                } else {
                    x = x.help("declare a mesh: `mesh pod(dp: 4, mp: 2)`");
                }
                x
            }
            AxisTwice { span, axis, first, ty } => d(Code::E0201, format!("mesh axis `{axis}` is used twice in `{ty}`"), *span, "used again here".into())
                .secondary(*first, "first used here")
                .note("a mesh axis can split at most one dimension of a tensor")
                .help(format!("remove one `@{axis}`, or split the other dimension over a different axis"))
                .settled(*span, super::Settle::DropAxis(axis.clone())),
            BadMesh { span, message, help } => {
                let x = d(Code::E0202, message.clone(), *span, "invalid".into());
                match help {
                    Some(h) => x.help(h.clone()),
                    None => x,
                }
            }
            Indivisible { span, what, size, axes, n, axis_decl, suggest } => {
                let mut x = d(Code::E0203, format!("{what} (size {size}) is not divisible by mesh axis {axes} (size {n})"), *span, format!("{size} split over {} = {n}", axes.trim_matches('`')));
                let mut divisors: Vec<i64> = (1..=(*size).min(64)).filter(|k| size % k == 0).collect();
                divisors.truncate(8);
                let divs: Vec<String> = divisors.iter().map(|k| k.to_string()).collect();
                // Padding first: cutting a vocabulary or a table loses rows.
                let up: Vec<String> = suggest.iter().filter(|k| *k > size).map(|k| k.to_string()).collect();
                let down: Vec<String> = suggest.iter().filter(|k| *k < size).map(|k| k.to_string()).collect();
                let mut h = format!("make the size a multiple of {n}");
                match (up.is_empty(), down.is_empty()) {
                    (false, false) => h.push_str(&format!(" (pad it to {}, or cut it to {})", up.join(" or "), down.join(" or "))),
                    (false, true) => h.push_str(&format!(" (pad it to {})", up.join(" or "))),
                    (true, false) => h.push_str(&format!(" (e.g. {})", down.join(" or "))),
                    (true, true) => {}
                }
                h.push_str(&format!(", or use an axis size in {{{}}}", divs.join(", ")));
                x = x.help(h);
                if let Some(s) = axis_decl {
                    x = x.secondary(*s, "axis size declared here");
                }
                x
            }
            IndivisibleSymbolic { span, what, axes, n } => d(Code::E0203, format!("{what} is not divisible by mesh axis {axes} (size {n})"), *span, format!("not a multiple of {n} for every value of its symbols")),
            HeadsIndivisible { span, heads, axes, n } => d(Code::E0204, format!("{heads} attention heads cannot be split over {axes} (size {n})"), *span, format!("{heads} heads over {n} devices"))
                .help(format!("choose a head count that is a multiple of {n}, or a smaller model-parallel axis"))
                .note("each model-parallel device computes whole heads (Megatron attention)"),
            BadDim { span, expr, reason } => d(Code::E0205, format!("dimension `{expr}` is not a positive integer"), *span, reason.clone()),
            ReshapeCount { span, from, to, from_n, to_n } => d(Code::E0206, format!("reshape from {from} to {to} changes the number of elements"), *span, format!("{from_n} elements become {to_n}"))
                .help("the product of the new dimensions must equal the product of the old"),
            ReshapeSharding { span, message, help } => d(Code::E0207, message.clone(), *span, "uneven or moved shards".into()).help(help.clone()),
            Contraction { span, lhs, rhs, lhs_dim, rhs_dim } => d(Code::E0208, format!("contraction dimensions do not match: {lhs_dim} vs {rhs_dim}"), *span, "in this product".into())
                .secondary(lhs.0, format!("left: {}", lhs.1))
                .secondary(rhs.0, format!("right: {}", rhs.1))
                .help("the last dimension of the left operand must equal the first contracted dimension of the right"),
            Broadcast { span, lhs, rhs, detail } => d(Code::E0209, format!("shapes cannot be broadcast together: {detail}"), *span, "in this operation".into())
                .secondary(lhs.0, format!("left: {}", lhs.1))
                .secondary(rhs.0, format!("right: {}", rhs.1))
                .note("dimensions are aligned from the right; each pair must be equal or one of them 1"),
            DType { span, expected, found, other } => {
                let mut x = d(Code::E0210, format!("dtype mismatch: expected {expected}, found {found}"), *span, format!("this is {found}"));
                if let Some(o) = other {
                    x = x.secondary(*o, format!("this is {expected}"));
                }
                let x = x.help(format!("convert explicitly with `cast(x, {expected})`"));
                // Only a dtype's name (one word, `i32`) can be cast to, not a
                // description of several (`an integer dtype (indices)`).
                if !expected.is_empty() && expected.chars().all(|c| c.is_ascii_alphanumeric()) {
                    x.wrap(*span, "cast(", format!(", {expected})"))
                } else {
                    x
                }
            }
            Rank { span, expected, found, ty, decl } => {
                let mut x = d(Code::E0211, format!("expected a tensor of rank {expected}, found rank {found}"), *span, format!("this is {ty}"));
                if let Some(s) = decl {
                    x = x.secondary(*s, format!("rank {expected} expected here"));
                }
                x
            }
            Mismatch { span, expected, found, decl, detail } => {
                let mut x = d(Code::E0212, format!("expected `{expected}`, found `{found}`"), *span, detail.clone());
                if let Some(s) = decl {
                    x = x.secondary(*s, "expected because of this type");
                }
                x
            }
            Ambiguous { span, lhs, rhs, detail } => d(Code::E0213, format!("ambiguous sharding: {detail}"), *span, "which layout should the result have?".into())
                .secondary(lhs.0, lhs.1.clone())
                .secondary(rhs.0, rhs.1.clone())
                .help("write the layout you want on the result, each mesh axis splitting one dimension at most (`let y: f32[...] = ...` with the result's sizes and your mesh's axes), and the compiler reshards the operands to it; or reshard an operand yourself with an explicit collective"),
            PendingUsed { span, ty, op, axes, reduce } => {
                let x = d(Code::E0214, format!("{op} needs a reduced value, but this value is `{ty}`"), *span, format!("still owes a reduction over {axes}"))
                    .note("a partial value holds one addend per device; this operation needs their sum");
                match reduce {
                    Some((before, after)) => x.help(format!("reduce it first: `{before}x{after}`")).wrap(*span, before, after),
                    None => x.help(format!("reduce it first: `psum(x, {})` (or `pmax` for a pending max)", axes.replace('`', ""))),
                }
            }
            BadCollective { span, message, help } => d(Code::E0215, message.clone(), *span, "here".into()).help(help.clone()),
            ImplicitCollective { span, what, bytes, strict, local, explicit } => {
                let mut x = d(Code::E0216, format!("this needs an implicit {what}"), *span, format!("{bytes} per call"));
                if let Some(s) = strict {
                    x = x.secondary(*s, "strict mode: every collective must be written");
                }
                if let Some(s) = local {
                    x = x.secondary(*s, "inside a local block, collectives are explicit");
                }
                match explicit {
                    Some((before, after)) => x.help(format!("write the {what} explicitly: `{before}…{after}`")).wrap(*span, before, after),
                    None => x.help(format!("write the {what} explicitly")),
                }
            }
            Einsum { span, message } => d(Code::E0217, format!("invalid einsum: {message}"), *span, "here".into())
                .help("write `\"ab,bc->ac\"`: one letter per dimension, inputs separated by commas, output after `->`"),
            DimIndex { span, index, rank } => d(Code::E0218, format!("dimension {index} is out of range for a tensor of rank {rank}"), *span, format!("valid: {} to {}", -(*rank as i64), *rank as i64 - 1)),
            StageSideInputs { span, axis, stack } => d(Code::E0223, format!("a stack pipelined over `{axis}` takes one input"), *span, "a side input".into())
                .secondary(*stack, "the pipelined stack")
                .note("each stage receives only the previous stage's output")
                .help("compute the side input inside the block, or do not pipeline this stack"),
            CheckpointName { span, name, layer, suggestion } => {
                let x = d(Code::E0228, format!("`{name}` is not a value of `{layer}`'s `forward`"), *span, "no `let` of this name".into())
                    .note("a checkpoint policy (`checkpoint: [...]` on a `repeat`, `checkpoint(...)` in a layer) keeps the values of the named `let`s of the layer's `forward` (and each call's result), and recomputes the rest in backward");
                match suggestion {
                    Some(s) => x.help(format!("did you mean `{s}`?")).fix(*span, s.clone()),
                    None => x.help("name a `let` of the layer's `forward`, or use `checkpoint: full`"),
                }
            }
            SplitSizes { span, message, dim, size } => d(Code::E0227, format!("`split` cannot cut dimension {dim} (size {size}) into {message}"), *span, "these parts".into())
                .help(format!("give a count of at least 2 that divides {size}, or a list of 2 or more positive sizes summing to {size}")),
            CountRange { span, op, count, dim, size } => d(Code::E0222, format!("`{op}` takes {count} elements from dimension {dim}, which has {size}"), *span, format!("valid: 1 to {size}"))
                .help("take at most the dimension's size, or work along another dimension with `dim:`"),
            RecursiveLayer { span, chain } => d(Code::E0219, "layer contains itself".into(), *span, "instantiated recursively here".into())
                .note(format!("cycle: {}", chain.join(" → "))),
            Field { span, message, known, suggestion } => {
                let x = d(Code::E0300, message.clone(), *span, "here".into());
                let x = match suggestion {
                    Some(s) => x.fix(*span, s.clone()),
                    None => x,
                };
                if known.is_empty() { x } else { x.help(format!("known fields: {}", list(known))) }
            }
            UnknownChoice { span, kind, name, known } => {
                let article = if kind.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
                let mut x = d(Code::E0301, format!("unknown {kind} `{name}`"), *span, format!("not {article} {kind}"));
                if let Some(s) = super::did_you_mean(name, known.iter().copied()) {
                    x = x.help(format!("did you mean `{s}`?")).fix(*span, s);
                } else {
                    let k: Vec<String> = known.iter().map(|s| s.to_string()).collect();
                    x = x.help(format!("known: {}", list(&k)));
                }
                if *kind == "loss" {
                    x = x.note("a loss may also be a `fn` of the model taking the output and the targets, returning a float scalar: `loss: my_loss`");
                }
                x
            }
            ShardNotRows { span, axis } => {
                let x = d(Code::E0401, "`shard` must be `rows(axis)`".into(), *span, "here".into());
                match axis {
                    Some(a) => x.help(format!("tables are MOD-sharded by rows over a mesh axis and the SparseCores of each device: `rows({a})`")).fix(*span, format!("rows({a})")),
                    None => x.help("tables are MOD-sharded by rows over a mesh axis and the SparseCores of each device: `shard: rows(device)`"),
                }
            }
            WeightPending { span } => d(Code::E0302, "a weight cannot have a pending reduction".into(), *span, "invalid value".into())
                .help("remove `partial(...)` from the weight's type")
                .settled(*span, super::Settle::DropPending),
            BadValue { span, message, help } => {
                let x = d(Code::E0302, message.clone(), *span, "invalid value".into());
                match help { Some(h) => x.help(h.clone()), None => x }
            }
            AuxValue { span, callee, what, problem, max } => d(Code::E0224, format!("the {what} of `{callee}` {problem}"), *span, format!("the {what}"))
                .help(if *max == 1 {
                    "an added loss is one number for the whole batch: reduce it (`mean(...)`, `sum(...)`, then `reduce(...)` or `psum` for a sum over devices)".to_string()
                } else {
                    format!("an observed value is small and the same on every device: reduce it (`sum(..., dim: 0)`, then `reduce(...)`), at most {max} elements")
                }),
            MetricLoss { span, metric, loss, loss_span } => {
                let x = d(Code::E0308, format!("`{metric}` is not defined for `loss: {loss}`"), *span, format!("needs another loss than `{loss}`"))
                    .help(match *metric {
                        "auc" => "AUC ranks a binary output: train with `loss: sigmoid_binary_cross_entropy` (0/1 targets), or drop `auc`".to_string(),
                        _ => "accuracy compares predicted and true classes: train a classifier (`softmax_cross_entropy` or `sigmoid_binary_cross_entropy`), or drop `accuracy`".to_string(),
                    });
                match loss_span { Some(s) => x.secondary(*s, "the loss is chosen here"), None => x }
            }
            BatchIndivisible { span, batch, axes, n, mesh_span, written, pieces } => {
                // What the user writes is the whole batch: a multiple of the
                // devices times the pieces it is cut into.
                let unit = n.saturating_mul((*pieces).max(1));
                let whole = batch.saturating_mul((*pieces).max(1));
                let near = (whole / unit).max(1).saturating_mul(unit);
                let message = if *pieces > 1 {
                    format!("a microbatch of {batch} (batch {whole} in {pieces} pieces: `accumulate` × `microbatches`) is not divisible by the data axes {axes} (size {n})")
                } else {
                    format!("batch {batch} is not divisible by the data axes {axes} (size {n})")
                };
                let examples = if *batch == 1 { "example" } else { "examples" };
                let x = d(Code::E0303, message, *span, format!("{batch} {examples} over {n} devices"))
                    .secondary(*mesh_span, "mesh declared here")
                    .help(format!("use a batch that is a multiple of {unit} (e.g. {near})"));
                if *written { x.fix(*span, near.to_string()) } else { x }
            }
            UnknownCombiner { span, name } => {
                let mut x = d(Code::E0400, format!("unknown combiner `{name}`"), *span, "not a combiner".into())
                    .help("combiners are `sum`, `mean` and `sqrtn`")
                    .note("JAX SparseCore silently ignores an unknown combiner; shardc refuses it");
                if let Some(s) = super::did_you_mean(name, ["sum", "mean", "sqrtn"]) {
                    x = x.fix(*span, s);
                }
                x
            }
            TableField { span, message, help } => {
                let x = d(Code::E0401, message.clone(), *span, "here".into());
                match help { Some(h) => x.help(h.clone()), None => x }
            }
            FeatureTable { span, message, label, table } => d(Code::E0402, message.clone(), *span, label.to_string()).secondary(table.0, table.1),
            BadDirective { span, message, help } => {
                let x = d(Code::E0500, message.clone(), *span, "here".into());
                match help { Some(h) => x.help(h.clone()), None => x }
            }
            FreezeUnknown { span, layer, name, suggestion } => {
                let x = d(Code::E0500, format!("`freeze({name})`: `{layer}` has no weight or sublayer `{name}`"), *span, "not a member of this layer".into());
                match suggestion {
                    Some(s) => x.help(format!("a member with a similar name exists: `{s}`")).fix(*span, s.clone()),
                    None => x.help("`freeze` names weights and sublayers declared in the same layer"),
                }
            }
            ComputedInit { span, weight, problem } => match problem {
                ComputedInitProblem::Uses(what) => d(Code::E0225, format!("the initial value of `{weight}` uses {}", if what == "an input" { what.clone() } else { format!("the parameter `{what}`") }), *span, "not a constant".into())
                    .help("a computed `init` is evaluated once before training from sizes, constants and ops (`arange`, `cos`, `concat`, ...): it cannot read inputs or other parameters"),
                ComputedInitProblem::Split(ty) => d(Code::E0225, format!("the initial value of `{weight}` is split over the mesh here (`{ty}`)"), *span, "split value".into())
                    .help("a computed `init` is computed whole on every device, then each device keeps its piece of the weight's layout: write its sizes without `@`"),
                ComputedInitProblem::Adds(name) => d(Code::E0225, format!("the initial value of `{weight}` adds `{name}` to the loss or logs it, but it is computed once, before training"), *span, "outside training".into())
                    .help("an added loss or observed value belongs in `forward` (or a function it calls), where it is computed every step"),
            },
            LossFn { span, name, chosen, problem } => {
                let (message, label, help) = match problem {
                    LossFnProblem::Params(n) => (format!("the loss function `{name}` takes {n} parameter{}, not 2 or 3", if *n == 1 { "" } else { "s" }), "not (output, targets) or (output, targets, weights)".to_string(), format!("declare it as `fn {name}(out: <the forward's output type>, y: <the targets' type>) -> f32[]`, with a third parameter `w: f32[...]` for weights from the data")),

                    LossFnProblem::Result(ty) => (format!("the loss function `{name}` returns `{ty}`, not a float scalar"), format!("returns `{ty}`"), "reduce the loss to one number, e.g. `mean(...)` over every dimension, and declare `-> f32[]`".to_string()),
                    LossFnProblem::Reads(what) => (format!("the loss function `{name}` uses {what}"), "not a function of the output and targets".to_string(), "a loss function sees only the forward's output and the targets: use weights in `forward`, and add terms to the loss there with `add_loss`".to_string()),
                };
                d(Code::E0226, message, *span, label)
                    .secondary(*chosen, "the loss is chosen here")
                    .help(help)
            }
            StepTotal { span, problem } => match problem {
                TotalProblem::NotData(what) => d(Code::E0230, format!("`step_total` sums a value that depends on {what}"), *span, "not data".into())
                    .note("`step_total` is summed over the whole step's batch before the step runs, from the data alone")
                    .help("give it the targets, the loss function's weights or the inputs (`sum(w * l) / step_total(w)`), not a value computed from the model"),
                TotalProblem::Nested => d(Code::E0230, "`step_total` in a layer's or helper's function".into(), *span, "not in `forward` or the loss function".into())
                    .note("`step_total` is summed over the whole step's batch before the step runs, where it is written")
                    .help("call it in the trained model's `forward` or in its loss function, and pass the result on"),
            },
            FrozenTableOptimizer { span, table, frozen } => d(Code::E0403, format!("the table `{table}` is frozen but has its own optimizer"), *span, "an optimizer for a table that is never updated".into())
                .secondary(*frozen, "frozen here")
                .note("a frozen table keeps its initial (or loaded) rows: no gradient step and no optimizer state")
                .help("remove `optimizer:` from the table, or `frozen: true` to train it"),
            StageAxisInside { span, axis, ty, stack } => d(Code::E0220, format!("`{axis}` splits the pipeline's stages, but this value inside a stage is `{ty}`"), *span, format!("uses `{axis}`"))
                .secondary(*stack, format!("stages over `{axis}` here"))
                .help(format!("a stage holds whole layers: split their tensors over another axis, or stage over another axis than `{axis}`")),
            UnboundSize { span, size, input, batch, train } => {
                let bound = match batch {
                    Some((b, n)) => format!("`train` binds the batch `{b}` ({n}); every other size of a trained model's inputs is a constant"),
                    None => "`train` binds only the batch; every other size of a trained model's inputs is a constant".into(),
                };
                d(Code::E0221, format!("the size `{size}` of the input `{input}` is not known when training"), *span, format!("`{size}` is not bound"))
                    .secondary(*train, "trained here")
                    .note(bound)
                    .help(format!("declare it: `const {size} = ...`"))
            }
            Schedule { span, problem } => schedule_problem(*span, problem),
            ScheduleFile { span, problem } | ScheduleUnsound { span, problem } => schedule_file(*span, problem),
            FewMicrobatches { span, microbatches, stages, enough } => {
                let bubble = (*stages as f64 - 1.0) / (*microbatches as f64 + *stages as f64 - 1.0);
                let x = d(Code::W0001, format!("{microbatches} microbatch(es) for {stages} pipeline stages: devices idle {:.0}% of each step", bubble * 100.0), *span, format!("{microbatches} < {stages}"))
                    .note(format!("the bubble fraction is (stages − 1) / (microbatches + stages − 1) = {}/{}", stages - 1, microbatches + stages - 1));
                match enough {
                    Some(m) => x.help(format!("use at least {stages} microbatches (here {m}, which divides the batch), more to shrink the bubble")).fix(*span, m.to_string()),
                    None => x.help(format!("use at least {stages} microbatches, more to shrink the bubble")),
                }
            }
            ShardingTwice { span, given, here, site } => {
                let list = |v: &[String]| v.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ");
                let both: Vec<String> = given.iter().chain(here.iter().filter(|a| !given.contains(a))).cloned().collect();
                let x = d(Code::E0229, format!("this dimension is split over {} by its size argument and over {} by its type", list(given), list(here)), *span, format!("split over {} here", list(here)));
                let x = match site {
                    Some(s) => x.secondary(*s, format!("its size arrives split over {}", list(given))),
                    None => x,
                };
                x.note("one of the two splits would be dropped silently")
                    .help(format!("pass the size unsplit and keep this type, write the type without `@` to take the caller's split, or split over both: `@({})`", both.join(", ")))
            }
            UnusedWeight { span, weight, layer, decl } => {
                let x = d(Code::W0005, format!("the weight `{weight}` of `{layer}` is never used"), *span, "declared here, read nowhere".into())
                    .note("a weight no function of the run reads is not a parameter: it is not trained, saved, loaded or counted by `plan`")
                    .help(format!("use `{weight}` in `forward` (or a function it calls), or remove it"));
                match decl {
                    Some(decl) => x.fix(*decl, ""),
                    None => x,
                }
            }
            UnusedImport { span, target } => d(Code::W0007, format!("the import of `{target}` is never used"), *span, "imported here, named nowhere".into())
                .note("nothing this file or its other imports name is declared in it, or in what it imports")
                .help("remove the `import`")
                .fix(*span, ""),
            UnusedLet { span, name, stmt } => {
                let x = d(Code::W0006, format!("the `let` `{name}` is never used"), *span, "bound here, read nowhere".into())
                    .note("a value nothing reads is not computed: it is not part of the program, its plan or its gradients");
                match stmt {
                    Some(stmt) => x.help(format!("remove the `let` (or use `{name}`, or name it `_{name}` to keep it unused)")).fix(*stmt, ""),
                    None => x.help(format!("name it `_{name}` to keep it unused (or use `{name}`)")).fix(*span, format!("_{name}")),
                }
            }
            RunFloatType { span, weight, declared, run, mixed, train } => {
                let help = match (declared.as_str(), *mixed) {
                    ("f64", _) => "declare it `f32`; `shardc run --f64` computes the whole run in f64 to check numerics".to_string(),
                    (d, false) => format!("to hold and compute the model in {d}, add `precision: {d}` to `train` (f32 master weights and optimizer state); or declare it `f32`"),
                    (_, true) => format!("declare it `f32` (the master weights) or `{run}`"),
                };
                let how = if *mixed { format!("computes in {run}, with f32 master weights") } else { format!("holds and computes every float in {run}") };
                d(Code::W0002, format!("the weight `{weight}` is declared `{declared}`, but this run holds it in {run}"), *span, format!("declared `{declared}`"))
                    .secondary(*train, format!("this run {how}"))
                    .note("a run holds every float in its own type (f32; the 16-bit type of `precision: bf16 | f16`, master weights f32; f64 with `--f64`): declared float types are checked, not stored")
                    .help(help)
            }
            DataUnreadable { span, path, reason } => d(Code::E0304, format!("cannot read the data `{path}`: {reason}"), *span, "named here".into())
                .help("paths in a `.shard` file are relative to that file; `--data` paths to the working directory"),
            DataMismatch { span, path, message, label, help } => {
                let x = d(Code::E0305, format!("`{path}` {message}"), *span, label.to_string());
                match help { Some(h) => x.help(h.clone()), None => x }
            }
            DataOutOfRange { span, message, label, help } => d(Code::E0306, message.clone(), *span, label.clone()).help(help.clone())
                .note("an id outside the table would silently embed as zeros or index past the logits"),
            UnmatchedGroup { span, pattern, option, model, near } => {
                let d0 = d(Code::W0003, format!("`{pattern}` in `{option}` names no parameter of `{model}`"), *span, "no parameter's path contains it".into())
                    .note(format!("`{option}` applies to the parameters whose dotted path (as `shardc lower` lists them) contains one of its names"));
                match (near.as_slice(), super::did_you_mean(pattern, near.iter().map(|s| s.as_str()))) {
                    ([], _) => d0,
                    (_, Some(s)) => d0.help(format!("did you mean `{s}`?")).fix(*span, s),
                    (names, None) => d0.help(format!("the paths of `{model}`'s parameters are made of {}, … (`shardc lower` lists them)", names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "))),
                }
            }
            // Calls per step are the plan's (`world::calls_per_step`).
            Reshard { span, what, from, to, bytes } => d(Code::N0001, format!("inserted {what}: {from} → {to}"), *span, format!("{bytes} per call")),
        }
    }
}

/// E0700's wording.
#[allow(clippy::too_many_arguments)]
fn no_layout_fits(
    span: Span,
    model: &str,
    device: &str,
    memory: f64,
    peak: f64,
    mesh: &[(String, i64)],
    smallest_device: Option<&str>,
    smallest_mesh: Option<&[(String, i64)]>,
    bf16: bool,
) -> Diagnostic {
    use crate::units::human_bytes;
    let sizes = |m: &[(String, i64)]| {
        m.iter()
            .map(|(a, n)| format!("{a}={n}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let devices: i64 = mesh.iter().map(|m| m.1).product();
    let mut x = Diagnostic::new(
        Code::E0700,
        format!("no layout of `{model}` on {devices} devices fits the {device}'s {}: the best peaks at {} per device", human_bytes(memory), human_bytes(peak)),
        Label::new(span, format!("laid out on --mesh {}", sizes(mesh))),
    )
    .note("the binding constraint is memory: every layout the checker accepts was planned, and the smallest peak is the one above");
    let mut ways = Vec::new();
    if let Some(m) = smallest_mesh {
        ways.push(format!(
            "a mesh of {} devices (`--mesh {}`)",
            m.iter().map(|x| x.1).product::<i64>(),
            sizes(m)
        ));
    }
    if let Some(d) = smallest_device {
        ways.push(format!("a device with more memory (`--device {d}`)"));
    }
    if !ways.is_empty() {
        x = x.help(format!("the same layout fits on {}", ways.join(", or on ")));
    }
    if !bf16 {
        x = x
            .note("`--allow-bf16` lets the search also try mixed precision (a change of numerics)");
    }
    x
}
