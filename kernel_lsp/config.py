"""Typed settings, shared by the server and the CLI.

Resolution order, later wins: defaults < user config file
(``<user config dir>/kernel-lsp/settings.json``) < workspace settings
(``workspace/configuration`` section ``kernelLsp``) < ``initializationOptions``.
A bad value is dropped with a message (kept in :attr:`Settings.problems` for the
server to show); it never stops the server.

Keys on the wire are camelCase (``nvccPath``); fields here are snake_case.

A number outside its field's range (:data:`RANGES`) is a bad value too, so a
workspace's ``compileTimeoutS: -1`` cannot switch diagnostics off unseen; an
``arch`` must look like ``sm_90``, and an ``allowedCompilers`` pattern must be an
absolute path without ``.``/``..`` segments
(:func:`kernel_lsp.core.argv_policy.pattern_problem`).

Settings that choose a program to run, or a file to load or write outside the
workspace, are *user-level* (:data:`USER_LEVEL`): a layer that a workspace can
write (``workspace/configuration``, a pushed ``didChangeConfiguration``) cannot
set them; its value is dropped with a message. The user config file and the
editor's start-up ``initializationOptions`` (the user's own client configuration;
in VS Code these settings are ``machine``-scoped, so a workspace's
``.vscode/settings.json`` cannot reach them) are user-level sources.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from kernel_lsp.core.argv_policy import pattern_problem


@dataclass(frozen=True)
class Settings:
    nvcc_path: str = "nvcc"
    """User-level only. nvcc executable (name on PATH or absolute path)."""
    arch: str = "sm_90"
    """Target architecture for compilation and the occupancy estimate (``sm_70`` … ``sm_90``)."""
    extra_flags: tuple[str, ...] = ()
    """Extra nvcc flags, appended after kernel-lsp's own. Whatever sets them, they pass the same flag policy as
    ``compile_commands.json``: no flag that chooses a program (``-ccbin`` only as ``allowedCompilers`` allows) or
    reads a file outside the workspace, no value with a backtick, ``$``, a double quote, a backslash or a newline
    (nvcc hands them to a shell)."""
    allowed_compilers: tuple[str, ...] = ()
    """User-level only. Glob patterns of host compilers that ``-ccbin``/``--compiler-bindir`` in
    ``compile_commands.json`` or ``extraFlags`` may choose (e.g. ``/usr/bin/g++-*``): absolute, ``*`` within one
    path segment, matched against the compiler's real path (or its name in its folder's real path); empty: such
    flags are dropped."""
    include_paths: tuple[str, ...] = ()
    """Extra ``-I`` folders (the file's own folder is always included); one whose path holds text a shell would
    act on (a backtick, ``$``, a double quote, a backslash) is dropped with a warning."""
    compile_timeout_s: float = 60.0
    """Longest an nvcc run may take before it is killed."""
    compile_debounce_ms: int = 400
    """Quiet time after an edit before the buffer is compiled again."""
    compile_on_change: bool = False
    """Compile on every (debounced) edit, not only on open and save."""
    ncu_path: str = "ncu"
    """User-level only. Nsight Compute CLI used by background profiling."""
    profile_on_save: bool = True
    """Profile kernels that have a launch spec when their file is saved (needs a GPU)."""
    profile_program: str | None = None
    """User-level only. Optional: the project's own binary to profile instead of launch specs."""
    profile_args: tuple[str, ...] = ()
    """User-level only. Arguments for ``profile_program``."""
    profile_timeout_s: float = 120.0
    """Longest one profiling run may take."""
    profile_tree: str | None = None
    """Path of a profiling-tree JSON file replacing the shipped default."""
    profile_line_counters: bool = False
    """Add per-source-line counters (ncu's SourceCounters) to every profile: line hovers and hot-line hints
    everywhere, at about 1 s more per profile on an H200 (the profiling tree leaves them out)."""
    profile_store: str | None = None
    """Folder of stored profiles (cache and last good profile per kernel); None: the user cache dir."""
    watch_files: bool = True
    """Re-profile when a watched .cu/.cuh file changes outside the editor."""
    kb_path: str | None = None
    """User-level only. Knowledge-base SQLite file (default: the user data directory)."""
    kb_url: str | None = None
    """User-level only. A team's knowledge base on PostgreSQL (``postgresql://user@host/db``); when set it is used
    instead of ``kbPath``."""
    model: str | None = None
    """User-level only. Model name from models/manifest.toml or a path to a GGUF file; None: rewrite rules only."""
    model_n_gpu_layers: int = 0
    """Layers offloaded to the GPU by llama.cpp (0: CPU only)."""
    model_n_ctx: int = 8192
    """Model context size in tokens."""
    model_threads: int | None = None
    """CPU threads for the model (None: llama.cpp's default)."""
    model_lora: str | None = None
    """User-level only. A LoRA adapter in GGUF loaded over the model (None: the model as it is)."""
    model_endpoint: str | None = None
    """User-level only. An OpenAI-compatible local server (llama-server, Ollama, vLLM: http://127.0.0.1:8080/v1) to
    use instead of loading a GGUF; ``model`` is then the name the server knows the model by."""
    model_mode: str = "jobs"
    """How the model helps: ``jobs`` (planner, editor and repairer, each with constrained output) or ``agent`` (one
    free tool-calling loop that writes whole kernels)."""
    min_speedup: float = 1.05
    """A candidate is applied only when the lower bound of its speedup interval is at least this."""
    verify_seeds: int = 3
    """Random input seeds per correctness check."""
    verify_timeout_s: float = 120.0
    """Longest one verification may take before its child process is killed."""
    optimize_budget_candidates: int = 8
    """Candidates tried per "Optimize" request."""
    optimize_budget_s: float = 600.0
    """Wall-time budget of one "Optimize" request."""
    problems: tuple[str, ...] = field(default=(), compare=False)
    """Messages about settings that were ignored (not a setting)."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


_HINTS = get_type_hints(Settings)
FIELDS = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "problems")
WIRE_KEYS = {_camel(name): name for name in FIELDS}

#: Fields a workspace cannot set: they choose a program (or its arguments), a model file to load, or where
#: kernel-lsp writes its knowledge base. Their docstrings start with "User-level only".
USER_LEVEL = frozenset(("nvcc_path", "ncu_path", "profile_program", "profile_args", "model", "model_lora",
                        "model_endpoint", "kb_path", "kb_url", "allowed_compilers"))


#: (lowest, highest) value a numeric setting takes, both included; anything else is refused with a message.
#: The bounds are what the setting can mean: a timeout of zero or less runs nothing, one over a day (a week
#: for a whole search) is a stuck job; llama.cpp reads -1 GPU layers as "all of them".
RANGES: dict[str, tuple[float, float]] = {
    "compile_timeout_s": (1.0, 3600.0),
    "compile_debounce_ms": (0, 60_000),
    "profile_timeout_s": (1.0, 86_400.0),
    "verify_timeout_s": (1.0, 86_400.0),
    "optimize_budget_s": (1.0, 604_800.0),
    "optimize_budget_candidates": (1, 10_000),
    "verify_seeds": (1, 1_000),
    "min_speedup": (1.0, 1_000.0),
    "model_n_gpu_layers": (-1, 100_000),
    "model_n_ctx": (256, 1 << 20),
    "model_threads": (1, 1_024),
}
_ARCH = re.compile(r"sm_\d{2,3}[a-z]?")


def _check_range(name: str, value: Any) -> Any:
    bounds = RANGES.get(name)
    if bounds is None or value is None:
        return value
    low, high = bounds
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"expected a number from {low:g} to {high:g}")
    return value


def _coerce(name: str, value: Any) -> Any:
    value = _coerce_type(name, value)
    if name == "arch" and _ARCH.fullmatch(value) is None:
        raise ValueError("expected an architecture such as sm_90")
    if name == "allowed_compilers":
        for pattern in value:
            why = pattern_problem(pattern)
            if why is not None:
                raise ValueError(f"pattern {pattern!r} {why}")
    return _check_range(name, value)


def _coerce_type(name: str, value: Any) -> Any:
    hint = _HINTS[name]
    text = str(hint)
    if text.startswith("tuple"):
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError("expected a list of strings")
        return tuple(value)
    if value is None and "None" in text:
        return None
    if hint is bool or text == "bool":
        if not isinstance(value, bool):
            raise ValueError("expected true or false")
        return value
    if "int" in text and "float" not in text:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("expected an integer")
        return value
    if "float" in text:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def merge(base: Settings, overrides: Mapping[str, Any] | None, source: str, *, user_level: bool = True) -> Settings:
    """Apply camelCase (or snake_case) ``overrides`` from ``source`` on top of ``base``.

    ``user_level=False`` marks a layer a workspace can write: its :data:`USER_LEVEL` keys are dropped with a message.
    """
    if not overrides:
        return base
    if not isinstance(overrides, Mapping):
        return dataclasses.replace(base, problems=base.problems + (f"{source}: settings must be an object",))
    changes: dict[str, Any] = {}
    problems = list(base.problems)
    for key, value in overrides.items():
        name = WIRE_KEYS.get(key) or (_snake(key) if _snake(key) in FIELDS else None)
        if name is None:
            problems.append(f"{source}: unknown setting '{key}' ignored")
            continue
        if not user_level and name in USER_LEVEL:
            problems.append(f"{source}: setting '{key}' ignored: it chooses what kernel-lsp runs or loads, so only "
                            "the user's own settings may set it (user settings or the settings file), not a workspace; "
                            "a change to the user setting takes effect when the server restarts")
            continue
        try:
            changes[name] = _coerce(name, value)
        except ValueError as exc:
            problems.append(f"{source}: setting '{key}' ignored: {exc} (got {value!r})")
    return dataclasses.replace(base, **changes, problems=tuple(problems))


def resolve(*layers: tuple[str, Mapping[str, Any] | None] | tuple[str, Mapping[str, Any] | None, bool]) -> Settings:
    """Fold ``(source name, mapping[, user_level])`` layers over the defaults, later layers winning."""
    settings = Settings()
    for source, mapping, *rest in layers:
        settings = merge(settings, mapping, source, user_level=rest[0] if rest else True)
    return settings
