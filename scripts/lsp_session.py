#!/usr/bin/env python3
"""A scripted editor session against `shardc lsp`, driven by a real LSP client
library: pygls's `BaseLanguageClient` (typed lsprotocol requests over the
server's stdio). It opens models/gptj.shard, breaks it and fixes it (watching
the published diagnostics), hovers, jumps to a standard-library definition
and formats, types half a line (semantic tokens, inlay hints and a
definition must then be mapped to the new text or withheld, never stale),
then shuts the server down. Each step prints `ok` or `FAIL`;
the first failure (a wrong answer, an error response, a timeout, a server
that exits early or with a non-zero status) ends the script with status 1
and says why.

    python3 -m venv target/lsp-venv && target/lsp-venv/bin/pip install -r scripts/requirements-lsp.txt
    target/lsp-venv/bin/python scripts/lsp_session.py [path/to/shardc]

The default server is target/release/shardc, else target/debug/shardc.
tests/lsp_pygls.rs runs this script when a Python with pygls is available.
"""

import asyncio
import os
import pathlib
import re
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lsp_stdio import ROOT, default_server, position  # noqa: E402

try:
    import attrs
    import pygls
    from lsprotocol import types
    from pygls.exceptions import JsonRpcException
    from pygls.lsp.client import BaseLanguageClient
except ImportError as e:  # pragma: no cover - the message is the point
    sys.exit(f"lsp_session.py needs pygls ({e}): "
             "pip install -r scripts/requirements-lsp.txt")

# Seconds any one answer may take (a debug build checks gptj in well under one).
TIMEOUT = 60


class Failed(Exception):
    """A step did not get what an editor expects."""


class Session(BaseLanguageClient):
    """The client: published diagnostics are queued (by the handler below)
    and read with `diagnostics`, the server's exit status is kept."""

    def __init__(self):
        super().__init__("shardc-lsp-session", "1")
        self.published = asyncio.Queue()
        self.stash = []
        self.returncode = None
        self.exited = asyncio.Event()
        self.stderr = []

    async def server_exit(self, server):
        self.returncode = server.returncode
        self.exited.set()

    def report_server_error(self, error, source):
        print(f"pygls: the server sent something unexpected: {error}", file=sys.stderr)

    async def drain_stderr(self):
        """Reads the server's log (so that it never blocks on a full pipe);
        shown when a step fails."""
        while self._server is None:
            await asyncio.sleep(0.01)
        while line := await self._server.stderr.readline():
            self.stderr.append(line.decode(errors="replace").rstrip())

    async def diagnostics(self, uri, version):
        """The diagnostics published for `uri` at `version`."""
        for i, p in enumerate(self.stash):
            if p.uri == uri and p.version == version:
                return self.stash.pop(i).diagnostics
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while True:
            left = deadline - loop.time()
            if left <= 0 or self.exited.is_set():
                break
            try:
                p = await asyncio.wait_for(self.published.get(), min(left, 0.5))
            except asyncio.TimeoutError:
                continue
            if p.uri == uri and p.version == version:
                return p.diagnostics
            self.stash.append(p)
        why = "the server exited" if self.exited.is_set() else f"none within {TIMEOUT} s"
        raise Failed(f"no diagnostics for version {version} of {uri} ({why})")


def on_diagnostics(ls, params: types.PublishDiagnosticsParams):
    ls.published.put_nowait(params)


async def ask(client, what, request):
    """Awaits a request's answer, turning error responses, timeouts and a
    server that exits first into failures."""
    answer = asyncio.ensure_future(request)
    exited = asyncio.ensure_future(client.exited.wait())
    done, _ = await asyncio.wait({answer, exited}, timeout=TIMEOUT,
                                 return_when=asyncio.FIRST_COMPLETED)
    exited.cancel()
    if answer in done:
        try:
            return answer.result()
        except JsonRpcException as e:
            raise Failed(f"{what}: the server answered an error: {e}") from None
    answer.cancel()
    if exited in done:
        raise Failed(f"{what}: the server exited (status {client.returncode}) "
                     "before answering")
    raise Failed(f"{what}: no answer within {TIMEOUT} s")


