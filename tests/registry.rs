//! The primitives' registry is the one definition of every op: this test fails
//! when a registered op lacks a forward kernel or a derivative (where it is
//! differentiable), a cost for `shardc plan`, its row of the language reference,
//! or its name in an editor grammar. The reference tables and the grammars'
//! name lists are generated from the registry; `SHARDC_BLESS=1` rewrites them.

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
    library.extend(LIBRARY);
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
                Err(e) if def.differentiable || !e.contains("has no derivative") => {
                    errs.push(format!("`{}`: {e}", def.name))
                }
                _ => {}
            }
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}
