//! References and rename cover the whole workspace, over stdio as an editor
//! sends them: the workspace folders named at `initialize` (`rootUri` or
//! `workspaceFolders`, and `workspace/didChangeWorkspaceFolders`) are
//! searched for `.shard` files, open or not. A workspace of a library file
//! declaring a layer and two importers, only one of them open (the other in
//! another directory, so only the workspace search finds it): references
//! list all three files and rename edits all three. Files under `target/`,
//! `node_modules/` and hidden directories are not searched, and a workspace
//! with more files than the search reads says so in the log.
//!
//! Also what the editor shows of the whole workspace and of each file's
//! plan: workspace symbols, import links, and on `models/gptj.shard` the code
//! lenses and collective hovers, whose figures are `shardc plan`'s.

#[path = "common/lsp.rs"]
mod lsp;

use lsp::{pos, scratch, uri, write, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const LIB: &str = "import nn\n\n// A projection.\nlayer Proj(D) {\n  ln = LayerNorm(D)\n  w: f32[D, 4] init zeros\n  fn forward(x: f32[B, D]) -> f32[B, 4] {\n    ln(x) @ w\n  }\n}\n";

/// The open importer, at the workspace's top.
const A: &str = "import \"x/lib.shard\"\nimport nn\n\nmesh m(dp: 2)\n\nmodel A {\n  ln = LayerNorm(8)\n  p = Proj(8)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    p(ln(x))\n  }\n}\n";

/// The importer that is not open, beside the library (not beside `A`).
const B: &str = "import \"lib.shard\"\nimport nn\n\nmesh n(dp: 2)\n\nmodel B {\n  ln = LayerNorm(8)\n  q = Proj(8)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    q(ln(x))\n  }\n}\n";

/// A file that uses a stdlib layer: found under an ordinary directory, not
/// searched under `target/`, `node_modules/` or a hidden directory.
const USER: &str = "import nn\n\nlayer C(D) {\n  ln = LayerNorm(D)\n  fn forward(x: f32[B, D]) -> f32[B, D] {\n    ln(x)\n  }\n}\n";

struct Workspace {
    root: PathBuf,
    lib: PathBuf,
    a: PathBuf,
    b: PathBuf,
}

fn workspace(name: &str) -> Workspace {
    let root = scratch("lsp-workspace", name);
    let lib = write(&root, "x/lib.shard", LIB);
    let a = write(&root, "a.shard", A);
    let b = write(&root, "x/b.shard", B);
    for rel in [
        "target/c.shard",
        "x/target/c.shard",
        "node_modules/pkg/d.shard",
        ".hidden/e.shard",
        "y/f.shard",
    ] {
        write(&root, rel, USER);
    }
    Workspace { root, lib, a, b }
}

/// A server with `init` as `initialize`'s params and `a.shard` open, checked.
fn start(w: &Workspace, init: Value) -> Server {
    let mut s = Server::start();
    s.initialize(init);
    s.open(&uri(&w.a), A);
    let d = s.diags(&uri(&w.a));
    assert!(d.is_empty(), "a.shard checks: {d:?}");
    s
}

fn root_uri(w: &Workspace) -> Value {
    json!({"rootUri": uri(&w.root)})
}

/// The files of a list of locations, as paths relative to the workspace
/// (stdlib copies as `<std>`), each with how many locations it has.
fn files(root: &Path, locs: &Value) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for l in locs.as_array().expect("a list of locations") {
        let u = l["uri"].as_str().expect("uri");
        let p = u.strip_prefix("file://").expect("a file URI");
        let rel = match Path::new(p).strip_prefix(root) {
            Ok(r) => r.display().to_string(),
            Err(_) => "<std>".to_string(),
        };
        match out.iter_mut().find(|(f, _)| *f == rel) {
            Some((_, n)) => *n += 1,
            None => out.push((rel, 1)),
        }
    }
    out.sort();
    out
}

fn references(s: &mut Server, file: &Path, at: Value, decl: bool) -> Value {
    s.request(
        "textDocument/references",
        json!({"textDocument": {"uri": uri(file)}, "position": at, "context": {"includeDeclaration": decl}}),
    )
}

