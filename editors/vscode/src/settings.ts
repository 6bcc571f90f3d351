// Settings logic of the extension, kept free of the `vscode` module so that it
// can be unit-tested under plain Node (src/test/settings.test.ts).

import * as path from 'node:path';

export const SECTION = 'kernelLsp';
export const DEFAULT_COMMAND = ['kernel-lsp', 'serve'];

// Keys under kernelLsp.* that configure this client; the server reports
// unknown keys as problems, so they never reach it.
const CLIENT_ONLY_PREFIXES = ['server.', 'trace.'];

/** The parts of vscode.WorkspaceConfiguration that are used here. */
export interface ConfigReader {
  get(key: string): unknown;
  inspect(key: string):
    | {
        globalValue?: unknown;
        workspaceValue?: unknown;
        workspaceFolderValue?: unknown;
        globalLanguageValue?: unknown;
        workspaceLanguageValue?: unknown;
        workspaceFolderLanguageValue?: unknown;
      }
    | undefined;
}

/** The server's setting names (without the section) among package.json's configuration properties. */
export function serverKeys(properties: Record<string, unknown>): string[] {
  return Object.keys(properties)
    .filter((name) => name.startsWith(SECTION + '.'))
    .map((name) => name.slice(SECTION.length + 1))
    .filter((key) => !CLIENT_ONLY_PREFIXES.some((prefix) => key.startsWith(prefix)));
}

/**
 * The server settings the user actually set, at any level. Defaults are left
 * out: sending them would hide the server's own user config file, which sits
 * below editor settings in the server's resolution order.
 */
export function explicitSettings(config: ConfigReader, keys: string[]): Record<string, unknown> {
  const settings: Record<string, unknown> = {};
  for (const key of keys) {
    const info = config.inspect(key);
    const explicit =
      info !== undefined &&
      [
        info.globalValue,
        info.workspaceValue,
        info.workspaceFolderValue,
        info.globalLanguageValue,
        info.workspaceLanguageValue,
        info.workspaceFolderLanguageValue,
      ].some((value) => value !== undefined);
    if (explicit) {
      settings[key] = config.get(key);
    }
  }
  return settings;
}

/** kernelLsp.server.command as executable + arguments, or a message saying what is wrong with it. */
export function parseCommand(argv: unknown): { command: string; args: string[] } | string {
  if (!Array.isArray(argv) || argv.length === 0 || !argv.every((part) => typeof part === 'string' && part !== '')) {
    return `kernelLsp.server.command must be a non-empty array of strings, got ${JSON.stringify(argv)}`;
  }
  return { command: argv[0], args: argv.slice(1) };
}

/** Where `make install` (in a kernel-lsp checkout) and `pipx install` put the `kernel-lsp` command. */
export const USER_BIN = path.join('.local', 'bin');

/**
 * The executable to start for `command`: a bare name found on `pathEnv` as it is; one that is not there
 * but sits in ~/.local/bin (`make install`, pipx) as that file. The login profile adds ~/.local/bin to
 * PATH only once it exists, so a VS Code started before the install does not see it until the next
 * login. Paths, and names found nowhere, are left for the language client (and its error) as given.
 */
export function resolveExecutable(
  command: string,
  pathEnv: string | undefined,
  home: string,
  isExecutable: (file: string) => boolean,
): string {
  if (command.includes('/') || command.includes(path.sep)) {
    return command;
  }
  const onPath = (pathEnv ?? '').split(path.delimiter).filter((folder) => folder !== '');
  if (onPath.some((folder) => isExecutable(path.join(folder, command)))) {
    return command;
  }
  const installed = path.join(home, USER_BIN, command);
  return home !== '' && isExecutable(installed) ? installed : command;
}
