//! What the language reference, `shardc explain E0301` and the editor
//! grammars say about the vocabularies, derived from the registry:
//! `tests/registry.rs` keeps `docs/language.md`, `docs/errors/E0301.md` and
//! `editors/` equal to these (and rewrites them with `SHARDC_BLESS=1`).

use super::{
    Arg, Entry, Field, Vocab, Word, DATA_SOURCES, LOG_SINKS, LOSSES, LR_SCHEDULES, METRICS,
    OPTIMIZERS, PIPELINE_SCHEDULES, PRECISIONS, TABLE_OPTIONS, TRAIN_OPTIONS,
};

/// Every generated table of `docs/language.md`: the name of its region
/// (`<!-- vocabulary: NAME ... -->`) and its text.
pub fn reference() -> Vec<(&'static str, String)> {
    vec![
        ("train options", options(&TRAIN_OPTIONS, "Field")),
        ("table options", options(&TABLE_OPTIONS, "Field")),
        ("optimizers", optimizers()),
        ("optimizer arguments", optimizer_arguments()),
        (
            "schedules",
            words(&LR_SCHEDULES, "Schedule", "Learning rate at step `s`"),
        ),
        ("data sources", words(&DATA_SOURCES, "Source", "Examples")),
        ("losses", words(&LOSSES, "Loss", "Targets and value")),
        ("metrics", metrics()),
        ("logs", words(&LOG_SINKS, "Log", "Writes")),
        ("precisions", words(&PRECISIONS, "Precision", "Computes in")),
        (
            "pipeline schedules",
            words(&PIPELINE_SCHEDULES, "Schedule", "Order of the passes"),
        ),
    ]
}

/// `(every` required; `keep`: `1`)`: which arguments are required, and the
/// others' defaults.
fn defaults(args: &[Arg]) -> String {
    let required: Vec<String> = args
        .iter()
        .filter(|a| a.required())
        .map(|a| format!("`{}`", a.name))
        .collect();
    let mut parts = Vec::new();
    if !required.is_empty() {
        parts.push(format!("{} required", required.join(", ")));
    }
    for a in args {
        if let Some(d) = a.omitted.describe() {
            parts.push(format!("`{}`: {d}", a.name));
        }
    }
    parts.join("; ")
}

fn options<T>(v: &Vocab<Field<T>>, head: &str) -> String {
    let mut s = format!("| {head} | Meaning | Live reload |\n|---|---|---|\n");
    for f in v.defs {
        let mut doc = if f.required {
            format!("required; {}", f.doc)
        } else {
            f.doc.to_string()
        };
        if !f.args.is_empty() {
            doc.push_str(&format!(" ({})", defaults(f.args)));
        }
        s.push_str(&format!(
            "| `{}` | {doc} | {} |\n",
            f.signature(),
            f.reload.describe()
        ));
    }
    s
}

fn words<T>(v: &Vocab<Word<T>>, head: &str, what: &str) -> String {
    let with_args = v.defs.iter().any(|w| !w.args.is_empty());
    let mut s = if with_args {
        format!("| {head} | {what} | Arguments left out |\n|---|---|---|\n")
    } else {
        format!("| {head} | {what} |\n|---|---|\n")
    };
    for w in v.defs {
        if with_args {
            s.push_str(&format!(
                "| `{}` | {} | {} |\n",
                w.signature(),
                w.doc,
                defaults(w.args)
            ));
        } else {
            s.push_str(&format!("| `{}` | {} |\n", w.name, w.doc));
        }
    }
    s
}

fn optimizers() -> String {
    let mut s = "| Optimizer | What it is | Arguments left out |\n|---|---|---|\n".to_string();
    for w in OPTIMIZERS.defs {
        s.push_str(&format!(
            "| `{}` | {} | {} |\n",
            w.signature(),
            w.doc,
            defaults(w.args)
        ));
    }
    s
}

