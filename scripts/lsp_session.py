#!/usr/bin/env python3
"""A scripted editor session against `shardc lsp`, as a client library would
drive it (the standard library only: JSON-RPC framing over the server's
stdio). It opens models/gptj.shard, breaks it and fixes it (watching the
diagnostics), hovers, jumps to a standard-library definition and formats.
Exits non-zero at the first answer that is not what an editor expects.

    python3 scripts/lsp_session.py [path/to/shardc]

The default server is target/release/shardc, else target/debug/shardc.
`Client` is also what scripts/lsp_bench.py drives the server with.
"""

import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def default_server():
    for p in ("target/release/shardc", "target/debug/shardc"):
        if (ROOT / p).exists():
            return str(ROOT / p)
    sys.exit("build shardc first (cargo build --release)")


class Client:
    """A language client: requests wait for their response; notifications
    from the server are queued and read with `wait_for`."""

    def __init__(self, server, args=()):
        self.proc = subprocess.Popen(
            [server, "lsp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.inbox = queue.Queue()
        self.stash = []
        self.next_id = 1
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    self.inbox.put(None)
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            self.inbox.put(json.loads(out.read(length)))

    def send(self, msg):
        body = json.dumps({"jsonrpc": "2.0", **msg}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def notify(self, method, params):
        self.send({"method": method, "params": params})

    def wait_for(self, want, timeout=60):
        for i, m in enumerate(self.stash):
            if want(m):
                return self.stash.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            m = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            if m is None:
                raise RuntimeError("the server closed its output")
            if want(m):
                return m
            self.stash.append(m)

    def request(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.send({"id": rid, "method": method, "params": params})
        r = self.wait_for(lambda m: m.get("id") == rid and "method" not in m)
        if "error" in r:
            raise RuntimeError(f"{method}: {r['error']}")
        return r.get("result")

    def diagnostics(self, uri, version=None):
        def want(m):
            p = m.get("params", {})
            return (
                m.get("method") == "textDocument/publishDiagnostics"
                and p.get("uri") == uri
                and (version is None or p.get("version") == version)
            )

        return self.wait_for(want)["params"]["diagnostics"]

    def initialize(self, encodings=("utf-16",)):
        r = self.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": ROOT.as_uri(),
                "capabilities": {"general": {"positionEncodings": list(encodings)}},
            },
        )
        self.notify("initialized", {})
        return r

    def close(self):
        self.request("shutdown", None)
        self.notify("exit", None)
        return self.proc.wait(timeout=30)


def position(text, needle, skip=0):
    """Line and UTF-16 character of the first `needle` (plus `skip`)."""
    at = text.index(needle)
    line = text.count("\n", 0, at)
    start = text.rfind("\n", 0, at) + 1
    col = len(text[start:at].encode("utf-16-le")) // 2 + skip
    return {"line": line, "character": col}


def errors(diags):
    return [d for d in diags if d.get("severity") == 1]


def main():
    server = sys.argv[1] if len(sys.argv) > 1 else default_server()
    path = ROOT / "models" / "gptj.shard"
    text = path.read_text()
    uri = path.as_uri()
    c = Client(server)
    caps = c.initialize()["capabilities"]
    print(f"initialized: position encoding {caps['positionEncoding']}, "
          f"{sum(1 for k in caps if k.endswith('Provider'))} providers")

    def step(what, ok, detail=""):
        print(f"{'ok ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
        if not ok:
            sys.exit(1)

    c.notify("textDocument/didOpen", {"textDocument": {
        "uri": uri, "languageId": "shard", "version": 1, "text": text}})
    d = c.diagnostics(uri, 1)
    step("open models/gptj.shard", not errors(d), f"{len(d)} diagnostics, no errors")

    broken = text.replace("wo : f32[H, D / H, D]", "wo : f32[H, D / H, 2 * D]")
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2},
                                        "contentChanges": [{"text": broken}]})
    d = errors(c.diagnostics(uri, 2))
    step("break it", len(d) > 0,
         f"{d[0]['code']} at line {d[0]['range']['start']['line'] + 1}: "
         f"{d[0]['message'].splitlines()[0]}" if d else "no error")

    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3},
                                        "contentChanges": [{"text": text}]})
    step("fix it", not errors(c.diagnostics(uri, 3)))

    def hover(needle, skip=0):
        r = c.request("textDocument/hover", {"textDocument": {"uri": uri},
                                             "position": position(text, needle, skip)})
        return (r or {}).get("contents", {}).get("value", "")

    h = hover("let attn", 4)
    step("hover a let", "attn: f32[16@dp, 32, 3072] partial(mp)" in h, h.splitlines()[1])
    h = hover("psum(attn")
    step("hover a collective", "collective" in h, h.splitlines()[1])
    h = hover("pod(dp", 0)
    step("hover the mesh", "8 devices" in h, h.splitlines()[-1])

    r = c.request("textDocument/definition", {"textDocument": {"uri": uri},
                                              "position": position(text, "LayerNorm(D)")})
    target = pathlib.Path(r["uri"].removeprefix("file://"))
    line = target.read_text().splitlines()[r["range"]["start"]["line"]]
    step("jump to a stdlib definition", line.startswith("layer LayerNorm"),
         f"{target}:{r['range']['start']['line'] + 1}: {line}")

    messy = text.replace("  let h = ln(x)", "let h=ln(x)")
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 4},
                                        "contentChanges": [{"text": messy}]})
    c.diagnostics(uri, 4)
    edits = c.request("textDocument/formatting", {"textDocument": {"uri": uri},
                                                  "options": {"tabSize": 2, "insertSpaces": True}})
    step("format", bool(edits) and edits[0]["newText"] == text, "one edit, the file as committed")

    step("shut down", c.close() == 0)


if __name__ == "__main__":
    main()
