// Runs the extension under plain node against a real `shardc lsp`: a minimal
// stand-in for the `vscode` module (only what vscode-languageclient touches
// while starting; everything else is an inert stub), the real extension and the
// real vscode-languageclient from node_modules (`npm ci`).
//
//   node test/run.js SHARDC MAIN MODEL.shard
//
// MAIN is `extension.js` or the bundle `dist/extension.js`. Prints one JSON
// line: the client's state, the server's capabilities, the diagnostics
// published for MODEL, and every error the extension showed. Exits 0 when the
// client reached the running state, 1 otherwise.
'use strict';

const Module = require('module');
const path = require('path');
const fs = require('fs');

const [shardc, main, model] = process.argv.slice(2);
if (!shardc || !main || !model) {
  console.error('usage: node test/run.js SHARDC MAIN MODEL.shard');
  process.exit(2);
}

const shown = [];
const logged = [];
const published = {};

// Anything not modelled below: callable, constructible, every property itself.
const inert = new Proxy(function inert() {}, {
  get(target, prop) {
    if (prop === 'then') return undefined;
    if (prop === Symbol.toPrimitive) return () => '';
    if (prop === Symbol.iterator) return function* empty() {};
    if (prop === 'dispose') return () => {};
    return inert;
  },
  apply: () => inert,
  construct: () => inert,
});
const stub = (obj) => new Proxy(obj, {
  get: (target, prop) => (prop in target ? target[prop] : inert),
});

class Disposable {
  constructor(fn) { this.fn = fn; }
  static from(...ds) { return new Disposable(() => ds.forEach((d) => d && d.dispose && d.dispose())); }
  dispose() { if (this.fn) this.fn(); this.fn = undefined; }
}
class EventEmitter {
  constructor() {
    this.listeners = [];
    this.event = (l) => { this.listeners.push(l); return new Disposable(() => {}); };
  }
  fire(e) { this.listeners.forEach((l) => l(e)); }
  dispose() { this.listeners = []; }
}
const event = () => new Disposable(() => {});
class Uri {
  constructor(s) { this.s = s; this.scheme = s.split(':')[0]; this.fsPath = decodeURIComponent(s.replace(/^file:\/\//, '')); this.path = this.fsPath; }
  static parse(s) { return new Uri(s); }
  static file(p) { return new Uri(`file://${encodeURI(p)}`); }
  toString() { return this.s; }
  toJSON() { return this.s; }
  with() { return this; }
}
class CancellationTokenSource {
  constructor() { this.token = { isCancellationRequested: false, onCancellationRequested: event }; }
  cancel() { this.token.isCancellationRequested = true; }
  dispose() {}
}
class Position { constructor(line, character) { this.line = line; this.character = character; } }
class Range {
  constructor(a, b, c, d) {
    if (typeof a === 'number') { this.start = new Position(a, b); this.end = new Position(c, d); } else { this.start = a; this.end = b; }
  }
}
class Diagnostic { constructor(range, message, severity) { this.range = range; this.message = message; this.severity = severity; } }

const settings = {
  'server.path': shardc,
  // The documented extra argument: the server must start with it.
  'server.extraArgs': ['--strict'],
  'trace.server': process.env.SHARD_TRACE || 'off',
};
const text = fs.readFileSync(model, 'utf8');
const doc = {
  uri: Uri.file(path.resolve(model)),
  fileName: path.resolve(model),
  languageId: 'shard',
  version: 1,
  isClosed: false,
  getText: () => text,
};

const vscode = stub({
  version: '1.82.0',
  Disposable,
  EventEmitter,
  Uri,
  Position,
  Range,
  Diagnostic,
  CancellationTokenSource,
  DiagnosticSeverity: { Error: 0, Warning: 1, Information: 2, Hint: 3 },
  env: stub({ language: 'en', appName: 'node', machineId: 'test', sessionId: 'test', uiKind: 1 }),
  workspace: stub({
    getConfiguration: () => ({
      get: (key, dflt) => (key in settings ? settings[key] : dflt),
      has: (key) => key in settings,
      update: async () => {},
      inspect: () => undefined,
    }),
    workspaceFolders: undefined,
    textDocuments: [doc],
    notebookDocuments: [],
    onDidOpenTextDocument: event,
    onDidCloseTextDocument: event,
    onDidChangeTextDocument: event,
    onDidSaveTextDocument: event,
    onWillSaveTextDocument: event,
    onDidChangeConfiguration: event,
    onDidChangeWorkspaceFolders: event,
    createFileSystemWatcher: () => stub({ onDidCreate: event, onDidChange: event, onDidDelete: event, dispose() {} }),
  }),
  languages: stub({
    match: (selector, d) => (d.languageId === 'shard' ? 10 : 0),
    createDiagnosticCollection: (name) => stub({
      name,
      set: (uri, diags) => { published[String(uri)] = (diags || []).map((x) => ({ message: x.message, line: x.range.start.line, severity: x.severity, code: x.code && (x.code.value || x.code) })); },
      delete: () => {},
      clear: () => {},
      dispose: () => {},
    }),
  }),
  window: stub({
    createOutputChannel: (name) => stub({
      name,
      append: (s) => logged.push(s),
      appendLine: (s) => logged.push(s),
      replace: () => {}, clear: () => {}, show: () => {}, hide: () => {}, dispose: () => {},
    }),
    showErrorMessage: async (m) => { shown.push(String(m)); return undefined; },
    showWarningMessage: async (m) => { shown.push(String(m)); return undefined; },
    showInformationMessage: async () => undefined,
    activeTextEditor: undefined,
    visibleTextEditors: [],
    onDidChangeActiveTextEditor: event,
    onDidChangeVisibleTextEditors: event,
  }),
});

const load = Module._load;
Module._load = function stubbed(request, ...rest) {
  return request === 'vscode' ? vscode : load.call(this, request, ...rest);
};

const { State } = require(path.resolve(__dirname, '../node_modules/vscode-languageclient/node'));
const ext = require(path.resolve(main));

async function main_() {
  const context = { subscriptions: [], extensionPath: path.resolve(__dirname, '..') };
  const api = ext.activate(context);
  const client = api && api.client;
  const deadline = Date.now() + (Number(process.env.SHARD_WAIT_MS) || 20000);
  const uri = String(doc.uri);
  while (Date.now() < deadline) {
    const running = client && client.state === State.Running;
    if (running && published[uri]) break;
    if (client && client.state === State.Stopped && shown.length) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const result = {
    state: client ? Object.keys(State).find((k) => State[k] === client.state) : 'none',
    capabilities: client && client.initializeResult ? client.initializeResult.capabilities : null,
    serverInfo: client && client.initializeResult ? client.initializeResult.serverInfo || null : null,
    diagnostics: published[uri] || null,
    publishedFor: Object.keys(published),
    shown,
    log: logged.slice(-20),
  };
  if (client && client.state === State.Running) await ext.deactivate();
  result.stopped = client ? Object.keys(State).find((k) => State[k] === client.state) : 'none';
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(result.state === 'Running' ? 0 : 1);
}

main_().catch((e) => {
  process.stdout.write(`${JSON.stringify({ state: 'threw', error: String(e && e.stack || e), shown, log: logged })}\n`);
  process.exit(1);
});
