// Settings logic of the extension, kept free of the `vscode` module so that it
// can be unit-tested under plain Node (src/test/settings.test.ts).

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
