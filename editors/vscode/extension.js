// Thin VS Code client for the shardc language server (`shardc lsp`, stdio).
// Plain CommonJS; `npm run build` bundles it with vscode-languageclient into
// dist/extension.js, the packaged entry point. `shardc lsp` accepts the
// `--stdio` (and `--clientProcessId`) the client appends for this transport.
'use strict';

const vscode = require('vscode');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration('shard');
  const command = config.get('server.path', 'shardc');
  const args = ['lsp', ...config.get('server.extraArgs', [])];

  const serverOptions = { command, args, transport: TransportKind.stdio };
  const clientOptions = {
    documentSelector: [{ scheme: 'file', language: 'shard' }],
    synchronize: {
      fileEvents: vscode.workspace.createFileSystemWatcher('**/*.shard'),
    },
  };

  client = new LanguageClient('shard', 'shardc language server', serverOptions, clientOptions);
  client.start().catch((err) => {
    vscode.window.showErrorMessage(
      `Could not start \`${command} lsp\` (set "shard.server.path"): ${err.message || err}`,
    );
  });
  context.subscriptions.push({ dispose: () => deactivate() });
  // The extension's API: the client (tests wait on its state).
  return { client };
}

function deactivate() {
  if (!client) return undefined;
  const c = client;
  client = undefined;
  return c.stop();
}

module.exports = { activate, deactivate };