#[test]
fn references_list_every_file_of_the_workspace() {
    let w = workspace("refs");
    let mut s = start(&w, root_uri(&w));
    let refs = references(&mut s, &w.a, pos(A, "Proj", 1), true);
    assert_eq!(
        files(&w.root, &refs),
        vec![
            ("a.shard".into(), 1),
            ("x/b.shard".into(), 1),
            ("x/lib.shard".into(), 1)
        ],
        "{refs}"
    );
    // The unopened importer's use, exactly.
    let b_use = refs
        .as_array()
        .and_then(|a| a.iter().find(|l| l["uri"] == uri(&w.b)))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        b_use["range"],
        json!({"start": pos(B, "Proj", 0), "end": pos(B, "Proj", 4)}),
        "{refs}"
    );
    // Without the declaration: the two uses.
    let uses = references(&mut s, &w.a, pos(A, "Proj", 1), false);
    assert_eq!(
        files(&w.root, &uses),
        vec![("a.shard".into(), 1), ("x/b.shard".into(), 1)],
        "{uses}"
    );
    s.finish();
}

#[test]
fn rename_edits_every_file_that_uses_the_layer() {
    let w = workspace("rename");
    // `workspaceFolders` this time (rootUri names somewhere else).
    let init = json!({
        "rootUri": "file:///nonexistent-shardc-root",
        "workspaceFolders": [{"uri": uri(&w.root), "name": "ws"}],
    });
    let mut s = start(&w, init);
    let at = pos(A, "Proj", 2);
    let prep = s.request(
        "textDocument/prepareRename",
        json!({"textDocument": {"uri": uri(&w.a)}, "position": at}),
    );
    assert_eq!(
        prep,
        json!({"start": pos(A, "Proj", 0), "end": pos(A, "Proj", 4)})
    );
    let r = s.request(
        "textDocument/rename",
        json!({"textDocument": {"uri": uri(&w.a)}, "position": at, "newName": "Projection"}),
    );
    let changes = r["changes"].as_object().expect("changes");
    let keys: BTreeSet<&str> = changes.keys().map(String::as_str).collect();
    let want: BTreeSet<String> = [&w.a, &w.b, &w.lib].iter().map(|p| uri(p)).collect();
    assert_eq!(
        keys,
        want.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        "{r}"
    );
    let edit = |text: &str, needle: &str| json!([{"range": {"start": pos(text, needle, 0), "end": pos(text, needle, 4)}, "newText": "Projection"}]);
    assert_eq!(changes[&uri(&w.a)], edit(A, "Proj"), "{r}");
    assert_eq!(changes[&uri(&w.b)], edit(B, "Proj"), "{r}");
    assert_eq!(changes[&uri(&w.lib)], edit(LIB, "Proj"), "{r}");
    s.finish();
}

#[test]
fn the_importer_in_a_parent_directory_is_found_from_the_library() {
    let w = workspace("parent");
    let mut s = Server::start();
    s.initialize(root_uri(&w));
    s.open(&uri(&w.lib), LIB);
    let _ = s.diags(&uri(&w.lib));
    let refs = references(&mut s, &w.lib, pos(LIB, "Proj", 1), true);
    assert_eq!(
        files(&w.root, &refs),
        vec![
            ("a.shard".into(), 1),
            ("x/b.shard".into(), 1),
            ("x/lib.shard".into(), 1)
        ],
        "{refs}"
    );
    s.finish();
}

#[test]
fn target_node_modules_and_hidden_directories_are_not_searched() {
    let w = workspace("skipped");
    let mut s = start(&w, root_uri(&w));
    // A stdlib layer (used in the stdlib too): every file of the workspace
    // may use it.
    let refs = references(&mut s, &w.a, pos(A, "LayerNorm", 1), false);
    let found: Vec<String> = files(&w.root, &refs).into_iter().map(|f| f.0).collect();
    assert_eq!(
        found,
        vec!["<std>", "a.shard", "x/b.shard", "x/lib.shard", "y/f.shard"],
        "{refs}"
    );
    s.finish();
}

#[test]
fn without_a_workspace_folder_only_the_open_buffers_directories_are_searched() {
    let w = workspace("noroot");
    let mut s = start(&w, json!({}));
    let refs = references(&mut s, &w.a, pos(A, "Proj", 1), true);
    assert_eq!(
        files(&w.root, &refs),
        vec![("a.shard".into(), 1), ("x/lib.shard".into(), 1)],
        "{refs}"
    );
    // The client adds the folder: now the other importer is found.
    s.notify(
        "workspace/didChangeWorkspaceFolders",
        json!({"event": {"added": [{"uri": uri(&w.root), "name": "ws"}], "removed": []}}),
    );
    let refs = references(&mut s, &w.a, pos(A, "Proj", 1), true);
    assert_eq!(files(&w.root, &refs).len(), 3, "{refs}");
    s.finish();
}

#[test]
fn the_capabilities_say_workspace_folders_are_supported() {
    let w = workspace("caps");
    let mut s = Server::start();
    let init = s.initialize(root_uri(&w));
    assert_eq!(
        init["capabilities"]["workspace"]["workspaceFolders"],
        json!({"supported": true, "changeNotifications": true}),
        "{init}"
    );
    s.finish();
}

