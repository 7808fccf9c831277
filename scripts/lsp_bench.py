#!/usr/bin/env python3
"""Latency of `shardc lsp` as an editor sees it (not a test: nothing is
asserted about time). For models/gptj.shard and a generated model of about
2,000 lines: edit → diagnostics (a `didChange`, then the
`publishDiagnostics` of that version), hover and go-to-definition, and on
gptj references and rename of a parameter and a layer over the repository's
workspace (from a client that reports no changes on disk, and of the layer
again from one that does, for which the server keeps what it read); median
and 90th percentile over N rounds, in milliseconds.

    python3 scripts/lsp_bench.py [path/to/shardc] [--rounds N]

Figures are in docs/editors.md.
"""

import pathlib
import platform
import re
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lsp_stdio import ROOT, Client, default_server, position  # noqa: E402

BLOCK = """layer Block{i}(D) {{
  ln = LayerNorm(D)
  w1 : f32[D, 4 * D@mp] init normal(0.02)
  b1 : f32[4 * D@mp]    init zeros
  w2 : f32[4 * D@mp, D] init normal(0.02)

  fn forward(x: f32[B@dp, T, D]) -> f32[B@dp, T, D] {{
    let h = ln(x)
    let u = gelu(h @ w1 + b1)
    let y = u @ w2
    x + psum(y, mp)
  }}
}}

"""


def generated(lines=2000):
    """A model of `lines` lines or a few more: blocks, then a model calling each."""
    n = 1
    while True:
        head = "import nn\n\nmesh pod(dp: 2, mp: 2)\n\nconst T = 16\nconst D = 64\n\n"
        blocks = "".join(BLOCK.format(i=i) for i in range(n))
        subs = "".join(f"  b{i} = Block{i}(D)\n" for i in range(n))
        calls = "".join(f"    let x{i + 1} = b{i}(x{i})\n" for i in range(n))
        model = (f"model Big {{\n  embed = Embed(512@mp, D)\n{subs}\n"
                 f"  fn forward(ids: i32[B@dp, T]) -> f32[B@dp, T, D] {{\n"
                 f"    let x0 = embed(ids)\n{calls}    x{n}\n  }}\n}}\n\n")
        train = ("train Big on pod {\n  data: synthetic(vocab: 512)\n"
                 "  batch: 8, steps: 2\n  optimizer: adam(lr: 1e-3)\n}\n")
        text = head + blocks + model + train
        if text.count("\n") >= lines:
            return text
        n += 1


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def bench(server, name, path, text, rounds, hover_at, def_at, names=(), layer_edit=None,
          watch=False):
    uri = path.as_uri()
    c = Client(server)
    c.initialize(watch=watch)
    c.notify("textDocument/didOpen", {"textDocument": {
        "uri": uri, "languageId": "shard", "version": 1, "text": text}})
    diags = c.diagnostics(uri, 1)
    errors = [d for d in diags if d.get("severity") == 1]
    if errors:
        sys.exit(f"{name} does not check: {errors[0]['message']}")
    version = 1

    def edits(change):
        """Edit → diagnostics of `rounds` edits, each `change(v)` of the text."""
        nonlocal version
        xs = []
        for _ in range(rounds):
            version += 1
            t = time.perf_counter()
            c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                                "contentChanges": [{"text": change(version)}]})
            c.diagnostics(uri, version)
            xs.append((time.perf_counter() - t) * 1e3)
        return xs

    # A real change each time (the step count), so every edit is checked.
    edit = edits(lambda v: re.sub(r"steps: \d+", f"steps: {v}", text, count=1))
    rows = [("edit → diagnostics", edit)]
    if layer_edit:
        # An edit inside one layer (an init's scale): the checker does not
        # reuse the other layers' checks, so this costs what any edit does.
        rows.append(("edit → diagnostics, inside a layer", edits(lambda v: layer_edit(text, v))))
    version += 1
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                        "contentChanges": [{"text": text}]})
    c.diagnostics(uri, version)

    def timed(method, at):
        xs = []
        for _ in range(rounds):
            t = time.perf_counter()
            r = c.request(method, {"textDocument": {"uri": uri}, "position": at})
            xs.append((time.perf_counter() - t) * 1e3)
            if not r:
                sys.exit(f"{name}: {method} answered nothing")
        return xs

    hover = timed("textDocument/hover", hover_at)
    definition = timed("textDocument/definition", def_at)
    rows += [("hover", hover), ("definition", definition)]
    # References and rename of names over the workspace (the repository).
    for label, at in names:
        for method, extra in (("references", {"context": {"includeDeclaration": True}}),
                              ("rename", {"newName": "renamed_"})):
            xs = []
            for _ in range(rounds):
                t = time.perf_counter()
                c.request(f"textDocument/{method}",
                          {"textDocument": {"uri": uri}, "position": at, **extra})
                xs.append((time.perf_counter() - t) * 1e3)
            kept = " (client reports disk changes)" if watch else ""
            rows.append((f"{method} of {label}{kept}", xs))
    c.close()
    lines = text.count("\n")
    for what, xs in rows:
        print(f"| {name} ({lines} lines) | {what} | {statistics.median(xs):.1f} | {pct(xs, 90):.1f} |")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = 30
    if "--rounds" in sys.argv:
        rounds = int(sys.argv[sys.argv.index("--rounds") + 1])
        args = [a for a in args if a != str(rounds)]
    server = args[0] if args else default_server()
    print(f"{server}, {rounds} rounds, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}\n")
    print("| file | operation | median ms | p90 ms |\n|---|---|---|---|")
    gptj = ROOT / "models" / "gptj.shard"
    text = gptj.read_text()
    bench(server, "models/gptj.shard", gptj, text, rounds,
          position(text, "let attn", 4), position(text, "LayerNorm(D)"),
          names=(("a function parameter (`x`)", position(text, "fn forward(x", 11)),
                 ("a layer parameter (`D`)", position(text, "layer GPTJBlock(D", 16)),
                 ("a layer (`GPTJBlock`)", position(text, "layer GPTJBlock", 6))))
    # A client that reports changes on disk: the server keeps the workspace
    # files it read (their texts and indexes) from one search to the next.
    bench(server, "models/gptj.shard", gptj, text, rounds,
          position(text, "let attn", 4), position(text, "LayerNorm(D)"),
          names=(("a layer (`GPTJBlock`)", position(text, "layer GPTJBlock", 6)),),
          watch=True)
    big = ROOT / "target" / "lsp-bench" / "big.shard"
    big.parent.mkdir(parents=True, exist_ok=True)
    text = generated()
    big.write_text(text)
    last = text.count("let u =") - 1
    middle = f"layer Block{last // 2}(D)"

    def layer_edit(text, v):
        at = text.index(middle)
        end = text.index("normal(0.02)", at)
        return text[:end] + f"normal({0.02 + v * 1e-4:.4f})" + text[end + len("normal(0.02)"):]

    bench(server, "generated", big, text, rounds,
          position(text, f"let x{last} =", 4), position(text, f"Block{last}(D)\n"),
          layer_edit=layer_edit)


if __name__ == "__main__":
    main()
