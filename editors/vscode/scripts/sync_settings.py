"""Keep the extension's ``kernelLsp.*`` settings in step with ``kernel_lsp.config.Settings``.

The server's typed Settings are the single source of truth: this script derives
one VS Code configuration property per field (camelCase key, JSON type, default,
and the field's docstring as description) and writes them into package.json.

    python editors/vscode/scripts/sync_settings.py          # rewrite package.json
    python editors/vscode/scripts/sync_settings.py --check  # exit 1 if it is stale

Run it with the project's Python (``.venv/bin/python``) so ``kernel_lsp`` imports.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path

from kernel_lsp import config

PACKAGE_JSON = Path(__file__).resolve().parent.parent / "package.json"

# Settings read by the extension itself rather than the server; they live under
# the same section, so the extension strips them before handing settings over.
CLIENT_PROPERTIES = {
    "kernelLsp.server.command": {
        "type": "array",
        "items": {"type": "string"},
        "default": ["kernel-lsp", "serve"],
        "description": "Command that starts the language server over stdio: the executable, then its arguments "
        "(e.g. [\"/path/to/.venv/bin/python\", \"-m\", \"kernel_lsp\", \"serve\"]). "
        "Changing it restarts the server.",
        "scope": "machine-overridable",
        "order": 0,
    },
    "kernelLsp.trace.server": {
        "type": "string",
        "enum": ["off", "messages", "verbose"],
        "default": "off",
        "description": "Log the LSP messages between VS Code and the server in the 'kernel-lsp' output channel.",
        "order": 1,
    },
}

def field_docs() -> dict[str, str]:
    """Attribute docstrings of Settings (the string literal right after each field)."""
    tree = ast.parse(inspect.getsource(config))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    docs: dict[str, str] = {}
    for stmt, nxt in zip(cls.body, cls.body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = _plain(nxt.value.value)
    return docs


def _plain(doc: str) -> str:
    """A docstring as VS Code shows it: wire names for fields, JSON null for None, no reST."""

    def literal(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"'kernelLsp.{config._camel(name)}'" if name in config.FIELDS else f"'{name}'"

    doc = re.sub(r"``([^`]+)``", literal, doc)
    doc = re.sub(r"\bNone\b", "null", doc)
    return " ".join(doc.split())


def json_type(hint: object) -> tuple[str | list[str], dict]:
    """JSON schema type (and extra schema keys) for a Settings type hint."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {hint}")
        base, extra = json_type(inner[0])
        return [base, "null"], extra
    if origin is tuple:
        return "array", {"items": {"type": "string"}}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in simple:
        return simple[hint], {}
    raise TypeError(f"unsupported setting type {hint}")


def server_properties() -> dict[str, dict]:
    hints = typing.get_type_hints(config.Settings)
    docs = field_docs()
    props: dict[str, dict] = {}
    for order, f in enumerate(dataclasses.fields(config.Settings), start=len(CLIENT_PROPERTIES)):
        if f.name == "problems":
            continue
        kind, extra = json_type(hints[f.name])
        default = f.default
        if isinstance(default, tuple):
            default = list(default)
        prop = {"type": kind, **extra, "default": default, "description": docs[f.name], "order": order}
        if f.name in config.USER_LEVEL:
            # "machine": VS Code takes the value from user settings only and ignores a workspace's
            # .vscode/settings.json, so a cloned repository cannot choose what kernel-lsp runs.
            prop["scope"] = "machine"
        props["kernelLsp." + config._camel(f.name)] = prop
    return props


def expected_properties() -> dict[str, dict]:
    return {**CLIENT_PROPERTIES, **server_properties()}


def main(argv: list[str]) -> int:
    package = json.loads(PACKAGE_JSON.read_text(encoding="utf-8"))
    configuration = package["contributes"]["configuration"]
    wanted = expected_properties()
    if "--check" in argv:
        if configuration["properties"] != wanted:
            have = configuration["properties"]
            differ = sorted(k for k in set(have) | set(wanted) if have.get(k) != wanted.get(k))
            print(
                f"{PACKAGE_JSON} is stale in {differ}; run editors/vscode/scripts/sync_settings.py",
                file=sys.stderr,
            )
            return 1
        return 0
    configuration["properties"] = wanted
    PACKAGE_JSON.write_text(json.dumps(package, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
