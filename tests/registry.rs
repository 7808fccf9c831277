//! The registries are the one definition of every op (`src/prim`) and of
//! every other word (`src/vocab`: optimizers, schedules, data sources,
//! losses, metrics, precisions, pipeline schedules, `train` and `table`
//! options). This test fails when a registered op lacks a forward kernel or a
//! derivative (where it is differentiable), a cost for `shardc plan`, its row
//! of the language reference, or its name in an editor grammar; and when a
//! registered word lacks its row of the reference, its place in `shardc
//! explain E0301` or in an editor grammar, or builds another kind than the one
//! it names (a data source wired to synthetic data, an optimizer to Adam), or
//! live reload treats an option otherwise than it declares. The reference
//! tables, the explanation's list and the grammars' name lists are generated
//! from the registries; `SHARDC_BLESS=1` rewrites them.

mod harness;

use shardc::prim::docs::{names, reference, LIBRARY};
use shardc::prim::{defs, Def, Kind, Prim};
use shardc::spmd::Op;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn bless() -> bool {
    std::env::var_os("SHARDC_BLESS").is_some()
}

/// Replace the text between the line containing `start` and the next line
/// containing `end` with `body`; returns whether the file was already so.
fn region(path: &Path, start: &str, end: &str, body: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let a = text
        .find(start)
        .ok_or_else(|| format!("{}: no `{start}` marker", path.display()))?;
    let a = a + text[a..].find('\n').unwrap_or(0) + 1;
    let b = a + text[a..]
        .find(end)
        .ok_or_else(|| format!("{}: no `{end}` after `{start}`", path.display()))?;
    let b = text[..b].rfind('\n').map_or(b, |i| i + 1);
    if text[a..b] == *body {
        return Ok(());
    }
    if bless() {
        let new = format!("{}{}{}", &text[..a], body, &text[b..]);
        std::fs::write(path, new).map_err(|e| e.to_string())?;
        return Ok(());
    }
    Err(format!(
        "{}: the part generated from the registry is out of date (SHARDC_BLESS=1 cargo test --test registry rewrites it); it should read:\n{body}",
        path.display()
    ))
}

