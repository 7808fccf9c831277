//! The editor grammars against the language: the tree-sitter grammar
//! (`editors/tree-sitter-shard`, its generated parser committed and compiled
//! by that crate's build script) parses every `.shard` file in the repository
//! exactly when `grammar/shard.pest` does, its corpus (`test/corpus/*.txt`, the
//! `tree-sitter test` format) matches, and its highlight queries mark mesh axes
//! in shardings and collectives. The Vim syntax is checked the same way when
//! Vim is installed, and the parser is regenerated and compared, with the
//! corpus run by `tree-sitter test`, when the tree-sitter CLI is.

use std::path::{Path, PathBuf};
use std::process::Command;
use tree_sitter::{Language, Node, Parser, Query, QueryCursor, StreamingIterator, Tree};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn grammar_dir() -> PathBuf {
    root().join("editors/tree-sitter-shard")
}

fn language() -> Language {
    tree_sitter_shard::LANGUAGE.into()
}

fn parse(src: &str) -> Tree {
    let mut p = Parser::new();
    p.set_language(&language())
        .expect("the grammar's ABI is supported");
    p.parse(src, None).expect("a tree")
}

/// Every `.shard` file under the repository (not under `target/` or
/// `node_modules/`).
fn shard_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() {
                if !matches!(
                    name.to_str(),
                    Some("target" | "node_modules" | ".git" | ".vscode-test")
                ) {
                    dirs.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "shard") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The first ERROR or MISSING node, as `line:col kind`.
fn first_error(n: Node) -> Option<String> {
    if n.is_error() || n.is_missing() {
        let p = n.start_position();
        return Some(format!("{}:{} {}", p.row + 1, p.column + 1, n.to_sexp()));
    }
    if !n.has_error() {
        return None;
    }
    let mut c = n.walk();
    let kids: Vec<Node> = n.children(&mut c).collect();
    kids.into_iter().find_map(first_error)
}

#[test]
fn tree_sitter_parses_every_shard_file_exactly_when_pest_does() {
    let files = shard_files();
    assert!(files.len() > 150, "found only {} .shard files", files.len());
    let mut errs = Vec::new();
    let mut rejected = 0;
    for f in &files {
        // A file that is not UTF-8 is a UI test of E0004.
        let Ok(src) = std::fs::read_to_string(f) else {
            continue;
        };
        let rel = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        let (_, d) = shardc::world::syntax(f, src.clone());
        let pest_rejects = d.is_some_and(|d| d.code.as_str() == "E0001");
        let tree = parse(&src);
        match (pest_rejects, first_error(tree.root_node())) {
            (false, Some(e)) => errs.push(format!("{rel}: tree-sitter: {e}")),
            (true, None) => errs.push(format!(
                "{rel}: pest finds a syntax error, tree-sitter none"
            )),
            (true, Some(_)) => rejected += 1,
            (false, None) => {}
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    // The deliberate syntax-error UI tests.
    assert!(rejected >= 3, "only {rejected} files with syntax errors");
}

/// The corpus's tests: (name, input, expected S-expression).
fn corpus() -> Vec<(String, String, String)> {
    let dir = grammar_dir().join("test/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("test/corpus")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    let rule = |l: &str, c: char| l.len() >= 3 && l.chars().all(|x| x == c);
    let mut tests = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f)
            .expect("read corpus")
            .replace("\r\n", "\n");
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i + 2 < lines.len() {
            if !(rule(lines[i], '=') && rule(lines[i + 2], '=')) {
                i += 1;
                continue;
            }
            let name = lines[i + 1].trim().to_string();
            let body_start = i + 3;
            let mut end = body_start;
            while end + 2 < lines.len() && !(rule(lines[end], '=') && rule(lines[end + 2], '=')) {
                end += 1;
            }
            if end + 2 >= lines.len() {
                end = lines.len();
            }
            let body = &lines[body_start..end];
            let sep = body
                .iter()
                .rposition(|l| rule(l, '-'))
                .unwrap_or_else(|| panic!("{}: `{name}` has no `---`", f.display()));
            tests.push((name, body[..sep].join("\n"), body[sep + 1..].join("\n")));
            i = end;
        }
    }
    tests
}

/// An S-expression with single spaces, no space before `)`, and (when
/// `fields` is false) no `field:` labels, as `tree-sitter test` compares them.
fn normalize(sexp: &str, fields: bool) -> String {
    let spaced = sexp.replace('(', " (").replace(')', " )");
    let words: Vec<&str> = spaced
        .split_whitespace()
        .filter(|w| fields || !(w.ends_with(':') && w.len() > 1))
        .collect();
    words.join(" ").replace(" )", ")").replace("( ", "(")
}

#[test]
fn the_corpus_matches() {
    let tests = corpus();
    assert!(tests.len() >= 6, "only {} corpus tests", tests.len());
    let mut errs = Vec::new();
    for (name, input, expected) in &tests {
        let fields = expected.split_whitespace().any(|w| w.ends_with(':'));
        let want = normalize(expected, fields);
        let got = normalize(&parse(input).root_node().to_sexp(), fields);
        if want != got {
            errs.push(format!("`{name}`:\n  want {want}\n  got  {got}"));
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// The capture names of the highlight query on `word`, the first one in the
/// first `context` in `src`.
fn captures(src: &str, tree: &Tree, query: &Query, context: &str, word: &str) -> Vec<String> {
    let at = src
        .find(context)
        .unwrap_or_else(|| panic!("`{context}` not in the sample"));
    let start = at
        + context
            .find(word)
            .unwrap_or_else(|| panic!("`{word}` not in `{context}`"));
    let range = start..start + word.len();
    let mut cursor = QueryCursor::new();
    let mut names = Vec::new();
    let mut it = cursor.captures(query, tree.root_node(), src.as_bytes());
    while let Some((m, i)) = it.next() {
        let c = m.captures[*i];
        if c.node.byte_range() == range {
            names.push(query.capture_names()[c.index as usize].to_string());
        }
    }
    names
}

const SAMPLE: &str = "mesh pod(dp: 2, mp: 2)
layer Block(D, H) {
  embed = Embed(VOCAB@mp, D)
  up = Dense(D -> FF@mp)
  fn forward(x: f32[B@dp, D], w: f32[D, D]) -> f32[B@dp, D] partial(mp) {
    let y = relu(x @ w)
    let k = axis_index(mp)
    let g = all_gather(y, mp, dim: 1)
    psum(y + g, dp, mp)
  }
}
";

#[test]
fn highlights_mark_axes_in_shardings_and_collectives() {
    let query = Query::new(&language(), tree_sitter_shard::HIGHLIGHTS_QUERY)
        .unwrap_or_else(|e| panic!("queries/highlights.scm: {e}"));
    let tree = parse(SAMPLE);
    assert!(
        first_error(tree.root_node()).is_none(),
        "{}",
        tree.root_node().to_sexp()
    );
    let has = |context: &str, word: &str, name: &str| {
        let got = captures(SAMPLE, &tree, &query, context, word);
        assert!(
            got.iter().any(|n| n == name),
            "`{word}` in `{context}`: {got:?}, no @{name}"
        );
    };
    let lacks = |context: &str, word: &str, name: &str| {
        let got = captures(SAMPLE, &tree, &query, context, word);
        assert!(
            !got.iter().any(|n| n == name),
            "`{word}` in `{context}`: {got:?}"
        );
    };
    // The mesh's axes, every sharding, `partial(...)`.
    has("pod(dp", "dp", "label");
    // A sharded size, not a matmul.
    has("Embed(VOCAB@mp", "mp", "label");
    has("Dense(D -> FF@mp", "mp", "label");
    has("x: f32[B@dp", "dp", "label");
    has("partial(mp", "mp", "label");
    // Collectives' axis arguments, and not their operands.
    has("axis_index(mp", "mp", "label");
    has("all_gather(y, mp", "mp", "label");
    lacks("all_gather(y, mp", "y", "label");
    has("psum(y + g, dp, mp", "dp", "label");
    has("psum(y + g, dp, mp", "mp", "label");
    has("psum(", "psum", "function.macro");
    has("relu(", "relu", "function.builtin");
    // `x @ w` is a matmul: `w` is no axis.
    lacks("x @ w", "w", "label");
    let tree2 = parse("layer L { a = Embed(V@mp, D) }");
    let root = tree2.root_node().to_sexp();
    assert!(
        root.contains("(dim size: (ident) axes: (axes (ident)))"),
        "{root}"
    );
    assert!(!root.contains("binary_expr"), "{root}");
}

/// Vim's syntax group names at (line, column), both from 1, of `file`.
fn vim_groups(file: &Path, at: &[(usize, usize)]) -> Option<Vec<String>> {
    let out = std::env::temp_dir().join(format!("shardc-vim-{}.txt", std::process::id()));
    let calls: Vec<String> = at
        .iter()
        .map(|(l, c)| format!("synIDattr(synIDtrans(synID({l}, {c}, 1)), 'name') . '/' . synIDattr(synID({l}, {c}, 1), 'name')"))
        .collect();
    let status = Command::new("vim")
        .args(["-Nu", "NONE", "-i", "NONE", "-n", "-es"])
        .arg("--cmd")
        .arg(format!("set rtp^={}", root().join("editors/vim").display()))
        .args(["-c", "filetype plugin on", "-c", "syntax on"])
        .arg("-c")
        .arg(format!("edit {}", file.display()))
        .arg("-c")
        .arg(format!(
            "call writefile([{}], '{}')",
            calls.join(", "),
            out.display()
        ))
        .args(["-c", "qa!"])
        .stdin(std::process::Stdio::null())
        .status()
        .ok()?;
    assert!(status.success(), "vim failed: {status}");
    let text = std::fs::read_to_string(&out).expect("vim wrote its answer");
    let _ = std::fs::remove_file(&out);
    Some(text.lines().map(str::to_string).collect())
}

#[test]
fn vim_marks_axes_in_shardings_and_collectives() {
    let file = std::env::temp_dir().join(format!("shardc-vim-{}.shard", std::process::id()));
    std::fs::write(&file, SAMPLE).expect("write sample");
    // (line, column) of: `mp` in Embed(VOCAB@mp), `dp` in f32[B@dp, D],
    // `mp` in axis_index(mp), all_gather(y, mp, ...), psum(.., dp, mp),
    // `w` in `x @ w`, `psum`.
    let at = [
        (3, 23),
        (5, 23),
        (7, 24),
        (8, 27),
        (9, 17),
        (9, 21),
        (6, 22),
        (9, 5),
    ];
    let Some(got) = vim_groups(&file, &at) else {
        eprintln!("\n*** SKIPPED: vim is not installed; the Vim syntax was not checked ***\n");
        return;
    };
    let _ = std::fs::remove_file(&file);
    let group = |i: usize| got.get(i).map_or("", |s| s.as_str());
    for (i, _) in at.iter().enumerate().take(6) {
        assert!(
            group(i).starts_with("PreProc/"),
            "{:?}: {} (all: {got:?})",
            at[i],
            group(i)
        );
    }
    assert!(
        !group(6).starts_with("PreProc"),
        "`w` in `x @ w`: {}",
        group(6)
    );
    assert!(group(7).ends_with("/shardCollective"), "psum: {}", group(7));
}

/// `tree-sitter --version`'s number, when the CLI is on `PATH`.
fn cli_version() -> Option<String> {
    let out = Command::new("tree-sitter").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).map(str::to_string)
}

#[test]
fn the_committed_parser_is_generated_from_grammar_js() {
    let parser = std::fs::read_to_string(grammar_dir().join("src/parser.c")).expect("src/parser.c");
    let header = parser.lines().next().unwrap_or("");
    let made_by = header
        .split("tree-sitter v")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    let Some(cli) = cli_version() else {
        eprintln!(
            "\n*** SKIPPED: no tree-sitter CLI on PATH: src/parser.c (made by {made_by}) was not regenerated and `tree-sitter test` did not run (`cargo install tree-sitter-cli` or `npm install` in editors/tree-sitter-shard) ***\n"
        );
        return;
    };
    // Generate into a copy, so the work tree is not touched.
    let tmp = std::env::temp_dir().join(format!("shardc-ts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("src")).expect("temp dir");
    // The hand-written external scanner beside what `generate` writes.
    for f in [
        "grammar.js",
        "tree-sitter.json",
        "package.json",
        "src/scanner.c",
    ] {
        std::fs::copy(grammar_dir().join(f), tmp.join(f)).expect("copy grammar");
    }
    let copy_dir = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).expect("mkdir");
        for e in std::fs::read_dir(from).expect("read").flatten() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    };
    copy_dir(&grammar_dir().join("queries"), &tmp.join("queries"));
    copy_dir(&grammar_dir().join("test/corpus"), &tmp.join("test/corpus"));
    let run = |args: &[&str]| {
        let out = Command::new("tree-sitter")
            .args(args)
            .current_dir(&tmp)
            .output()
            .expect("tree-sitter runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "tree-sitter {args:?}:\n{text}");
        text
    };
    run(&["generate"]);
    let fresh = std::fs::read_to_string(tmp.join("src/parser.c")).expect("generated");
    if cli == made_by {
        assert!(
            fresh == parser,
            "src/parser.c is not what `tree-sitter generate` makes of grammar.js: run it in editors/tree-sitter-shard and commit src/"
        );
    } else {
        eprintln!(
            "\n*** tree-sitter {cli} is not {made_by}, which made src/parser.c: not compared ***\n"
        );
    }
    let out = run(&["test"]);
    assert!(!out.contains('✗'), "tree-sitter test:\n{out}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Vim's `:make` on a model with errors (the ftplugin's `makeprg` runs
/// `shardc check --format short`, its `errorformat` reads it) fills the
/// quickfix list with one valid entry per diagnostic, at the right places.
#[test]
fn vim_make_fills_the_quickfix_list() {
    let bin = Path::new(env!("CARGO_BIN_EXE_shardc"));
    let dir = bin.parent().expect("the binary's directory");
    let out = std::env::temp_dir().join(format!("shardc-qf-{}.txt", std::process::id()));
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = Command::new("vim")
        .args(["-Nu", "NONE", "-i", "NONE", "-n", "-es"])
        .env("PATH", path)
        .current_dir(root())
        .arg("--cmd")
        .arg(format!("set rtp^={}", root().join("editors/vim").display()))
        .args(["-c", "filetype plugin on", "-c", "edit examples/broken_mlp.shard"])
        .args(["-c", "silent make"])
        .arg("-c")
        .arg(format!(
            "call writefile(map(getqflist(), {{_, e -> bufname(e.bufnr) . ':' . e.lnum . ':' . e.col . ':' . e.type . ':' . e.valid . ':' . e.text}}), '{}')",
            out.display()
        ))
        .args(["-c", "qa!"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status();
    let Ok(status) = status else {
        eprintln!("\n*** SKIPPED: vim is not installed; `:make` was not checked ***\n");
        return;
    };
    assert!(status.success(), "vim: {status}");
    let text = std::fs::read_to_string(&out).expect("vim wrote the quickfix list");
    let _ = std::fs::remove_file(&out);
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(got.len(), 2, "{text}");
    assert!(
        got[0].starts_with("examples/broken_mlp.shard:5:15:e:1:[E0203]: dimension 1 of `w1`"),
        "{text}"
    );
    assert!(
        got[1].starts_with("examples/broken_mlp.shard:6:12:e:1:[E0203]"),
        "{text}"
    );
}

/// Every named node over every `.shard` file starts on its own first
/// character, never on a blank before it (a `[ \t]*(` token once made
/// `const X` give the identifier " X": selections, text objects and
/// highlights were off by one in Neovim, Helix and Zed).
#[test]
fn no_node_starts_on_a_blank() {
    let mut bad = Vec::new();
    let mut named = 0usize;
    for f in shard_files() {
        let Ok(src) = std::fs::read_to_string(&f) else {
            continue;
        };
        let tree = parse(&src);
        let mut stack = vec![tree.root_node()];
        while let Some(n) = stack.pop() {
            let mut c = n.walk();
            stack.extend(n.children(&mut c));
            if !n.is_named() || n.start_byte() == n.end_byte() {
                continue;
            }
            named += 1;
            if src[n.start_byte()..].starts_with(char::is_whitespace) {
                let p = n.start_position();
                let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
                bad.push(format!("{rel}:{}:{} {}", p.row + 1, p.column + 1, n.kind()));
            }
        }
    }
    assert!(named > 10_000, "only {named} named nodes");
    assert!(
        bad.is_empty(),
        "{} of {named} named nodes start on a blank, e.g.\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
}

/// Every query file (highlights, locals, folds, indents, text objects) loads
/// against the grammar and runs over every model, as `tree-sitter query`
/// does; locals find scopes, definitions and references, folds, indents and
/// text objects match in each model.
#[test]
fn every_query_file_loads_and_matches_the_models() {
    let dir = grammar_dir().join("queries");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("queries/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "scm"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(String::from))
        .collect();
    assert_eq!(
        names,
        ["folds", "highlights", "indents", "locals", "textobjects"]
    );
    let models: Vec<PathBuf> = shard_files()
        .into_iter()
        .filter(|p| p.starts_with(root().join("models")))
        .collect();
    assert!(models.len() >= 5);
    for q in &files {
        let text = std::fs::read_to_string(q).expect("query");
        let query =
            Query::new(&language(), &text).unwrap_or_else(|e| panic!("{}: {e}", q.display()));
        for m in &models {
            let src = std::fs::read_to_string(m).expect("model");
            let tree = parse(&src);
            let mut cursor = QueryCursor::new();
            let mut seen = std::collections::BTreeSet::new();
            let mut it = cursor.matches(&query, tree.root_node(), src.as_bytes());
            while let Some(mt) = it.next() {
                for c in mt.captures {
                    seen.insert(query.capture_names()[c.index as usize].to_string());
                }
            }
            let want: &[&str] = match q.file_stem().and_then(|s| s.to_str()) {
                Some("locals") => &["local.scope", "local.definition.", "local.reference"],
                Some("folds") => &["fold"],
                Some("indents") => &["indent.begin"],
                Some("textobjects") => &["function.around", "class.around", "call.around"],
                _ => &[],
            };
            for w in want {
                // A name ending in `.` stands for any capture under it.
                let found = match w.strip_suffix('.') {
                    Some(_) => seen.iter().any(|s| s.starts_with(*w)),
                    None => seen.contains(*w),
                };
                assert!(found, "{} finds no @{w} in {}", q.display(), m.display());
            }
        }
    }
}