def step(what, ok, detail=""):
    print(f"{'ok ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        raise Failed(what)


def pos(text, needle, skip=0):
    p = position(text, needle, skip)
    return types.Position(line=p["line"], character=p["character"])


def errors(diags):
    return [d for d in diags if d.severity == types.DiagnosticSeverity.Error]


async def session(client, server):
    path = ROOT / "models" / "gptj.shard"
    text = path.read_text()
    uri = path.as_uri()
    doc = types.TextDocumentIdentifier(uri=uri)

    client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(on_diagnostics)
    await client.start_io(server, "lsp")
    asyncio.get_running_loop().create_task(client.drain_stderr())
    init = await ask(client, "initialize", client.initialize_async(types.InitializeParams(
        process_id=os.getpid(),
        root_uri=ROOT.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=ROOT.as_uri(), name=ROOT.name)],
        capabilities=types.ClientCapabilities(general=types.GeneralClientCapabilities(
            position_encodings=[types.PositionEncodingKind.Utf16])),
    )))
    caps = init.capabilities
    providers = sum(1 for f in attrs.fields(type(caps))
                    if f.name.endswith("_provider") and getattr(caps, f.name) is not None)
    info = init.server_info
    print(f"initialized {info.name if info else '?'} {info.version if info else ''} "
          f"with pygls {pygls_version()}: position encoding {caps.position_encoding}, "
          f"{providers} providers")
    client.initialized(types.InitializedParams())

    def change(version, new_text):
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeEvent_Type2(text=new_text)]))

    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="shard", version=1, text=text)))
    d = await client.diagnostics(uri, 1)
    step("open models/gptj.shard", not errors(d), f"{len(d)} diagnostics, no errors")

    broken = text.replace("wo : f32[H, D / H, D]", "wo : f32[H, D / H, 2 * D]")
    step("the edit changes the file", broken != text)
    change(2, broken)
    d = errors(await client.diagnostics(uri, 2))
    step("break it", len(d) > 0,
         f"{d[0].code} at line {d[0].range.start.line + 1}: "
         f"{d[0].message.splitlines()[0]}" if d else "no error")

    change(3, text)
    d = errors(await client.diagnostics(uri, 3))
    step("fix it", not d, "no errors" if not d else d[0].message.splitlines()[0])

    async def hover(needle, skip=0):
        r = await ask(client, f"hover at {needle!r}", client.text_document_hover_async(
            types.HoverParams(text_document=doc, position=pos(text, needle, skip))))
        value = getattr(getattr(r, "contents", None), "value", "") if r else ""
        return value, (value.splitlines() or [""])

    h, lines = await hover("let attn", 4)
    want = "attn: f32[16@dp, 32, 3072] partial(mp)"
    step("hover a let", want in h, lines[1] if len(lines) > 1 else f"no {want!r} in {h!r}")
    h, lines = await hover("psum(attn")
    step("hover a collective", "collective" in h, lines[-1])
    h, lines = await hover("pod(dp")
    step("hover the mesh", "8 devices" in h, lines[-1])

    r = await ask(client, "definition", client.text_document_definition_async(
        types.DefinitionParams(text_document=doc, position=pos(text, "LayerNorm(D)"))))
    loc = r[0] if isinstance(r, list) and r else r
    if not isinstance(loc, types.Location):
        raise Failed(f"jump to a stdlib definition: expected a location, got {r!r}")
    target = pathlib.Path(loc.uri.removeprefix("file://"))
    line_no = loc.range.start.line
    lines = target.read_text().splitlines()
    line = lines[line_no] if line_no < len(lines) else ""
    step("jump to a stdlib definition", line.startswith("layer LayerNorm"),
         f"{target}:{line_no + 1}: {line}")

    messy = text.replace("  let h = ln(x)", "let h=ln(x)")
    step("the mess changes the file", messy != text)
    change(4, messy)
    await client.diagnostics(uri, 4)
    edits = await ask(client, "formatting", client.text_document_formatting_async(
        types.DocumentFormattingParams(
            text_document=doc, options=types.FormattingOptions(tab_size=2, insert_spaces=True))))
    step("format", bool(edits) and len(edits) == 1 and edits[0].new_text == text,
         "one edit, the file as committed" if edits else "no edits")

    await half_line(client, doc, text, change)

    await ask(client, "shutdown", client.shutdown_async(None))
    client.exit(None)
    try:
        await asyncio.wait_for(client.exited.wait(), TIMEOUT)
    except asyncio.TimeoutError:
        raise Failed(f"the server did not exit within {TIMEOUT} s of `exit`") from None
    step("shut down", client.returncode == 0, f"exit status {client.returncode}")


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


