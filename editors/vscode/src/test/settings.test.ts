// Unit tests of the extension's settings logic: `npm test` (Node's own test runner).

import { strict as assert } from 'node:assert';
import { test } from 'node:test';
import { ConfigReader, explicitSettings, parseCommand, resolveExecutable, serverKeys } from '../settings';

// A stand-in for vscode.WorkspaceConfiguration: defaults plus the values set per level.
function reader(defaults: Record<string, unknown>, user: Record<string, unknown>, folder: Record<string, unknown> = {}): ConfigReader {
  return {
    get: (key) => (key in folder ? folder[key] : key in user ? user[key] : defaults[key]),
    inspect: (key) =>
      key in defaults || key in user || key in folder
        ? { globalValue: user[key], workspaceFolderValue: folder[key] }
        : undefined,
  };
}

test('serverKeys drops client-only settings and other sections', () => {
  const keys = serverKeys({
    'kernelLsp.server.command': {},
    'kernelLsp.trace.server': {},
    'kernelLsp.nvccPath': {},
    'kernelLsp.extraFlags': {},
    'otherExt.arch': {},
  });
  assert.deepEqual(keys, ['nvccPath', 'extraFlags']);
});

test('explicitSettings sends only what the user set, at the level that wins', () => {
  const config = reader(
    { nvccPath: 'nvcc', arch: 'sm_90', extraFlags: [], profileProgram: null },
    { arch: 'sm_80', extraFlags: ['-G'] },
    { arch: 'sm_75' },
  );
  const settings = explicitSettings(config, ['nvccPath', 'arch', 'extraFlags', 'profileProgram']);
  assert.deepEqual(settings, { arch: 'sm_75', extraFlags: ['-G'] });
});

test('explicitSettings keeps an explicit null (the user clearing a setting)', () => {
  const config = reader({ model: 'small' }, { model: null });
  assert.deepEqual(explicitSettings(config, ['model']), { model: null });
});

test('parseCommand splits executable and arguments and rejects bad values', () => {
  assert.deepEqual(parseCommand(['python', '-m', 'kernel_lsp', 'serve']), {
    command: 'python',
    args: ['-m', 'kernel_lsp', 'serve'],
  });
  for (const bad of [[], 'kernel-lsp serve', ['kernel-lsp', 3], [''], null]) {
    assert.equal(typeof parseCommand(bad), 'string', JSON.stringify(bad));
  }
});

test('resolveExecutable finds kernel-lsp on PATH, else in ~/.local/bin, else leaves it as given', () => {
  const files = new Set(['/usr/bin/kernel-lsp', '/home/u/.local/bin/kernel-lsp', '/home/u/.local/bin/other']);
  const exists = (file: string) => files.has(file);
  assert.equal(resolveExecutable('kernel-lsp', '/bin:/usr/bin', '/home/u', exists), 'kernel-lsp');
  assert.equal(resolveExecutable('kernel-lsp', '/bin', '/home/u', exists), '/home/u/.local/bin/kernel-lsp');
  assert.equal(resolveExecutable('kernel-lsp', undefined, '/home/u', exists), '/home/u/.local/bin/kernel-lsp');
  assert.equal(resolveExecutable('kernel-lsp', '/bin', '/home/v', exists), 'kernel-lsp');
  assert.equal(resolveExecutable('kernel-lsp', '/bin', '', exists), 'kernel-lsp');
  // A path is the user's choice, found or not.
  assert.equal(resolveExecutable('/opt/kernel-lsp', '/bin', '/home/u', exists), '/opt/kernel-lsp');
  assert.equal(resolveExecutable('./kernel-lsp', '/bin', '/home/u', exists), './kernel-lsp');
});
