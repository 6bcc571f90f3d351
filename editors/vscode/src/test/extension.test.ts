// Wiring tests of src/extension.ts under plain Node: `vscode` and
// `vscode-languageclient/node` are replaced by small recording fakes, so these
// check what the extension hands the language client (server command,
// document selector, initializationOptions, configuration middleware) and how
// it restarts, without a VS Code install.

import { strict as assert } from 'node:assert';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import Module = require('node:module');
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, test } from 'node:test';

// A home of its own, so a `make install` on this machine does not change what the default command resolves to.
const home = mkdtempSync(join(tmpdir(), 'kernel-lsp-home-'));
process.env.HOME = home;
after(() => rmSync(home, { recursive: true, force: true }));

type Settings = Record<string, unknown>;

let userSettings: Settings = {};
const errors: string[] = [];
const commands = new Map<string, (...args: unknown[]) => unknown>();
const clients: FakeClient[] = [];

const State = { Stopped: 1, Starting: 3, Running: 2 };

class FakeClient {
  state = State.Stopped;
  stopped = false;
  notifications: Array<{ method: string; params: unknown }> = [];
  outputChannel = { appendLine: (_line: string) => undefined };
  constructor(
    public id: string,
    public name: string,
    public serverOptions: { command: string; args: string[] },
    public clientOptions: any,
  ) {
    clients.push(this);
  }
  async start(): Promise<void> {
    this.state = State.Running;
  }
  async stop(): Promise<void> {
    this.stopped = true;
    this.state = State.Stopped;
  }
  async sendNotification(type: { method: string }, params: unknown): Promise<void> {
    this.notifications.push({ method: type.method, params });
  }
}

// Settings as VS Code would hold them: only the user level is used here.
function configuration(section: string) {
  const full = (key: string) => `${section}.${key}`;
  return {
    get: (key: string, fallback?: unknown) => (full(key) in userSettings ? userSettings[full(key)] : fallback),
    inspect: (key: string) => ({ globalValue: userSettings[full(key)] }),
  };
}

const fakeVscode = {
  workspace: {
    getConfiguration: (section: string) => configuration(section),
    onDidChangeConfiguration: () => ({ dispose: () => undefined }),
  },
  window: {
    showErrorMessage: async (message: string) => {
      errors.push(message);
      return undefined;
    },
  },
  commands: {
    registerCommand: (name: string, fn: (...args: unknown[]) => unknown) => {
      commands.set(name, fn);
      return { dispose: () => commands.delete(name) };
    },
  },
  Uri: { parse: (text: string) => ({ toString: () => text }) },
};

const fakeClientModule = {
  LanguageClient: FakeClient,
  State,
  DidChangeConfigurationNotification: { type: { method: 'workspace/didChangeConfiguration' } },
};

const moduleWithLoad = Module as unknown as { _load: (request: string, ...rest: unknown[]) => unknown };
const originalLoad = moduleWithLoad._load;
moduleWithLoad._load = function (request: string, ...rest: unknown[]) {
  if (request === 'vscode') return fakeVscode;
  if (request === 'vscode-languageclient/node') return fakeClientModule;
  return originalLoad.call(this, request, ...rest);
};
const extension = require('../extension') as typeof import('../extension');

const packageJSON = JSON.parse(readFileSync(join(__dirname, '..', '..', 'package.json'), 'utf8'));

async function activate(settings: Settings): Promise<void> {
  userSettings = settings;
  await extension.activate({ subscriptions: [], extension: { packageJSON } } as any);
}

afterEach(async () => {
  await extension.deactivate();
  clients.length = 0;
  errors.length = 0;
  commands.clear();
});

