//! The registry of every vocabulary other than ops: the words a `.shard`
//! file may write as a `train` or `table` option, an optimizer, a
//! learning-rate schedule, a data source, a loss, a metric, a precision or a
//! pipeline schedule. Each word is defined once, here, with its typed tag,
//! its documentation and its arguments (with their defaults); everything else
//! is derived from these tables or checked against them:
//!
//! - the spec reads names through them (`from_name`; did-you-mean from
//!   [`Vocab::names`], `crate::diag::did_you_mean`) and turns each tag into
//!   its typed value with an exhaustive `match`, so a tag nobody wired does
//!   not compile;
//! - `shardc explain E0301`, the reference tables of `docs/language.md`, LSP
//!   completion and hover, and the three editor grammars are generated from
//!   them ([`docs`]; `tests/registry.rs` keeps the generated text in step and
//!   checks that each registered word builds the typed value it names);
//! - live reload reads each option's [`Reload`] declaration.
//!
//! Ops have their own registry, `crate::prim`. Adding a word is one entry in
//! one of the `vocabulary!` lists of `optim.rs`, `words.rs` or `options.rs`
//! (and, for a word with behaviour, the `match` arms the compiler then asks
//! for).

pub mod docs;
mod optim;
mod options;
mod words;

pub use optim::{Lr, Opt, LR_SCHEDULES, OPTIMIZERS};
pub use options::{TableOption, TrainOption, TABLE_OPTIONS, TRAIN_OPTIONS};
pub use words::{
    DataSource, LogSink, Loss, Metric, MetricDef, Pipe, Precision, DATA_SOURCES, LOG_SINKS, LOSSES,
    METRICS, PIPELINE_SCHEDULES, PRECISIONS,
};

/// How an argument's value is checked (each kind has its diagnostic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// An integer of at least 1, written or a constant.
    Count,
    /// Any number.
    Number,
    /// Any integer (negative too), written or a constant.
    Integer,
    /// A number above 0.
    Positive,
    /// A number in [0, 1).
    Unit,
    /// `true` or `false`.
    Flag,
    /// A string: a path (relative to the `.shard` file, or inside the run
    /// directory for outputs).
    Path,
    /// A string: a name in a file (a table's column).
    Name,
    /// A positive number, or a learning-rate schedule ([`LR_SCHEDULES`]).
    Lr,
    /// A list of name patterns, `[norm, bias]`: a parameter matches when its
    /// dotted path contains one.
    Patterns,
    /// Name patterns with a factor each, `{ embed: 0.1 }`.
    Scales,
}

impl Value {
    /// What the reference says it takes.
    pub fn describe(self) -> &'static str {
        match self {
            Value::Count => "an integer ≥ 1",
            Value::Number => "a number",
            Value::Integer => "an integer",
            Value::Positive => "a number > 0",
            Value::Unit => "a number in [0, 1)",
            Value::Flag => "`true` or `false`",
            Value::Path => "a string",
            Value::Name => "a string (a name)",
            Value::Lr => "a number > 0 or a schedule",
            Value::Patterns => "a list of names, `[norm, bias]`",
            Value::Scales => "names with a factor each, `{ embed: 0.1 }`",
        }
    }
}

/// What an argument is when a source leaves it out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Omitted {
    /// It must be given (E0105).
    Required,
    /// This number.
    Is(f64),
    /// This flag.
    Flag(bool),
    /// Something the rest of the file decides, as the reference says it.
    From(&'static str),
}

impl Omitted {
    /// The default as a number (`None`: required, or decided elsewhere).
    pub fn number(self) -> Option<f64> {
        match self {
            Omitted::Is(v) => Some(v),
            Omitted::Flag(b) => Some(f64::from(u8::from(b))),
            Omitted::Required | Omitted::From(_) => None,
        }
    }
    /// The default as the reference writes it (`None`: required).
    pub fn describe(self) -> Option<String> {
        match self {
            Omitted::Required => None,
            // Whole numbers as integers, others as written in a source.
            Omitted::Is(v) if v == v.trunc() => Some(format!("`{v}`")),
            Omitted::Is(v) => Some(format!("`{v:?}`")),
            Omitted::Flag(b) => Some(format!("`{b}`")),
            Omitted::From(s) => Some(s.to_string()),
        }
    }
}

