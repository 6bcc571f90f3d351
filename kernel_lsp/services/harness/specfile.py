"""Reading a launch spec from disk (the core parser never does IO).

A spec's ``file(NAME.npy)`` inputs are checked here, where the disk is: each must be a file inside the
spec's folder once links are resolved (the parser already refused names with ``..`` or an absolute path),
so a missing or escaping file is a spec error before any GPU work, not a traceback in the harness.
"""

from __future__ import annotations

import json
import os

from kernel_lsp.core.inputs import file_names
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
    return with_files_checked(parse_spec(data, os.path.dirname(os.path.abspath(path))))


def with_files_checked(spec: Spec) -> Spec:
    """``spec`` when every ``file()`` input is a readable file inside its folder; else :class:`SpecError`."""
    base = os.path.realpath(spec.base_dir or ".")
    errors = []
    for name in file_names(spec):
        found = os.path.realpath(os.path.join(base, name))
        if not (found == base or found.startswith(base.rstrip(os.sep) + os.sep)):
            errors.append(f"file({name}) resolves to {found}, outside the spec's folder {base}")
        elif not os.path.isfile(found):
            errors.append(f"file({name}): no such file in the spec's folder {base}")
    if errors:
        raise SpecError(errors)
    return spec