#[test]
fn a_workspace_over_the_file_limit_is_searched_in_part_and_the_log_says_so() {
    let w = workspace("many");
    let many = w.root.join("many");
    std::fs::create_dir_all(&many).expect("mkdir");
    for i in 0..5_001 {
        std::fs::write(many.join(format!("m{i:05}.shard")), "// empty\n").expect("write");
    }
    let mut s = start(&w, root_uri(&w));
    // Still answered: the open buffer's directory and compilation come first.
    let refs = references(&mut s, &w.a, pos(A, "Proj", 1), true);
    let found: Vec<String> = files(&w.root, &refs).into_iter().map(|f| f.0).collect();
    assert!(found.contains(&"a.shard".to_string()), "{refs}");
    assert!(found.contains(&"x/lib.shard".to_string()), "{refs}");
    let log = s.finish();
    assert!(
        log.contains("more than 5000 .shard files"),
        "the log says the search was cut short:\n{log}"
    );
}

/// A client that registers file watchers on request (Neovim, Helix) is
/// asked, after `initialized`, to watch `**/*.shard`: a file changed on
/// disk then re-checks its importers. A client that does not offer it is
/// not asked (the first message after `initialized` is the answer to the
/// next request).
#[test]
fn the_server_registers_for_shard_file_changes_where_the_client_allows() {
    let mut s = Server::start();
    s.initialize(json!({"capabilities": {"workspace": {"didChangeWatchedFiles": {"dynamicRegistration": true}}}}));
    let reg = s.wait_for(|v| v["method"] == "client/registerCapability");
    let r = &reg["params"]["registrations"][0];
    assert_eq!(r["method"], "workspace/didChangeWatchedFiles", "{reg}");
    assert_eq!(
        r["registerOptions"]["watchers"][0]["globPattern"], "**/*.shard",
        "{reg}"
    );
    // The client's answer is taken without complaint.
    s.send(json!({"jsonrpc": "2.0", "id": reg["id"], "result": null}));
    s.finish();

    let mut s = Server::start();
    s.initialize(json!({}));
    let next = s.call("shutdown", Value::Null);
    assert!(next.get("result").is_some(), "{next}");
    assert!(
        !s.stash_has(|v| v["method"] == "client/registerCapability"),
        "asked a client that cannot register"
    );
    s.notify("exit", Value::Null);
}

fn names(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .expect("a list of symbols")
        .iter()
        .map(|s| {
            let u = s["location"]["uri"].as_str().unwrap_or_default();
            let file = u.rsplit('/').next().unwrap_or_default().to_string();
            (s["name"].as_str().unwrap_or_default().to_string(), file)
        })
        .collect()
}

/// `workspace/symbol` finds declarations by name, ignoring case, in the open
/// file's compilation and in workspace files no buffer has open (not under
/// `target/`, `node_modules/` or hidden directories), each once; the
/// imports of a file are links to the files they load.
#[test]
fn workspace_symbols_and_import_links() {
    let w = workspace("symbols");
    let mut s = start(&w, root_uri(&w));
    let found = s.request("workspace/symbol", json!({"query": "proj"}));
    assert_eq!(
        names(&found),
        [("Proj".to_string(), "lib.shard".to_string())],
        "{found}"
    );
    let models = s.request("workspace/symbol", json!({"query": ""}));
    let all = names(&models);
    for want in [
        ("A", "a.shard"),
        ("B", "b.shard"),
        ("m", "a.shard"),
        ("n", "b.shard"),
        ("C", "f.shard"),
    ] {
        assert!(
            all.contains(&(want.0.to_string(), want.1.to_string())),
            "no {want:?} in {all:?}"
        );
    }
    // `y/f.shard` only: the copies under target/, node_modules/ and .hidden are skipped.
    assert_eq!(all.iter().filter(|(n, _)| n == "C").count(), 1, "{all:?}");
    let links = s.request(
        "textDocument/documentLink",
        json!({"textDocument": {"uri": uri(&w.a)}}),
    );
    let links = links.as_array().expect("links");
    assert_eq!(links.len(), 2, "{links:?}");
    assert_eq!(links[0]["target"], json!(uri(&w.lib)), "{links:?}");
    assert_eq!(
        links[0]["range"]["start"],
        json!({"line": 0, "character": 0})
    );
    let std = links[1]["target"].as_str().unwrap_or_default();
    assert!(std.ends_with("nn.shard"), "{links:?}");
    s.finish();
}