/// A named argument of a call-shaped word (`adam(lr: 1e-3, b1: 0.9)`), or a
/// field of a block-valued option (`eval: { every: 10 }`).
#[derive(Clone, Copy, Debug)]
pub struct Arg {
    pub name: &'static str,
    pub value: Value,
    pub omitted: Omitted,
    pub doc: &'static str,
}

impl Arg {
    pub const fn new(name: &'static str, value: Value, omitted: Omitted, doc: &'static str) -> Arg {
        Arg {
            name,
            value,
            omitted,
            doc,
        }
    }
    pub fn required(&self) -> bool {
        self.omitted == Omitted::Required
    }
}

/// A word that names a choice: an optimizer, a schedule, a data source, a
/// loss, a precision, a pipeline schedule.
#[derive(Debug)]
pub struct Word<T: 'static> {
    pub tag: T,
    pub name: &'static str,
    /// Its row of the reference (Markdown).
    pub doc: &'static str,
    /// Its named arguments, in the order the reference lists them.
    pub args: &'static [Arg],
}

/// How live reload (`shardc run --watch`) treats an edit of an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// Applied from the next step, the run's state kept.
    Live,
    /// Kept as the run started; the new value applies when the run restarts
    /// (the reload's summary names it).
    Restart,
    /// An edit that changes it is refused, with the reason.
    Refused,
}

impl Reload {
    /// As the reference's column says it.
    pub fn describe(self) -> &'static str {
        match self {
            Reload::Live => "applies",
            Reload::Restart => "at restart",
            Reload::Refused => "refused",
        }
    }
}

/// An option of a `train` or `table` declaration.
#[derive(Debug)]
pub struct Field<T: 'static> {
    pub tag: T,
    pub name: &'static str,
    /// Its row of the reference (Markdown).
    pub doc: &'static str,
    /// Whether the declaration must give it (E0300).
    pub required: bool,
    /// What live reload does with an edit of it.
    pub reload: Reload,
    /// The fields of an options-block value (`checkpoint: { every, dir }`).
    pub args: &'static [Arg],
}

/// What every entry of a registry says, for the generic lists.
pub trait Entry {
    fn name(&self) -> &'static str;
    fn doc(&self) -> &'static str;
    fn args(&self) -> &'static [Arg];
    /// The entry as a reference writes it: `adam(lr, b1, b2, eps)`.
    fn signature(&self) -> String {
        let args = self.args();
        if args.is_empty() {
            self.name().to_string()
        } else {
            let names: Vec<&str> = args.iter().map(|a| a.name).collect();
            format!("{}({})", self.name(), names.join(", "))
        }
    }
    /// The argument `name`.
    fn arg(&self, name: &str) -> Option<&'static Arg> {
        self.args().iter().find(|a| a.name == name)
    }
}

impl<T> Entry for Word<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn args(&self) -> &'static [Arg] {
        self.args
    }
}

impl<T> Entry for Field<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn args(&self) -> &'static [Arg] {
        self.args
    }
    /// `eval: { every, steps }`, or the bare name.
    fn signature(&self) -> String {
        if self.args.is_empty() {
            self.name.to_string()
        } else {
            let names: Vec<&str> = self.args.iter().map(|a| a.name).collect();
            format!("{}: {{ {} }}", self.name, names.join(", "))
        }
    }
}

/// One vocabulary: what diagnostics call its words, and its entries.
#[derive(Debug)]
pub struct Vocab<D: 'static> {
    /// As a diagnostic says it: "unknown {what} `x`".
    pub what: &'static str,
    pub defs: &'static [D],
}

impl<D: Entry> Vocab<D> {
    /// The entry called `name`.
    pub fn find(&self, name: &str) -> Option<&'static D> {
        self.defs.iter().find(|d| d.name() == name)
    }
    /// Every name, in registry order.
    pub fn names(&self) -> Vec<&'static str> {
        self.defs.iter().map(|d| d.name()).collect()
    }
}

