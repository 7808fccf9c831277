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

impl Code {
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