test('starts the configured command with only the server settings the user set', async () => {
  await activate({
    'kernelLsp.server.command': ['/venv/bin/python', '-m', 'kernel_lsp', 'serve'],
    'kernelLsp.trace.server': 'verbose',
    'kernelLsp.arch': 'sm_80',
    'kernelLsp.extraFlags': ['-std=c++17'],
  });
  assert.equal(clients.length, 1);
  const [client] = clients;
  assert.equal(client.id, 'kernelLsp');
  assert.deepEqual(client.serverOptions, { command: '/venv/bin/python', args: ['-m', 'kernel_lsp', 'serve'] });
  assert.deepEqual(client.clientOptions.initializationOptions, { arch: 'sm_80', extraFlags: ['-std=c++17'] });
  const languages = client.clientOptions.documentSelector.map((s: { language: string }) => s.language);
  assert.ok(languages.includes('cuda') && languages.includes('cuda-cpp'));
  assert.equal(client.state, State.Running);
});

test('one server for every workspace folder and for files outside them', async () => {
  await activate({});
  assert.equal(clients.length, 1);
  const options = clients[0].clientOptions;
  // Not bound to one folder: the client sends every workspace folder (and their changes) to one server.
  assert.equal(options.workspaceFolder, undefined);
  for (const selector of options.documentSelector) {
    assert.equal(selector.pattern, undefined, 'a selector pattern would split files between servers');
  }
  assert.ok(options.documentSelector.some((s: { scheme: string }) => s.scheme === 'untitled'));
});

test('answers workspace/configuration for kernelLsp without client-only keys', async () => {
  await activate({ 'kernelLsp.arch': 'sm_75', 'kernelLsp.server.command': ['kernel-lsp', 'serve'] });
  const middleware = clients[0].clientOptions.middleware.workspace;
  const params = { items: [{ section: 'kernelLsp' }, { section: 'editor' }] };
  const next = async () => [{ arch: 'sm_75', server: { command: ['kernel-lsp', 'serve'] } }, { tabSize: 4 }];
  const answer = await middleware.configuration(params, {}, next);
  assert.deepEqual(answer, [{ arch: 'sm_75' }, { tabSize: 4 }]);

  await middleware.didChangeConfiguration(['kernelLsp'], async () => undefined);
  assert.deepEqual(clients[0].notifications, [
    { method: 'workspace/didChangeConfiguration', params: { settings: { kernelLsp: { arch: 'sm_75' } } } },
  ]);
});

test('the restart command stops the client and starts a new one', async () => {
  await activate({});
  assert.deepEqual(clients[0].serverOptions, { command: 'kernel-lsp', args: ['serve'] });
  await commands.get('kernelLsp.restartServer')!();
  assert.equal(clients.length, 2);
  assert.ok(clients[0].stopped);
  assert.equal(clients[1].state, State.Running);
});

test('a malformed server command is reported, not started', async () => {
  await activate({ 'kernelLsp.server.command': 'kernel-lsp serve' });
  assert.equal(clients.length, 0);
  assert.equal(errors.length, 1);
  assert.match(errors[0], /kernelLsp\.server\.command/);
});

test('the default command finds kernel-lsp in ~/.local/bin when PATH does not have it yet', async () => {
  const savedPath = process.env.PATH;
  const bin = join(home, '.local', 'bin');
  mkdirSync(bin, { recursive: true });
  writeFileSync(join(bin, 'kernel-lsp'), '#!/bin/sh\n');
  chmodSync(join(bin, 'kernel-lsp'), 0o755);
  process.env.PATH = '/nonexistent';
  try {
    await activate({});
    assert.deepEqual(clients[0].serverOptions, { command: join(bin, 'kernel-lsp'), args: ['serve'] });
    // On PATH it is started by name, as the user's PATH finds it.
    process.env.PATH = bin;
    await commands.get('kernelLsp.restartServer')!();
    assert.deepEqual(clients[1].serverOptions, { command: 'kernel-lsp', args: ['serve'] });
  } finally {
    process.env.PATH = savedPath;
    rmSync(bin, { recursive: true, force: true });
  }
});