/// The figures `shardc plan FILE` prints: the memory total per device, the
/// compute per step and the communication total.
fn plan_figures(file: &str) -> [String; 3] {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["plan", file])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("shardc plan runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |prefix: &str| -> String {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` in\n{text}"));
        let rest = line.trim_start()[prefix.len()..].trim_start();
        let words: Vec<&str> = rest.split_whitespace().take(2).collect();
        words.join(" ")
    };
    let memory = field("total");
    let compute = field("compute per device per step:");
    // The second `total`: communication's.
    let comm = text
        .lines()
        .filter(|l| l.trim_start().starts_with("total"))
        .nth(1)
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .expect("a communication total");
    [memory, compute, comm]
}

/// On `models/gptj.shard`: a code lens over the `train` and the `model`
/// gives the plan's memory per device, FLOPs per step and bytes communicated
/// per step (what `shardc plan` prints), and hovering the block's `psum`
/// gives its bytes per call, calls per step (4 blocks) and bytes per step.
#[test]
fn code_lenses_and_collective_hovers_show_the_plan() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gptj.shard");
    let text = std::fs::read_to_string(&path).expect("gptj");
    let mut s = Server::start();
    s.initialize(json!({}));
    s.open(&uri(&path), &text);
    let d = s.diags(&uri(&path));
    assert!(d.iter().all(|x| x["severity"] != 1), "gptj checks: {d:?}");
    let lenses = s.request(
        "textDocument/codeLens",
        json!({"textDocument": {"uri": uri(&path)}}),
    );
    let lenses = lenses.as_array().expect("lenses");
    let lines: Vec<u64> = lenses
        .iter()
        .filter_map(|l| l["range"]["start"]["line"].as_u64())
        .collect();
    let line_of = |needle: &str| {
        text.lines()
            .position(|l| l.starts_with(needle))
            .expect("a line") as u64
    };
    assert_eq!(lines.len(), 2, "{lenses:?}");
    assert!(
        lines.contains(&line_of("model GPTJ")) && lines.contains(&line_of("train GPTJ")),
        "{lenses:?}"
    );
    let title = lenses[0]["command"]["title"].as_str().expect("a title");
    let [memory, compute, comm] = plan_figures("models/gptj.shard");
    assert_eq!(
        title,
        format!("{memory} per device · {compute} per step · {comm} communicated per step · pod (dp=4, mp=2)"),
    );
    let hover = s.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&path)}, "position": pos(&text, "psum(attn", 0)}),
    );
    let value = hover["contents"]["value"].as_str().unwrap_or_default();
    assert!(
        value.contains(
            "**all-reduce** over `mp`: 1.5 MiB per call × 4 calls per step = 6.0 MiB per step"
        ),
        "{hover}"
    );
    s.finish();
}

/// A client that reports changes on disk: what a search read of the
/// workspace is kept until a report (a file written meanwhile is not seen,
/// then is); one that reports nothing gets the workspace read afresh.
#[test]
fn the_workspace_is_kept_while_the_client_reports_disk_changes() {
    let w = workspace("kept");
    let watching = json!({"rootUri": uri(&w.root), "capabilities": {"workspace": {"didChangeWatchedFiles": {"dynamicRegistration": true}}}});
    let mut s = start(&w, watching);
    let before = files(&w.root, &references(&mut s, &w.a, pos(A, "Proj", 1), true));
    assert_eq!(before.len(), 3, "{before:?}");
    let user = "import \"x/lib.shard\"\n\nmodel G {\n  p = Proj(8)\n  fn forward(x: f32[B, 8]) -> f32[B, 4] {\n    p(x)\n  }\n}\n";
    let g = write(&w.root, "g.shard", user);
    let kept = files(&w.root, &references(&mut s, &w.a, pos(A, "Proj", 1), true));
    assert_eq!(
        kept, before,
        "nothing reported yet: the kept workspace answers"
    );
    s.notify(
        "workspace/didChangeWatchedFiles",
        json!({"changes": [{"uri": uri(&g), "type": 1}]}),
    );
    let after = files(&w.root, &references(&mut s, &w.a, pos(A, "Proj", 1), true));
    assert!(
        after.contains(&("g.shard".to_string(), 1)),
        "after the report the new file is read: {after:?}"
    );
    s.finish();

    // A client that cannot report: every search reads the disk.
    let w = workspace("afresh");
    let mut s = start(&w, root_uri(&w));
    let before = files(&w.root, &references(&mut s, &w.a, pos(A, "Proj", 1), true));
    write(&w.root, "g.shard", user);
    let after = files(&w.root, &references(&mut s, &w.a, pos(A, "Proj", 1), true));
    assert_eq!(after.len(), before.len() + 1, "{before:?} then {after:?}");
    s.finish();
}
