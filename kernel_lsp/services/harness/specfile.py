"""Reading a launch spec from disk (the core parser never does IO)."""

from __future__ import annotations

import json
import os

from kernel_lsp.core.spec import Spec, SpecError, parse_spec


def load_spec_file(path: str | os.PathLike[str]) -> Spec:
    """Parse the launch spec v1 JSON file at ``path``; ``file()`` inputs resolve against its folder.

    Raises :class:`SpecError` for a missing, unreadable or invalid file.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise SpecError([f"cannot read spec file {os.fspath(path)}: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise SpecError([f"spec file {os.fspath(path)} is not UTF-8 text (byte {exc.start})"]) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise SpecError([f"{os.fspath(path)} is nested too deeply to read"]) from None
    except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        raise SpecError([f"{os.fspath(path)} is not valid JSON: {exc}"]) from None
    return parse_spec(data, os.path.dirname(os.path.abspath(path)))