#[test]
fn the_language_reference_has_a_row_for_every_op() {
    let doc = root().join("docs/language.md");
    let mut errs = Vec::new();
    for (kind, name) in [
        (Kind::Operator, "operators"),
        (Kind::Function, "functions"),
        (Kind::Collective, "collectives"),
    ] {
        if let Err(e) = region(
            &doc,
            &format!("<!-- registry: {name} "),
            "<!-- /registry -->",
            &reference(kind),
        ) {
            errs.push(e);
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n\n"));
}

/// The weight-map keys' table is the registry's (`shardc::weights::MAP_KEYS`,
/// `RULE_KEYS`).
#[test]
fn the_language_reference_lists_every_weight_map_key() {
    let mut body = String::from("| key | meaning |\n|---|---|\n");
    for (k, what) in shardc::weights::MAP_KEYS {
        body.push_str(&format!("| `{k}` | {what} |\n"));
    }
    for (k, what) in shardc::weights::RULE_KEYS {
        body.push_str(&format!("| `[[tensor]]` `{k}` | {what} |\n"));
    }
    let doc = root().join("docs/language.md");
    let got = region(
        &doc,
        "<!-- registry: weight map keys ",
        "<!-- /registry -->",
        &body,
    );
    assert!(got.is_ok(), "{}", got.err().unwrap_or_default());
}

/// `words` as lines of `prefix` followed by names, at most ~90 columns.
fn wrapped(prefix: &str, words: &[&str], sep: &str, quote: bool) -> String {
    let mut out = String::new();
    let mut line = prefix.to_string();
    for w in words {
        let w = if quote {
            format!("\"{w}\"")
        } else {
            w.to_string()
        };
        if line.len() + w.len() > 88 && line.len() > prefix.len() {
            out.push_str(line.trim_end());
            out.push('\n');
            line = prefix.to_string();
        }
        line.push_str(&w);
        line.push_str(sep);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// The collectives whose positional arguments from `k` on are mesh axes, by
/// `k` (the place of `ax` in the signature: `psum(x, ax, ...)` is 1,
/// `axis_index(ax)` 0). Editors highlight those arguments as axes.
fn axis_arguments() -> Vec<(usize, Vec<&'static str>)> {
    let mut by: Vec<(usize, Vec<&'static str>)> = Vec::new();
    for d in defs().filter(|d| d.kind == Kind::Collective) {
        let args = d
            .signature
            .split_once('(')
            .and_then(|(_, a)| a.rsplit_once(')'))
            .map_or("", |(a, _)| a);
        let positional = args.split(',').map(str::trim).filter(|a| !a.contains(':'));
        let Some(k) = positional.clone().position(|a| a == "ax") else {
            continue;
        };
        match by.iter_mut().find(|(j, _)| *j == k) {
            Some((_, v)) => v.push(d.name),
            None => by.push((k, vec![d.name])),
        }
    }
    by.sort();
    by
}

/// A regular expression (Oniguruma, for TextMate) for the collectives `names`
/// called with mesh axes from their `k`-th positional argument on: group 1 the
/// name, 2 the `(`, 3 the arguments before the axes, 4 the axes.
fn tm_collective(k: usize, names: &[&str]) -> String {
    let ident = "[A-Za-z_][A-Za-z0-9_]*";
    // An argument: anything but `,` and brackets, or brackets nested two deep.
    let arg = r"(?:[^,()\[\]]|\((?:[^()]|\([^()]*\))*\)|\[[^\[\]]*\])*";
    let before = (0..k).map(|_| format!("{arg},")).collect::<String>();
    let axis = format!(r"\s*{ident}\b(?!\s*[:(\[@.])\s*");
    format!(
        r"\b({})\s*(\()({before})({axis}(?:,{axis})*)",
        names.join("|")
    )
}

#[test]
fn every_editor_grammar_names_every_op() {
    let functions = names(Kind::Function);
    let collectives = names(Kind::Collective);
    let axes = axis_arguments();
    assert!(
        axes.iter().any(|(_, v)| v.contains(&"psum")),
        "no collective takes an axis? {axes:?}"
    );
    let mut errs = Vec::new();
    // Vim.
    let mut vim = format!(
        "{}{}",
        wrapped("syn keyword shardCollective   ", &collectives, " ", false),
        wrapped("syn keyword shardBuiltin      ", &functions, " ", false)
    );
    vim.push_str("\" A collective's mesh axes: `psum(x, mp)`, `all_gather(x, mp, dim: 1)`.\n");
    for (k, names) in &axes {
        let arg = r"\%([^,()]\|([^()]*)\)*,";
        vim.push_str(&format!(
            "syn match   shardCollectiveAxis \"\\%(\\<\\%({}\\)\\s*({}\\%(\\s*\\h\\w*\\s*,\\)*\\s*\\)\\@200<=\\h\\w*\\>\\%(\\s*[:([@.]\\)\\@!\"\n",
            names.join(r"\|"),
            arg.repeat(*k)
        ));
    }
    let vim_path = root().join("editors/vim/syntax/shard.vim");
    errs.extend(region(&vim_path, "\" registry (generated", "\" /registry", &vim).err());
    // tree-sitter (Neovim, Helix, Zed).
    let mut library: Vec<&str> = functions.clone();
    library.extend(library_calls());
    let mut every = library.clone();
    every.extend(&collectives);
    let mut ts = format!(
        "((call_expr function: (ident) @function.builtin)\n  (#any-of? @function.builtin\n{}))\n\n; collectives get a colour of their own: each one is communication.\n((call_expr function: (ident) @function.macro)\n  (#any-of? @function.macro\n{}))\n\n((call_expr function: (ident) @function.call)\n  (#not-match? @function.call \"^[A-Z]\")\n  (#not-any-of? @function.call\n{}))\n",
        wrapped("    ", &library, " ", true).trim_end(),
        wrapped("    ", &collectives, " ", true).trim_end(),
        wrapped("    ", &every, " ", true).trim_end(),
    );
    ts.push_str("\n; a collective's mesh axes: `psum(x, mp)`, `all_gather(x, mp, dim: 1)`\n");
    for (k, names) in &axes {
        ts.push_str(&format!(
            "((call_expr\n   function: (ident) @_collective\n   arguments: (call_args .{} (ident) @label))\n  (#any-of? @_collective\n{}))\n",
            " (_) .".repeat(*k).trim_end_matches(" ."),
            wrapped("    ", names, " ", true).trim_end(),
        ));
    }
    let ts_path = root().join("editors/tree-sitter-shard/queries/highlights.scm");
    errs.extend(region(&ts_path, "; registry (generated", "; /registry", &ts).err());
    // TextMate (VS Code): the two call patterns' alternations.
    let tm_path = root().join("editors/vscode/syntaxes/shard.tmLanguage.json");
    let alt = |names: &[&str]| {
        let mut v = names.to_vec();
        v.sort_by_key(|n| std::cmp::Reverse(n.len()));
        format!(
            "          \"match\": \"\\\\b({})\\\\b(?=\\\\s*\\\\()\",\n",
            v.join("|")
        )
    };
    let mut builtins = functions.clone();
    builtins.extend(["repeat", "shard_params", "freeze", "checkpoint"]);
    errs.extend(
        region(
            &tm_path,
            "\"comment\": \"collectives are highlighted apart",
            "\"name\": \"keyword.control.collective.shard\"",
            &alt(&collectives),
        )
        .err(),
    );
    errs.extend(
        region(
            &tm_path,
            "\"keyword.control.collective.shard\"",
            "\"name\": \"support.function.builtin.shard\"",
            &format!("        }},\n        {{\n{}", alt(&builtins)),
        )
        .err(),
    );
    // TextMate: a collective's axes.
    let mut tm = String::new();
    for (i, (k, names)) in axes.iter().enumerate() {
        let re = serde_json::to_string(&tm_collective(*k, names)).unwrap_or_default();
        tm.push_str(&format!(
            "        {{\n          \"match\": {re},\n          \"captures\": {{\n            \"1\": {{ \"name\": \"keyword.control.collective.shard\" }},\n            \"2\": {{ \"name\": \"punctuation.section.parens.begin.shard\" }},\n            \"3\": {{ \"patterns\": [{{ \"include\": \"$self\" }}] }},\n            \"4\": {{ \"patterns\": [{{ \"include\": \"#axis-list\" }}] }}\n          }}\n        }}{}\n",
            if i + 1 < axes.len() { "," } else { "" }
        ));
    }
    tm.push_str("      ]\n    },\n");
    errs.extend(
        region(
            &tm_path,
            "\"comment\": \"a collective's mesh axes",
            "\"axis-list\": {",
            &format!("      \"patterns\": [\n{tm}"),
        )
        .err(),
    );
    assert!(errs.is_empty(), "{}", errs.join("\n\n"));
}

/// Whether a program node runs the op `def` defines.
fn runs(def: &Def, p: &Prim) -> bool {
    match def.kind {
        Kind::Operator => matches!(
            (def.name, p),
            ("+ - * /", Prim::Arith(_)) | ("@", Prim::MatMul(_)) | ("index", Prim::Index(_))
        ),
        _ => p.get().name() == def.name,
    }
}

/// Ops the generated examples cannot build, and the tests that cover them.
const COVERED_ELSEWHERE: &[(&str, &str)] = &[
    (
        "lookup",
        "needs a table and its SparseCore placement: tests/runtime.rs finite_differences_table_lookup, tests/embed.rs",
    ),
    (
        "split",
        "several results, named by `let (a, b) =`, where the examples are single expressions: tests/split.rs",
    ),
    (
        "reshard",
        "inserted by the checker, never written: tests/runtime.rs finite_differences_collectives_and_reshards",
    ),
    (
        "loss",
        "appended by lowering for a `train`'s built-in loss, never written: tests/losses.rs (each loss against one device and finite differences)",
    ),
    (
        "metrics",
        "appended by lowering for a `train`'s metrics, never written: tests/losses.rs (accuracy and AUC on the virtual mesh)",
    ),
];

/// The example's program on a 2-device mesh, in the first operand layouts
/// the checker accepts.
fn first_that_checks(example: &str) -> Option<shardc::spmd::Program> {
    let (expr, ops) = harness::parse(example);
    let all: Vec<Vec<harness::Layout>> = ops.iter().map(|o| harness::layouts(o, &["a"])).collect();
    let mut idx = vec![0usize; all.len()];
    loop {
        let ls: Vec<&harness::Layout> = idx.iter().zip(&all).map(|(i, l)| &l[*i]).collect();
        let text = harness::model("mesh m(a: 2)", &expr, &ops, &ls);
        if let Some(p) = harness::lowered(&text, false) {
            return Some(p);
        }
        // The next combination.
        let mut k = 0;
        loop {
            if k == idx.len() {
                return None;
            }
            idx[k] += 1;
            if idx[k] < all[k].len() {
                break;
            }
            idx[k] = 0;
            k += 1;
        }
    }
}

#[test]
fn every_op_has_a_kernel_a_derivative_and_a_cost() {
    let mut errs = Vec::new();
    for def in defs() {
        if def.examples.is_empty() {
            if !COVERED_ELSEWHERE.iter().any(|(n, _)| *n == def.name) {
                errs.push(format!("`{}` has no examples", def.name));
            }
            continue;
        }
        for example in def.examples {
            let Some(prog) = first_that_checks(example) else {
                errs.push(format!(
                    "`{}`: no layout of its example `{example}` checks",
                    def.name
                ));
                continue;
            };
            let mut found = false;
            for n in &prog.nodes {
                let Op::Prim(p) = &n.op else { continue };
                if !runs(def, p) {
                    continue;
                }
                found = true;
                let ts: Vec<&shardc::types::TType> =
                    n.args.iter().map(|a| &prog.nodes[*a as usize].ty).collect();
                let cx = shardc::prim::CostCx {
                    mesh: &prog.mesh,
                    bound: &prog.bound,
                };
                if p.get().cost(&cx, &ts, &n.ty).is_none() {
                    errs.push(format!("`{}` has no cost for the plan", def.name));
                }
            }
            if !found {
                errs.push(format!(
                    "`{}`: its example `{example}` does not use it",
                    def.name
                ));
                continue;
            }
            // Forward and backward: a missing kernel or derivative is an error.
            let (params, inputs, ct) = harness::values(&prog);
            let r = shardc::runtime::probe::probe(
                &prog,
                &params,
                &inputs,
                &ct,
                candle_core::DType::F64,
                Some(1),
            );
            match r {
                Err(e) if def.differentiable || !e.message().contains("has no derivative") => {
                    errs.push(format!("`{}`: {e}", def.name))
                }
                _ => {}
            }
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

// ───────────────────────── vocabularies (src/vocab) ─────────────────────────
//
// Every word other than ops (optimizers, learning-rate schedules, data
// sources, losses, metrics, precisions, pipeline schedules, `train` and
// `table` options) is one entry of `shardc::vocab`. Below: the reference
// tables, `shardc explain E0301` and the editor grammars equal what the
// registry generates, and each registered word builds the typed value it
// names (a word wired to another kind fails here).

use shardc::spec::{OptKind, Train};
use shardc::vocab::{self, docs as vdocs, Entry, Omitted, Value};

#[test]
fn the_language_reference_has_a_row_for_every_word() {
    let doc = root().join("docs/language.md");
    let errs: Vec<String> = vdocs::reference()
        .into_iter()
        .filter_map(|(name, body)| {
            region(
                &doc,
                &format!("<!-- vocabulary: {name} "),
                "<!-- /vocabulary -->",
                &body,
            )
            .err()
        })
        .collect();
    assert!(errs.is_empty(), "{}", errs.join("\n\n"));
}

#[test]
fn explain_e0301_names_every_word() {
    let path = root().join("docs/errors/E0301.md");
    let r = region(
        &path,
        "The words each place takes:",
        "The help suggests the closest name",
        &format!("\n{}\n", vdocs::unknown_choices()),
    );
    assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
}

/// The names `shardc` highlights as library calls: ops' `LIBRARY` and the
/// registry's call-shaped words, each once.
fn library_calls() -> Vec<&'static str> {
    let mut v: Vec<&str> = LIBRARY.to_vec();
    for n in vdocs::calls() {
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

#[test]
fn every_editor_grammar_names_every_word() {
    let ops = names(Kind::Function);
    let calls = library_calls();
    // Bare words: not ops (those are builtins) and, in Vim, not call-shaped
    // (a keyword has one colour: those stay library functions).
    let constants: Vec<&str> = vdocs::constants()
        .into_iter()
        .filter(|n| !ops.contains(n))
        .collect();
    let vim_constants: Vec<&str> = constants
        .iter()
        .copied()
        .filter(|n| !calls.contains(n))
        .collect();
    let mut errs = Vec::new();
    let vim = format!(
        "{}{}",
        wrapped("syn keyword shardBuiltin      ", &calls, " ", false),
        wrapped("syn keyword shardConstant     ", &vim_constants, " ", false)
    );
    let vim_path = root().join("editors/vim/syntax/shard.vim");
    errs.extend(
        region(
            &vim_path,
            "\" vocabulary (generated",
            "\" /vocabulary",
            &vim,
        )
        .err(),
    );
    let tm_path = root().join("editors/vscode/syntaxes/shard.tmLanguage.json");
    // TextMate: library calls, and bare names with a meaning.
    let calls_re = format!(
        "          \"match\": \"\\\\b({})\\\\b(?=\\\\s*\\\\()\",\n",
        calls.join("|")
    );
    errs.extend(
        region(
            &tm_path,
            "\"comment\": \"library calls:",
            "\"name\": \"support.function.library.shard\"",
            &calls_re,
        )
        .err(),
    );
    let mut tm_constants = vec!["zeros", "ones", "xavier", "lecun", "sum", "mean", "sqrtn"];
    tm_constants.extend(vdocs::constants());
    tm_constants.extend(["virtual", "cuda", "mpi"]);
    let constants_re = format!(
        "          \"match\": \"\\\\b(?:{})\\\\b\",\n",
        tm_constants.join("|")
    );
    errs.extend(
        region(
            &tm_path,
            "\"comment\": \"bare names with a meaning:",
            "\"name\": \"support.constant.shard\"",
            &constants_re,
        )
        .err(),
    );
    let q = |names: &[&str]| wrapped("    ", names, " ", true).trim_end().to_string();
    let mut values = vec!["zeros", "ones", "xavier", "lecun"];
    values.extend(vdocs::constants());
    values.extend(["sum", "mean", "sqrtn", "virtual", "cuda", "mpi"]);
    let mut args: Vec<&str> = vocab::PIPELINE_SCHEDULES.names();
    args.extend(["sum", "mean", "sqrtn"]);
    let ts = format!(
        "((option value: (ident) @constant.builtin)\n  (#any-of? @constant.builtin\n{}))\n((option value: (list (dim size: (ident) @constant.builtin)))\n  (#any-of? @constant.builtin\n{}))\n((option value: (ident) @type.builtin)\n  (#any-of? @type.builtin\n{}))\n((named_arg value: (ident) @constant.builtin)\n  (#any-of? @constant.builtin\n{}))\n",
        q(&values),
        q(&vocab::METRICS.names()),
        q(&vdocs::precisions()),
        q(&args),
    );
    let ts_path = root().join("editors/tree-sitter-shard/queries/highlights.scm");
    errs.extend(region(&ts_path, "; vocabulary (generated", "; /vocabulary", &ts).err());
    // Precisions are dtype names: each grammar's dtypes must hold them.
    for (path, needle) in [
        (&vim_path, "syn keyword shardType"),
        (&tm_path, "\"match\": \"\\\\b(?:f32|"),
    ] {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let line = text.lines().find(|l| l.contains(needle)).unwrap_or("");
        for p in vdocs::precisions() {
            if !line.contains(p) {
                errs.push(format!("{}: the dtypes lack `{p}`", path.display()));
            }
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n\n"));
}

/// A small clean model with a table, trained with `opts` (and table options
/// `table`): the source every wiring test edits.
fn sample(table: &str, opts: &str) -> String {
    format!(
        "import nn\nmesh tpu(device: 2, x: 1) {{ sparsecores: 2 }}\nconst EMB = 4\ntable words {{\n  vocab: 64, dim: EMB\n{table}\n}}\nfeature context: i32[B * 2, 1] -> words\nmodel M {{\n  out = Dense(2 * EMB -> 8)\n  fn forward(ids: i32[B@device, 2]) -> f32[B@device, 8] {{\n    out(reshape(lookup(context, ids), [B@device, 2 * EMB]))\n  }}\n}}\ntrain M on tpu {{\n{opts}\n}}\n"
    )
}

fn compiled(text: &str) -> shardc::world::Compilation {
    let path = root().join("registry_sample.shard");
    shardc::world::compile_source(&path, text.to_string(), &Default::default())
}

/// The spec of the first `train` of `text`, and the errors compiling it.
fn train_of(text: &str) -> (Option<Train>, Vec<String>) {
    let c = compiled(text);
    let errs = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{}: {}", d.code.as_str(), d.message))
        .collect();
    (c.spec.trains.first().cloned(), errs)
}

const TABLE: &str = "  optimizer: adagrad(lr: 0.05)";

/// A distinct valid value for the `i`-th argument of a word, as written.
fn value_for(a: &vocab::Arg, i: usize) -> String {
    match a.value {
        Value::Count => format!("{}", 3 + 2 * i),
        Value::Number | Value::Positive => format!("0.0{}", i + 1),
        Value::Integer => format!("-{}", 100 + i),
        Value::Unit => format!("0.{}", 5 + i),
        Value::Flag => "true".into(),
        Value::Path => "\"registry_sample.txt\"".into(),
        Value::Name => format!("\"column{i}\""),
        Value::Lr => "0.25".into(),
        Value::Patterns => format!("[norm{i}, bias]"),
        Value::Scales => format!("{{ embed{i}: 0.5 }}"),
    }
}

/// `name(arg: value, ...)` with every argument given a distinct valid value.
fn call_with_all(name: &str, args: &[vocab::Arg]) -> String {
    let given: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}: {}", a.name, value_for(a, i)))
        .collect();
    format!("{name}({})", given.join(", "))
}

/// Whether an argument is a parameter group (`no_decay`, `lr_scale`), not a
/// hyperparameter.
fn group(a: &vocab::Arg) -> bool {
    matches!(a.value, Value::Patterns | Value::Scales)
}

#[test]
fn every_optimizer_builds_its_kind_with_its_defaults_and_arguments() {
    let mut errs = Vec::new();
    for w in vocab::OPTIMIZERS.defs {
        let given: Vec<String> = w
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}: {}", a.name, value_for(a, i)))
            .collect();
        for (call, all) in [
            (w.name.to_string(), false),
            (format!("{}({})", w.name, given.join(", ")), true),
        ] {
            // A table-only optimizer is read from a table.
            let (table, run) = if w.tag.tables_only() {
                (format!("  optimizer: {call}"), "adam")
            } else {
                (TABLE.to_string(), call.as_str())
            };
            let text = sample(&table, &format!("  batch: 4, steps: 1, optimizer: {run}"));
            let (t, diags) = train_of(&text);
            let c = compiled(&text);
            let got = if w.tag.tables_only() {
                c.spec.tables.first().and_then(|t| t.optimizer.clone())
            } else {
                t.map(|t| t.optimizer)
            };
            let Some(o) = got else {
                errs.push(format!("`{call}`: no optimizer ({diags:?})"));
                continue;
            };
            if !diags.is_empty() {
                errs.push(format!("`{call}`: {diags:?}"));
            }
            if o.kind.tag() != Some(w.tag) || o.name() != w.name {
                errs.push(format!("`{call}` builds {:?}", o.kind));
            }
            // Its hyperparameters are the registry's arguments (but `lr`),
            // each the value written or the registry's default.
            let hp = o.hyperparameters();
            let listed: Vec<&str> = w
                .args
                .iter()
                .filter(|a| !group(a))
                .map(|a| a.name)
                .filter(|n| *n != "lr")
                .collect();
            let names: Vec<&str> = hp.iter().map(|h| h.0).collect();
            if names != listed {
                errs.push(format!(
                    "`{}` has hyperparameters {names:?}, the registry {listed:?}",
                    w.name
                ));
            }
            // The groups are read as written (none when left out).
            let groups = (
                o.groups.no_decay.clone(),
                o.groups
                    .lr_scale
                    .iter()
                    .map(|g| g.0.clone())
                    .collect::<Vec<_>>(),
            );
            for (i, a) in w.args.iter().enumerate().filter(|(_, a)| group(a)) {
                let (got, want) = match (a.value, all) {
                    (Value::Patterns, true) => {
                        (groups.0.clone(), vec![format!("norm{i}"), "bias".into()])
                    }
                    (Value::Scales, true) => (groups.1.clone(), vec![format!("embed{i}")]),
                    (Value::Patterns, false) => (groups.0.clone(), vec![]),
                    _ => (groups.1.clone(), vec![]),
                };
                if got != want {
                    errs.push(format!("`{call}`: `{}` is {got:?}, not {want:?}", a.name));
                }
            }
            for (i, a) in w.args.iter().enumerate().filter(|(_, a)| !group(a)) {
                let want = match (all, a.value, a.omitted) {
                    (true, Value::Flag, _) => "true".to_string(),
                    (true, _, _) => value_for(a, i)
                        .parse::<f64>()
                        .map_or(String::new(), |v| v.to_string()),
                    (false, _, Omitted::Flag(b)) => b.to_string(),
                    (false, _, o) => o.number().map_or(String::new(), |v| v.to_string()),
                };
                if a.name == "lr" {
                    let lr = shardc::spec::Schedule::Constant(want.parse().unwrap_or(f64::NAN));
                    if o.lr != lr {
                        errs.push(format!("`{call}`: lr {} not {want}", o.lr));
                    }
                } else if let Some((_, v)) = hp.iter().find(|h| h.0 == a.name) {
                    if *v != want {
                        errs.push(format!("`{call}`: `{}` is {v}, not {want}", a.name));
                    }
                }
            }
        }
    }
    // The default optimizer is a registered one.
    assert!(matches!(
        shardc::spec::Optimizer::default().kind,
        OptKind::Adam { .. }
    ));
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn every_schedule_builds_its_kind() {
    let mut errs = Vec::new();
    for w in vocab::LR_SCHEDULES.defs {
        let call = call_with_all(w.name, w.args);
        let text = sample(
            TABLE,
            &format!("  batch: 4, steps: 1, optimizer: sgd(lr: {call})"),
        );
        let (t, diags) = train_of(&text);
        let Some(t) = t else {
            errs.push(format!("`{call}`: no train ({diags:?})"));
            continue;
        };
        if !diags.is_empty() {
            errs.push(format!("`{call}`: {diags:?}"));
        }
        let lr = &t.optimizer.lr;
        if lr.kind() != w.tag {
            errs.push(format!("`{call}` builds {lr:?}"));
        }
        // Each argument reaches its place: the rate at step 0 is `init`
        // (`value` for `constant`, 0 for `inverse_sqrt`), at the end of the
        // warm-up `peak`.
        let arg = |n: &str| {
            w.args
                .iter()
                .position(|a| a.name == n)
                .and_then(|i| value_for(&w.args[i], i).parse::<f64>().ok())
        };
        let start = arg("init").or(arg("value")).unwrap_or(0.0);
        if (lr.at(0) - start).abs() > 1e-12 {
            errs.push(format!("`{call}` starts at {}, not {start}", lr.at(0)));
        }
        if let (Some(peak), Some(warmup)) = (arg("peak"), arg("warmup")) {
            if (lr.at(warmup as usize) - peak).abs() > 1e-12 {
                errs.push(format!(
                    "`{call}` is {} after warm-up, not {peak}",
                    lr.at(warmup as usize)
                ));
            }
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// What a run reads for each data source: the runtime's source, by name
/// (`None`: read from a file by the data stage, an error when it was not).
fn runtime_source(s: vocab::DataSource) -> Option<&'static str> {
    match s {
        vocab::DataSource::ShakespeareWords | vocab::DataSource::ShakespeareChars => Some("Tokens"),
        vocab::DataSource::Synthetic => Some("Synthetic"),
        vocab::DataSource::Clicks => Some("Clicks"),
        vocab::DataSource::Text | vocab::DataSource::Arrays | vocab::DataSource::Tokens => None,
    }
}

#[test]
fn every_data_source_builds_its_kind_and_the_run_reads_it() {
    let mut errs = Vec::new();
    for w in vocab::DATA_SOURCES.defs {
        let given: Vec<String> = w
            .args
            .iter()
            .enumerate()
            .filter(|(_, a)| a.required())
            .map(|(i, a)| format!("{}: {}", a.name, value_for(a, i)))
            .collect();
        let call = format!("{}({})", w.name, given.join(", "));
        let text = sample(
            TABLE,
            &format!("  data: {call}, batch: 4, steps: 1, optimizer: sgd(lr: 0.1)"),
        );
        let c = compiled(&text);
        let Some(t) = c.spec.trains.first() else {
            errs.push(format!("`{call}`: no train"));
            continue;
        };
        let Some(d) = &t.data else {
            errs.push(format!("`{call}`: no data source"));
            continue;
        };
        if d.kind() != w.tag || d.name() != w.name {
            errs.push(format!("`{call}` builds {d:?}"));
        }
        // The registry's defaults reach the typed source.
        for a in w.args {
            if let Omitted::Is(v) = a.omitted {
                if !format!("{d:?}").contains(&format!("{}: {v}", a.name)) {
                    errs.push(format!(
                        "`{call}`: `{}` is not its default {v}: {d:?}",
                        a.name
                    ));
                }
            }
        }
        let Some(prog) = c.programs.first() else {
            errs.push(format!("`{call}`: not lowered"));
            continue;
        };
        let src = shardc::runtime::config::source(t, prog, None);
        use shardc::runtime::data::Source;
        let got = src.as_ref().ok().map(|s| match s {
            Source::Synthetic { .. } => "Synthetic",
            Source::Clicks { .. } => "Clicks",
            Source::Tokens { .. } => "Tokens",
            Source::Arrays(_) => "Arrays",
            Source::Stream(_) => "Stream",
            Source::Pending(_) => "Pending",
        });
        if got != runtime_source(w.tag) {
            errs.push(format!(
                "`{call}` runs on {got:?}, not {:?}",
                runtime_source(w.tag)
            ));
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn every_loss_metric_and_precision_builds_its_kind() {
    let mut errs = Vec::new();
    let base = "  batch: 4, steps: 1, optimizer: sgd(lr: 0.1)";
    for w in vocab::LOSSES.defs {
        let (t, diags) = train_of(&sample(TABLE, &format!("{base}, loss: {}", w.name)));
        let got = t.map(|t| t.loss);
        if got != Some(w.tag) || w.tag.name() != w.name {
            errs.push(format!("`loss: {}` builds {got:?} ({diags:?})", w.name));
        }
        // With every argument given, each is read.
        if w.args.is_empty() {
            continue;
        }
        let call = call_with_all(w.name, w.args);
        let (t, diags) = train_of(&sample(TABLE, &format!("{base}, loss: {call}")));
        let got = t.map(|t| (t.loss, t.loss_ignore));
        for (i, a) in w.args.iter().enumerate() {
            let read = match a.name {
                "ignore_index" => got.map(|g| g.1) == Some(Some(-100 - i as i64)),
                _ => false,
            };
            if !read || got.map(|g| g.0) != Some(w.tag) || !diags.is_empty() {
                errs.push(format!(
                    "`loss: {call}` builds {got:?}, not its `{}` ({diags:?})",
                    a.name
                ));
            }
        }
    }
    for m in vocab::METRICS.defs {
        let Some(loss) = m.losses.first() else {
            errs.push(format!("`{}` fits no loss", m.name));
            continue;
        };
        let opts = format!("{base}, loss: {}, metrics: [{}]", loss.name(), m.name);
        let (t, diags) = train_of(&sample(TABLE, &opts));
        let got = t.map(|t| t.metrics);
        if got != Some(vec![m.tag]) || !diags.is_empty() {
            errs.push(format!(
                "`metrics: [{}]` builds {got:?} ({diags:?})",
                m.name
            ));
        }
    }
    for w in vocab::LOG_SINKS.defs {
        let (t, diags) = train_of(&sample(TABLE, &format!("{base}, log: [{}]", w.name)));
        let got = t.map(|t| t.log);
        if got != Some(vec![w.tag]) || !diags.is_empty() {
            errs.push(format!("`log: [{}]` builds {got:?} ({diags:?})", w.name));
        }
    }
    for w in vocab::PRECISIONS.defs {
        let c = compiled(&sample(TABLE, &format!("{base}, precision: {}", w.name)));
        let got = c.spec.trains.first().map(|t| t.precision);
        // And the run computes in it.
        let compute = c.settings(None).ok().map(|(_, _, cfg)| cfg.compute);
        let want = match w.tag {
            vocab::Precision::F32 => None,
            vocab::Precision::BF16 => Some(candle_core::DType::BF16),
            vocab::Precision::F16 => Some(candle_core::DType::F16),
        };
        if got != Some(w.tag) || compute != Some(want) {
            errs.push(format!(
                "`precision: {}` builds {got:?}, computes in {compute:?}",
                w.name
            ));
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn every_pipeline_schedule_reaches_the_program() {
    let text =
        std::fs::read_to_string(root().join("models/transformer_3d.shard")).unwrap_or_default();
    assert!(
        text.contains("schedule: one_f_one_b"),
        "the model names its schedule"
    );
    let mut errs = Vec::new();
    for w in vocab::PIPELINE_SCHEDULES.defs {
        let t = text.replace("schedule: one_f_one_b", &format!("schedule: {}", w.name));
        let c = shardc::world::compile_source(
            &root().join("models/transformer_3d.shard"),
            t,
            &Default::default(),
        );
        let got = c
            .programs
            .first()
            .and_then(|p| p.pipeline.as_ref())
            .map(|p| p.schedule.clone());
        let pipe = match &got {
            Some(shardc::schedule::Source::Built { pipe, .. }) => Some(*pipe),
            _ => None,
        };
        if pipe != Some(w.tag) {
            errs.push(format!("`schedule: {}` lowers to {got:?}", w.name));
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// The base of the live-reload test: every `train` and `table` option given.
const RELOAD_TABLE: &str = "  init: normal(1.0), combiner: sum, optimizer: adagrad(lr: 0.05)\n  max_ids_per_partition: 64\n  max_unique_ids_per_partition: 64\n  stack_max_ids_per_partition: 64, stack_max_unique_ids_per_partition: 64\n  suggested_buffer_size: 64, overflow: error, shard: rows(device)";
const RELOAD_TRAIN: &str = "  data: synthetic(vocab: 64), batch: 8, steps: 10, loss: softmax_cross_entropy\n  metrics: [accuracy], optimizer: adam(lr: 0.01), log_every: 1, log: [jsonl], seed: 1\n  clip_grad_norm: 1.0, accumulate: 1, precision: f32\n  eval: { every: 5 }, checkpoint: { every: 5, dir: \"ck\" }, fdo: { every: 5, dir: \"fdo\" }";

/// An edit of each `train` option (an exhaustive match: a new option needs one).
fn train_edit(o: vocab::TrainOption) -> (&'static str, &'static str) {
    use vocab::TrainOption as T;
    match o {
        T::Data => ("synthetic(vocab: 64)", "synthetic(vocab: 32)"),
        T::Batch => ("batch: 8", "batch: 16"),
        T::Steps => ("steps: 10", "steps: 20"),
        T::Loss => (
            "loss: softmax_cross_entropy",
            "loss: sigmoid_binary_cross_entropy",
        ),
        T::Metrics => ("metrics: [accuracy]", "metrics: []"),
        T::Optimizer => ("adam(lr: 0.01)", "adam(lr: 0.02)"),
        T::LogEvery => ("log_every: 1", "log_every: 2"),
        T::Log => ("log: [jsonl]", "log: [jsonl, tensorboard]"),
        T::Seed => ("seed: 1", "seed: 2"),
        T::ClipGradNorm => ("clip_grad_norm: 1.0", "clip_grad_norm: 2.0"),
        T::Accumulate => ("accumulate: 1", "accumulate: 2"),
        T::Eval => ("eval: { every: 5 }", "eval: { every: 4 }"),
        T::Checkpoint => ("checkpoint: { every: 5", "checkpoint: { every: 4"),
        T::Fdo => ("fdo: { every: 5", "fdo: { every: 4"),
        T::Precision => ("precision: f32", "precision: bf16"),
    }
}

/// An edit of each `table` option.
fn table_edit(o: vocab::TableOption) -> (&'static str, &'static str) {
    use vocab::TableOption as T;
    match o {
        T::Vocab => ("vocab: 64", "vocab: 128"),
        T::Dim => ("const EMB = 4", "const EMB = 8"),
        T::Init => ("normal(1.0)", "normal(0.5)"),
        T::Combiner => ("combiner: sum", "combiner: mean"),
        T::Optimizer => ("adagrad(lr: 0.05)", "adagrad(lr: 0.1)"),
        T::Frozen => ("optimizer: adagrad(lr: 0.05)", "frozen: true"),
        T::MaxIds => ("  max_ids_per_partition: 64", "  max_ids_per_partition: 32"),
        T::MaxUniqueIds => (
            "  max_unique_ids_per_partition: 64",
            "  max_unique_ids_per_partition: 32",
        ),
        T::StackMaxIds => (
            "stack_max_ids_per_partition: 64",
            "stack_max_ids_per_partition: 32",
        ),
        T::StackMaxUniqueIds => (
            "stack_max_unique_ids_per_partition: 64",
            "stack_max_unique_ids_per_partition: 32",
        ),
        T::SuggestedBufferSize => ("suggested_buffer_size: 64", "suggested_buffer_size: 32"),
        T::Overflow => ("overflow: error", "overflow: drop"),
        T::Shard => ("rows(device)", "rows(x)"),
    }
}

/// Whether live reload treats an edit of the option `name` as it declares.
fn reloads_as_declared(
    name: &str,
    reload: vocab::Reload,
    edit: (&str, &str),
) -> Result<(), String> {
    let base = sample(RELOAD_TABLE, RELOAD_TRAIN);
    if !base.contains(edit.0) {
        return Err(format!("`{name}`: the base lacks `{}`", edit.0));
    }
    let settings = |text: &str| {
        let c = compiled(text);
        let errs: Vec<String> = c
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.message.clone())
            .collect();
        if !errs.is_empty() {
            return Err(format!("`{name}`: {errs:?}"));
        }
        c.settings(None).map(|(p, _, cfg)| (p.clone(), cfg))
    };
    let (p, c) = settings(&base)?;
    let (q, d) = settings(&base.replacen(edit.0, edit.1, 1))?;
    let got = shardc::runtime::reload::compare(&p, &c, &q, &d);
    // The summary's last part names what applies when the run restarts.
    let later = |s: &str| {
        s.strip_suffix(" apply when the run restarts)")
            .and_then(|s| s.rsplit_once(" ("))
            .map(|(_, l)| l.split(", ").any(|n| n.contains(name)))
    };
    let ok = match (reload, &got) {
        (vocab::Reload::Live, Ok(s)) => !s.starts_with("nothing") && later(s) != Some(true),
        (vocab::Reload::Restart, Ok(s)) => later(s) == Some(true),
        (vocab::Reload::Refused, Err(_)) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is declared {reload:?}, and reload says {got:?}"
        ))
    }
}

#[test]
fn live_reload_treats_every_option_as_it_declares() {
    let mut errs = Vec::new();
    for o in vocab::TRAIN_OPTIONS.defs {
        errs.extend(reloads_as_declared(o.name, o.reload, train_edit(o.tag)).err());
    }
    for o in vocab::TABLE_OPTIONS.defs {
        errs.extend(reloads_as_declared(o.name, o.reload, table_edit(o.tag)).err());
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn every_word_has_docs_and_its_arguments_are_documented() {
    let mut errs = Vec::new();
    let mut check = |what: &str, e: &dyn Entry| {
        if e.doc().trim().is_empty() {
            errs.push(format!("{what} `{}` has no doc", e.name()));
        }
        for a in e.args() {
            if a.doc.trim().is_empty() {
                errs.push(format!(
                    "{what} `{}`: argument `{}` has no doc",
                    e.name(),
                    a.name
                ));
            }
        }
    };
    for w in vocab::OPTIMIZERS.defs {
        check("optimizer", w);
    }
    for w in vocab::LR_SCHEDULES.defs {
        check("schedule", w);
    }
    for w in vocab::DATA_SOURCES.defs {
        check("data source", w);
    }
    for w in vocab::TRAIN_OPTIONS.defs {
        check("train option", w);
    }
    for w in vocab::TABLE_OPTIONS.defs {
        check("table option", w);
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}