async def half_line(client, doc, text, change):
    """A line typed half-way (`let y = gelu(` before a block's `let ff`): the
    file does not parse, so the server answers from the last analysis that
    did; every position it gives must be mapped to the buffer now or
    withheld, never stale (a token on a blank, a hint on the new line, a
    definition at an old offset)."""
    anchor = "    let ff = gelu(h @ w1 + b1) @ w2"
    half = text.replace(anchor, "    let y = gelu(\n" + anchor, 1)
    lines = half.splitlines()
    typed = lines.index("    let y = gelu(")
    step("the half line changes the file", half != text)
    change(5, half)
    d = errors(await client.diagnostics(doc.uri, 5))
    step("a half line is a syntax error", bool(d) and d[0].code == "E0001",
         f"{d[0].code} at line {d[0].range.start.line + 1}" if d else "no error")

    toks = await ask(client, "semantic tokens", client.text_document_semantic_tokens_full_async(
        types.SemanticTokensParams(text_document=doc)))
    data = toks.data if toks else []
    line = col = 0
    found, off = 0, []
    for i in range(0, len(data), 5):
        dl, dc, length = data[i], data[i + 1], data[i + 2]
        line, col = line + dl, (col + dc if dl == 0 else dc)
        word = lines[line][col:col + length] if line < len(lines) else ""
        found += 1
        if not IDENT.fullmatch(word) or line == typed:
            off.append(f"{line + 1}:{col + 1} {word!r}")
    step("semantic tokens land on names", found > 100 and not off,
         f"{found} tokens, {len(off)} elsewhere {off[:3]}")

    whole = types.Range(start=types.Position(line=0, character=0),
                        end=types.Position(line=len(lines), character=0))
    hints = await ask(client, "inlay hints", client.text_document_inlay_hint_async(
        types.InlayHintParams(text_document=doc, range=whole))) or []
    bad = []
    for h in hints:
        before = lines[h.position.line][:h.position.character]
        if h.position.line == typed or not re.search(r"^\s*let \(?[A-Za-z_][A-Za-z0-9_, ]*$", before):
            bad.append(f"{h.position.line + 1}:{h.position.character + 1} after {before!r}")
    # Those from before the edit are withheld or moved with their lets.
    step("inlay hints follow their lets", not bad,
         f"{len(hints)} hints, {len(bad)} misplaced {bad[:3]}")

    r = await ask(client, "definition", client.text_document_definition_async(
        types.DefinitionParams(text_document=doc, position=pos(half, "ln_f(blocks"))))
    loc = r[0] if isinstance(r, list) and r else r
    if loc is None:
        step("definition after the edit is withheld", True, "null")
    else:
        at = loc.range.start
        got = lines[at.line][at.character:loc.range.end.character]
        step("definition after the edit lands on the name", got == "ln_f" and
             lines[at.line].lstrip().startswith("ln_f"), f"line {at.line + 1}: {got!r}")


def pygls_version():
    try:
        from importlib.metadata import version
        return version("pygls")
    except Exception:
        return getattr(pygls, "__version__", "?")


async def main():
    server = sys.argv[1] if len(sys.argv) > 1 else default_server()
    client = Session()
    status = 0
    try:
        await session(client, server)
    except Failed as e:
        print(f"lsp_session.py: failed: {e}", file=sys.stderr)
        status = 1
    except Exception as e:
        # Anything else (the server cannot be started, an answer of the wrong
        # shape): say what, with where, and fail.
        traceback.print_exc()
        print(f"lsp_session.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        status = 1
    finally:
        if status and client.stderr:
            print("the server's log:\n  " + "\n  ".join(client.stderr[-20:]), file=sys.stderr)
        try:
            await asyncio.wait_for(client.stop(), 10)
        except (asyncio.TimeoutError, Exception):
            pass
    return status


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