/// Each argument any optimizer takes, once.
fn optimizer_arguments() -> String {
    let mut s = "| Argument | Takes | Meaning |\n|---|---|---|\n".to_string();
    let mut seen: Vec<&str> = Vec::new();
    for a in OPTIMIZERS.defs.iter().flat_map(|w| w.args) {
        if seen.contains(&a.name) {
            continue;
        }
        seen.push(a.name);
        s.push_str(&format!(
            "| `{}` | {} | {} |\n",
            a.name,
            a.value.describe(),
            a.doc
        ));
    }
    s
}

fn metrics() -> String {
    let mut s = "| Metric | Losses | Meaning |\n|---|---|---|\n".to_string();
    for m in METRICS.defs {
        let losses: Vec<String> = m.losses.iter().map(|l| format!("`{}`", l.name())).collect();
        s.push_str(&format!(
            "| `{}` | {} | {} |\n",
            m.name,
            losses.join(", "),
            m.doc
        ));
    }
    s
}

fn quoted<D: Entry>(v: &Vocab<D>) -> String {
    v.defs
        .iter()
        .map(|d| format!("`{}`", d.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names E0301 ("unknown optimizer, schedule, ...") explains, as the
/// list in `docs/errors/E0301.md` (and so in `shardc explain E0301`).
pub fn unknown_choices() -> String {
    let tables: Vec<String> = OPTIMIZERS
        .defs
        .iter()
        .filter(|w| w.tag.tables_only())
        .map(|w| format!("`{}`", w.name))
        .collect();
    let mut s = format!("- optimizers: {}", quoted(&OPTIMIZERS));
    if !tables.is_empty() {
        s.push_str(&format!(" ({} for tables only)", tables.join(", ")));
    }
    s.push('\n');
    for (what, list) in [
        ("learning-rate schedules", quoted(&LR_SCHEDULES)),
        ("data sources", quoted(&DATA_SOURCES)),
        (
            "losses",
            format!("{} (or a `fn` of the model)", quoted(&LOSSES)),
        ),
        ("metrics", quoted(&METRICS)),
        ("precisions", quoted(&PRECISIONS)),
        ("logs", quoted(&LOG_SINKS)),
        (
            "pipeline schedules (`repeat(..., schedule: ...)`)",
            quoted(&PIPELINE_SCHEDULES),
        ),
    ] {
        s.push_str(&format!("- {what}: {list}\n"));
    }
    s
}

/// Names written like calls (`adam(lr: 1e-3)`): optimizers, learning-rate
/// schedules and data sources. Editors highlight them as library functions.
pub fn calls() -> Vec<&'static str> {
    let mut v = OPTIMIZERS.names();
    v.extend(LR_SCHEDULES.names());
    v.extend(DATA_SOURCES.names());
    v
}

/// Bare names with a meaning as option values (`loss: mse`, `optimizer:
/// adam`, `metrics: [auc]`, `schedule: gpipe`). Editors highlight them as
/// constants.
pub fn constants() -> Vec<&'static str> {
    let mut v = LOSSES.names();
    v.extend(METRICS.names());
    v.extend(OPTIMIZERS.names());
    v.extend(PIPELINE_SCHEDULES.names());
    v.extend(LOG_SINKS.names());
    v
}

/// The precisions (dtype names, which editors highlight as types).
pub fn precisions() -> Vec<&'static str> {
    PRECISIONS.names()
}

/// A word as an editor's hover shows it: how it is written, what it is,
/// its row of the reference, and its arguments with their defaults.
pub fn hover(what: &str, e: &dyn Entry) -> String {
    let mut s = format!("```shard\n{}\n```\n{what}: {}", e.signature(), e.doc());
    for a in e.args() {
        let default = a
            .omitted
            .describe()
            .map_or("required".to_string(), |d| format!("default {d}"));
        s.push_str(&format!(
            "\n- `{}`: {} ({}; {default})",
            a.name,
            a.doc,
            a.value.describe()
        ));
    }
    s
}

/// A `train` or `table` option as completion and hover show it.
pub fn option_detail<T>(f: &Field<T>) -> String {
    let mut s = f.doc.to_string();
    if f.required {
        s.push_str(" (required)");
    }
    s.push_str(&format!("; live reload: {}", f.reload.describe()));
    s
}