/// The call-shaped word `name` (an optimizer, a learning-rate schedule or a
/// data source) and what it is ("optimizer").
pub fn call(name: &str) -> Option<(&'static str, &'static dyn Entry)> {
    fn of<T>(v: &'static Vocab<Word<T>>, name: &str) -> Option<(&'static str, &'static dyn Entry)> {
        v.find(name).map(|w| (v.what, w as &dyn Entry))
    }
    of(&OPTIMIZERS, name)
        .or_else(|| of(&LR_SCHEDULES, name))
        .or_else(|| of(&DATA_SOURCES, name))
}

/// Any word `name` of a vocabulary a value may name (the call-shaped ones,
/// losses, metrics, pipeline schedules) and what it is. Not the precisions:
/// those are dtype names, which editors treat as types.
pub fn word(name: &str) -> Option<(&'static str, &'static dyn Entry)> {
    fn of<D: Entry>(
        v: &'static Vocab<D>,
        name: &str,
    ) -> Option<(&'static str, &'static dyn Entry)> {
        v.find(name).map(|w| (v.what, w as &dyn Entry))
    }
    call(name)
        .or_else(|| of(&LOSSES, name))
        .or_else(|| of(&METRICS, name))
        .or_else(|| of(&PIPELINE_SCHEDULES, name))
}

/// Declares a vocabulary: its tag enum (one variant per word, plus
/// `unnamed` variants that a source never writes) and its registry, with
/// `def`, `name`, `from_name` and `ALL` on the tag. The entries are listed
/// in variant order, so a tag's entry is found by its discriminant: every
/// named variant has exactly one entry by construction.
macro_rules! vocabulary {
    (
        $(#[$meta:meta])*
        pub enum $Tag:ident: $Def:ident in $TABLE:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $Variant:ident { $($body:tt)* } )*
        }
        unnamed ($other:literal) { $( $(#[$umeta:meta])* $Unnamed:ident )* }
    ) => {
        $(#[$meta])*
        pub enum $Tag {
            $( $(#[$vmeta])* $Variant, )*
            $( $(#[$umeta])* $Unnamed, )*
        }

        #[doc = concat!("Every ", $what, " a source may name: the registry of [`", stringify!($Tag), "`].")]
        pub static $TABLE: $crate::vocab::Vocab<$Def<$Tag>> = $crate::vocab::Vocab {
            what: $what,
            defs: &[ $( $Def { tag: $Tag::$Variant, $($body)* }, )* ],
        };

        impl $Tag {
            /// Every named variant, in registry order.
            pub const ALL: &'static [$Tag] = &[ $($Tag::$Variant,)* ];
            /// Its registry entry (`None`: a source never names it).
            pub fn def(self) -> Option<&'static $Def<$Tag>> {
                $TABLE.defs.get(self as usize)
            }
            /// Its name in a source (or as messages call an unnamed one).
            pub fn name(self) -> &'static str {
                self.def().map_or($other, |d| d.name)
            }
            /// The word a source names (`None`: not one of them).
            pub fn from_name(name: &str) -> Option<$Tag> {
                $TABLE.defs.iter().find(|d| d.name == name).map(|d| d.tag)
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $Tag:ident: $Def:ident in $TABLE:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $Variant:ident { $($body:tt)* } )*
        }
    ) => {
        $(#[$meta])*
        pub enum $Tag {
            $( $(#[$vmeta])* $Variant, )*
        }

        #[doc = concat!("Every ", $what, " a source may name: the registry of [`", stringify!($Tag), "`].")]
        pub static $TABLE: $crate::vocab::Vocab<$Def<$Tag>> = $crate::vocab::Vocab {
            what: $what,
            defs: &[ $( $Def { tag: $Tag::$Variant, $($body)* }, )* ],
        };

        impl $Tag {
            /// Every variant, in registry order.
            pub const ALL: &'static [$Tag] = &[ $($Tag::$Variant,)* ];
            /// Its registry entry.
            pub fn def(self) -> &'static $Def<$Tag> {
                &$TABLE.defs[self as usize]
            }
            /// Its name in a source.
            pub fn name(self) -> &'static str {
                self.def().name
            }
            /// The word a source names (`None`: not one of them).
            pub fn from_name(name: &str) -> Option<$Tag> {
                $TABLE.defs.iter().find(|d| d.name == name).map(|d| d.tag)
            }
        }
    };
}
use vocabulary;
