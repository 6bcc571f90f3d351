"""The user config file layer of the settings (``<user config dir>/kernel-lsp/settings.json``).

Read by the server and by ``kernel-lsp check`` as the second layer of
:func:`kernel_lsp.config.resolve`. A missing file is an empty layer; an
unreadable or malformed one is reported through the returned mapping's problems
(a non-object value makes ``config.merge`` record a message), never raised.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import platformdirs

log = logging.getLogger(__name__)

#: Overrides the file's location (tests point it at a temporary file).
ENV_VAR = "KERNEL_LSP_CONFIG"


def user_config_path() -> Path:
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override)
    return Path(platformdirs.user_config_dir("kernel-lsp")) / "settings.json"


def user_config_layer() -> tuple[str, Any]:
    """``(source name, mapping)`` for :func:`kernel_lsp.config.resolve`."""
    path = user_config_path()
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return source, None
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return source, f"cannot read the file ({exc.strerror})"
    try:
        return source, json.loads(text)
    except ValueError as exc:
        log.warning("%s is not valid JSON: %s", path, exc)
        return source, f"not valid JSON ({exc})"
