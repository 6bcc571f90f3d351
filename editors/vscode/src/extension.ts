// VS Code client for the kernel-lsp language server.
//
// The server speaks LSP over stdio. Its settings live under `kernelLsp.*`; the
// same section also holds this client's `server.command` and `trace.server`,
// which are stripped (src/settings.ts) before anything reaches the server.

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from 'vscode-languageclient/node';
import { DEFAULT_COMMAND, SECTION, explicitSettings, parseCommand, resolveExecutable, serverKeys } from './settings';

let client: LanguageClient | undefined;
let keys: string[] = [];

function serverSettings(scope?: vscode.Uri): Record<string, unknown> {
  return explicitSettings(vscode.workspace.getConfiguration(SECTION, scope), keys);
}

function configuredCommand(): unknown {
  return vscode.workspace.getConfiguration(SECTION).get<unknown>('server.command', DEFAULT_COMMAND);
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

function createClient(): LanguageClient | undefined {
  const argv = parseCommand(configuredCommand());
  if (typeof argv === 'string') {
    void vscode.window.showErrorMessage(`kernel-lsp: ${argv}`);
    return undefined;
  }
  const command = resolveExecutable(argv.command, process.env.PATH, os.homedir(), isExecutable);
  const serverOptions: ServerOptions = { command, args: argv.args };
  // One client, hence one server, for the whole window: every workspace folder is sent to it
  // (workspace/didChangeWorkspaceFolders keeps it current) and files outside the folders use it too.
  // A client per folder would start a server per folder (about 74 MB each).
  const clientOptions: LanguageClientOptions = {
    // 'cuda' is ours; 'cuda-cpp' is what VS Code's built-in C++ support (and
    // other CUDA extensions) call the same files, so serve whichever one wins.
    documentSelector: [
      { scheme: 'file', language: 'cuda' },
      { scheme: 'untitled', language: 'cuda' },
      { scheme: 'file', language: 'cuda-cpp' },
      { scheme: 'untitled', language: 'cuda-cpp' },
    ],
    initializationOptions: serverSettings(),
    synchronize: { configurationSection: SECTION },
    middleware: {
      workspace: {
        // Answer workspace/configuration for our section with the server's keys only.
        configuration: async (params, token, next) => {
          const answers = await next(params, token);
          if (!Array.isArray(answers)) {
            return answers;
          }
          return params.items.map((item, index) =>
            item.section === SECTION
              ? serverSettings(item.scopeUri ? vscode.Uri.parse(item.scopeUri) : undefined)
              : answers[index],
          );
        },
        // Same filtering for the change notification the client pushes.
        didChangeConfiguration: async () => {
          await client?.sendNotification(DidChangeConfigurationNotification.type, {
            settings: { [SECTION]: serverSettings() },
          });
        },
      },
    },
  };
  return new LanguageClient(SECTION, 'kernel-lsp', serverOptions, clientOptions);
}

async function start(): Promise<void> {
  client = createClient();
  if (!client) {
    return;
  }
  try {
    await client.start();
  } catch (error) {
    void vscode.window.showErrorMessage(
      `kernel-lsp: could not start the server (${JSON.stringify(configuredCommand())}): ${String(error)}. ` +
        'Install it (`make install` in a kernel-lsp checkout links ~/.local/bin/kernel-lsp) or set kernelLsp.server.command.',
    );
  }
}

async function stop(): Promise<void> {
  const running = client;
  client = undefined;
  if (running && running.state !== State.Stopped) {
    try {
      await running.stop();
    } catch (error) {
      // A server that never started cannot be stopped cleanly; nothing is left to clean up.
      running.outputChannel.appendLine(`kernel-lsp: stopping the server failed: ${String(error)}`);
    }
  }
}

async function restart(): Promise<void> {
  await stop();
  await start();
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  // The server's setting names come from this extension's own package.json
  // (generated from kernel_lsp/config.py), so the list is written once.
  keys = serverKeys(context.extension.packageJSON?.contributes?.configuration?.properties ?? {});
  context.subscriptions.push(
    vscode.commands.registerCommand('kernelLsp.restartServer', restart),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration(`${SECTION}.server.command`)) {
        void restart();
      }
    }),
    { dispose: () => void stop() },
  );
  await start();
}

export async function deactivate(): Promise<void> {
  await stop();
}
