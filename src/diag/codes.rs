//! Every diagnostic code, its one-line title and its explanation file
//! (`docs/errors/CODE.md`, served by `shardc explain`).

use super::Severity;

macro_rules! codes {
    ($($name:ident => $title:literal,)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $($name,)* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$name,)*];
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$name => stringify!($name),)* }
            }
            pub fn title(self) -> &'static str {
                match self { $(Code::$name => $title,)* }
            }
            pub fn explanation(self) -> &'static str {
                match self {
                    $(Code::$name => include_str!(concat!("../../docs/errors/", stringify!($name), ".md")),)*
                }
            }
        }
    };
}

codes! {
    E0001 => "syntax error",
    E0002 => "invalid literal",
    E0003 => "nested or chained too deeply",
    E0004 => "source is not UTF-8 text",
    E0005 => "name too long",
    E0100 => "unknown name",
    E0101 => "duplicate definition",
    E0102 => "import not found",
    E0103 => "recursive import",
    E0104 => "wrong number of arguments",
    E0105 => "unknown or missing named argument",
    E0106 => "wrong kind of value",
    E0107 => "not callable",
    E0108 => "layer or model without `forward`",
    E0109 => "unknown pragma",
    E0200 => "unknown mesh axis",
    E0201 => "mesh axis used twice in one type",
    E0202 => "invalid mesh",
    E0203 => "sharded dimension not divisible by its mesh axes",
    E0204 => "attention heads not divisible by the model-parallel axis",
    E0205 => "dimension is not a positive integer",
    E0206 => "reshape changes the number of elements",
    E0207 => "reshape splits or moves a sharded dimension",
    E0208 => "contraction dimensions do not match",
    E0209 => "shapes cannot be broadcast together",
    E0210 => "dtype mismatch",
    E0211 => "rank mismatch",
    E0212 => "value does not match its declared type",
    E0213 => "ambiguous sharding",
    E0214 => "pending reduction used as a reduced value",
    E0215 => "invalid collective",
    E0216 => "implicit collective not allowed here",
    E0217 => "invalid einsum specification",
    E0218 => "dimension index out of range",
    E0219 => "recursive layer",
    E0220 => "pipeline axis used inside its stages",
    E0221 => "size of a trained model's input not known",
    E0222 => "count out of range for its dimension",
    E0223 => "side inputs to a pipelined stack",
    E0224 => "added loss or observed value of the wrong kind",
    E0225 => "computed initial value is not a whole constant",
    E0226 => "invalid loss function",
    E0227 => "split sizes do not fit the dimension",
    E0228 => "checkpoint policy names an unknown value",
    E0229 => "a dimension split both by its size argument and by its type",
    E0230 => "`step_total` of a value that is not data",
    E0231 => "pipeline schedule does not fit the stack",
    E0232 => "schedule file cannot be read",
    E0233 => "pipeline schedule cannot run",
    E0300 => "unknown or missing field",
    E0301 => "unknown optimizer, schedule, loss or data source",
    E0302 => "invalid option value",
    E0303 => "batch not divisible by the data axes",
    E0304 => "data file cannot be read",
    E0305 => "data does not fit the model",
    E0306 => "id outside the vocabulary",
    E0307 => "output directory outside the run directory",
    E0308 => "metric not defined for the loss",
    E0400 => "unknown combiner",
    E0401 => "invalid embedding table",
    E0402 => "feature inconsistent with its table",
    E0403 => "frozen table given an optimizer",
    E0500 => "invalid layer directive",
    E0600 => "invalid weight map",
    E0601 => "parameter no weight-map rule names",
    E0602 => "parameter two weight-map rules name",
    E0603 => "weight-map layout does not fit its parameter",
    E0700 => "no layout fits the device",
    N0001 => "collective inserted by the compiler",
    W0001 => "fewer microbatches than pipeline stages",
    W0002 => "a weight declared in a float type the run does not hold",
    W0003 => "a parameter group names no parameter",
    W0004 => "a weight-map rule names no parameter",
    W0005 => "a weight is never used",
    W0006 => "a `let` is never used",
    W0007 => "an import is never used",
}

/// The codes whose help quotes text (a backticked snippet) but names no one
/// edit a tool could make, with why: a template the user completes, a choice
/// between alternatives, or an edit outside the `.shard` file. Every other
/// code whose help quotes text offers a quick fix; `tests/fixes.rs` holds
/// the two lists to each other.
pub const NO_FIX: &[(Code, &str)] = &[
    (Code::E0003, "the nesting is split where the user chooses, into `let`s or declarations"),
    (Code::E0102, "the file meant is not known: the help shows how imports are written"),
    (Code::E0107, "what was meant to be called is not known: the help points to the built-ins"),
    (Code::E0108, "a template: the `forward` the user writes"),
    (Code::E0202, "a choice among mesh kinds or values (`sparsecores: 4` is an example)"),
    (Code::E0213, "a template: the layout the user wants on the result"),
    (Code::E0215, "a choice: gather the pieces, or reduce over the dimension first"),
    (Code::E0217, "an example of the einsum notation, not the user's specification"),
    (Code::E0220, "a choice: split the stage's tensors over another axis, or stage over another axis"),
    (Code::E0221, "a template: the size of the input, which only the user knows"),
    (Code::E0222, "a choice: take fewer elements, or work along another dimension"),
    (Code::E0224, "a recipe: which reduction the added loss or observed value wants is the user's"),
    (Code::E0225, "an explanation of what a computed `init` may read; the value is the user's"),
    (Code::E0226, "a template: the loss function's signature or its reduction"),
    (Code::E0229, "a choice among three ways to split the dimension"),
    (Code::E0230, "a choice of the value `step_total` sums, or where it is called"),
    (Code::E0232, "the edit is in the schedule file, or a choice between renumbering and `microbatches:`"),
    (Code::E0233, "the edit is in the schedule file, where the user places the pass"),
    (Code::E0304, "an explanation of how paths resolve; the file meant is not known"),
    (Code::E0305, "the edit is in the data file, or a choice between the data and the model"),
    (Code::E0306, "the edit is in the data, or a choice of the ids that must not count"),
    (Code::E0307, "a choice: a directory inside the run directory, or `--allow-path` on the command line"),
    (Code::E0308, "a choice: another loss, or drop the metric"),
    (Code::E0403, "a choice: remove the table's optimizer, or unfreeze the table"),
    (Code::E0600, "the edit is in the weight map: the help lists what a map may hold"),
    (Code::E0601, "the edit is in the weight map: a new rule, whose source tensor only the user knows"),
    (Code::W0002, "declaring the weight `f32` changes the type of every use: the casts around them are the user's"),
    (Code::W0004, "the edit is in the weight map, and the parameter meant is not known"),
];

impl Code {
    /// Why this code's help names no quick fix, when it is one of [`NO_FIX`].
    pub fn no_fix(self) -> Option<&'static str> {
        NO_FIX.iter().find(|(c, _)| *c == self).map(|(_, why)| *why)
    }
    pub fn severity(self) -> Severity {
        match self.as_str().as_bytes()[0] {
            b'W' => Severity::Warning,
            b'N' => Severity::Note,
            _ => Severity::Error,
        }
    }
    /// Whether the code marks what can be removed (an unused weight, `let`
    /// or import): editors fade it.
    pub fn unnecessary(self) -> bool {
        matches!(self, Code::W0005 | Code::W0006 | Code::W0007)
    }
    pub fn parse(s: &str) -> Option<Code> {
        let s = s.trim().to_ascii_uppercase();
        Code::ALL.iter().copied().find(|c| c.as_str() == s)
    }
}
