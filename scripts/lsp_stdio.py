#!/usr/bin/env python3
"""A minimal LSP client on Python's standard library alone (JSON-RPC framing
over a server's stdio), for scripts that should run without installing
anything: scripts/lsp_bench.py times `shardc lsp` with it. The scripted
editor session (scripts/lsp_session.py) uses a real client library, pygls.

`Client` starts `shardc lsp` and sends requests and notifications; `position`
turns a needle in a text into an LSP position (UTF-16).
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

    def initialize(self, encodings=("utf-16",), watch=False):
        """`watch`: say the client reports changes on disk (as VS Code does),
        so the server keeps what it read of the workspace between searches."""
        caps = {"general": {"positionEncodings": list(encodings)}}
        if watch:
            caps["workspace"] = {"didChangeWatchedFiles": {"dynamicRegistration": True}}
        r = self.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": ROOT.as_uri(),
                "capabilities": caps,
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
