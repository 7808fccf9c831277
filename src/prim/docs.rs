//! What the language reference and the editor grammars say about the ops,
//! derived from the registry: `tests/registry.rs` keeps `docs/language.md`
//! and `editors/` equal to these (and rewrites them with `SHARDC_BLESS=1`).

use super::{defs, Kind};

/// The reference table of one kind of op: a row per op, its signature and
/// its typing and sharding rule.
pub fn reference(kind: Kind) -> String {
    let head = match kind {
        Kind::Operator => "| Operation | Sharding rule |\n|---|---|\n",
        Kind::Function => "| Function | Sharding rule |\n|---|---|\n",
        Kind::Collective => "| Collective | Rule |\n|---|---|\n",
    };
    let mut s = head.to_string();
    for d in defs().filter(|d| d.kind == kind) {
        s.push_str(&format!("| `{}` | {} |\n", d.signature, d.rule));
    }
    s
}

/// The names a `.shard` file calls ops of `kind` by (functions or collectives).
pub fn names(kind: Kind) -> Vec<&'static str> {
    defs()
        .filter(|d| d.kind == kind && kind != Kind::Operator)
        .map(|d| d.name)
        .collect()
}

/// Names written like calls that are neither ops nor words of a vocabulary
/// (layer constructs, initializers, table placement): editors highlight them
/// as library functions, with the call-shaped words of `crate::vocab`
/// (optimizers, schedules, data sources).
pub const LIBRARY: &[&str] = &[
    "repeat",
    "shard_params",
    "normal",
    "truncated_normal",
    "uniform",
    "constant",
    "rows",
];
