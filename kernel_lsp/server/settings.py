"""Settings: ``initializationOptions`` and ``workspace/configuration`` (section ``kernelLsp``).

Resolution order (see :mod:`kernel_lsp.config`): defaults < user config file <
workspace settings < initializationOptions. Settings are re-read on
``workspace/didChangeConfiguration``; each problem (unknown key, bad value) is
shown to the user once.

initializationOptions are the editor's settings as they were at start-up; once
the editor reports a change, they are dropped, or the stale start-up value of
a setting would keep hiding the one the user just changed. The user-level ones
(``config.USER_LEVEL``: programs, model, knowledge base) stay: they come only
from the user's own sources, and a workspace layer cannot replace them, so a
change to one of them takes effect on the next start.

The workspace layer is untrusted: its user-level keys are dropped with a
message. ``extraFlags`` and ``includePaths`` of every layer pass the compile
database's flag policy when nvcc's command line is built
(:func:`kernel_lsp.services.toolchain.settings_flags`): the VS Code extension fills
initializationOptions with settings a cloned ``.vscode/settings.json`` can set, so
no layer can be told apart as the user's own there; each flag dropped is shown here
once, and with the compile's diagnostics.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lsprotocol import types

from kernel_lsp.config import USER_LEVEL, WIRE_KEYS, resolve
from kernel_lsp.server.base import KernelLspServer, ServerState, guarded
from kernel_lsp.server.documents import uri_to_path
from kernel_lsp.services.toolchain import settings_flags
from kernel_lsp.services.user_config import user_config_layer

log = logging.getLogger(__name__)

SECTION = "kernelLsp"


def apply_settings(state: ServerState) -> None:
    """Re-resolve the settings from the stored layers, tell the user about problems, run ON_SETTINGS."""
    old = state.settings
    state.settings = resolve(
        user_config_layer(),
        ("workspace settings", _without_repeats(state.workspace_settings, state.init_options), False),
        ("initializationOptions", state.init_options),
    )
    flag_problems = [f"{key}: '{d.flag}' ignored: {d.reason}"
                     for key, d in settings_flags(state.settings, state.workspace_root)[1]]
    for problem in (*flag_problems, *state.settings.problems):
        state.show(f"kernel-lsp: {problem}", types.MessageType.Warning, once_key=f"settings:{problem}")
    if state.settings != old:
        log.info("settings changed: %s", state.settings)
        state.run_hooks(state.on_settings)


def _without_repeats(settings: Any, user_options: dict[str, Any]) -> Any:
    """The workspace layer without user-level keys that only repeat the user's start-up value.

    VS Code answers ``workspace/configuration`` with every setting the user set, its user-level
    ones included; those are the user's own, not a workspace's attempt, and need no message.
    """
    if not isinstance(settings, dict):
        return settings
    return {k: v for k, v in settings.items()
            if not (WIRE_KEYS.get(k, k) in USER_LEVEL and k in user_options and user_options[k] == v)}


def _user_level_only(options: dict[str, Any]) -> dict[str, Any]:
    """The user-level keys of ``initializationOptions``, kept when the editor reports a change."""
    return {k: v for k, v in options.items() if WIRE_KEYS.get(k, k) in USER_LEVEL}


def _capabilities(state: ServerState, params: types.InitializeParams) -> None:
    caps = params.capabilities
    window = caps.window
    workspace = caps.workspace
    state.supports_progress = bool(window and window.work_done_progress)
    state.supports_configuration = bool(workspace and workspace.configuration)
    state.supports_code_lens_refresh = bool(workspace and workspace.code_lens and workspace.code_lens.refresh_support)
    state.supports_inlay_hint_refresh = bool(workspace and workspace.inlay_hint and workspace.inlay_hint.refresh_support)
    state.supports_show_document = bool(window and window.show_document and window.show_document.support)
    watched = workspace.did_change_watched_files if workspace else None
    state.supports_watched_files_registration = bool(watched and watched.dynamic_registration)


def _workspace_root(params: types.InitializeParams) -> str | None:
    if params.workspace_folders:
        return uri_to_path(params.workspace_folders[0].uri)
    if params.root_uri:
        return uri_to_path(params.root_uri)
    return params.root_path


async def fetch_workspace_settings(state: ServerState) -> None:
    if not state.supports_configuration:
        return
    try:
        result = await state.server.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
        )
    except Exception as exc:  # a client that fails the request: keep the other layers
        log.warning("workspace/configuration failed: %s", exc)
        return
    state.workspace_settings = _as_settings(result[0] if result else None)


def _as_settings(value: Any) -> Any:
    # Some clients answer the section's *parent*; accept {"kernelLsp": {...}} too.
    if isinstance(value, dict) and SECTION in value and isinstance(value[SECTION], dict):
        return value[SECTION]
    return value


def register(server: KernelLspServer) -> None:
    state = server.state

    @server.feature(types.INITIALIZE)
    @guarded(state, what="initialize")
    def initialize(params: types.InitializeParams) -> None:
        state.loop = asyncio.get_running_loop()
        _capabilities(state, params)
        state.workspace_root = _workspace_root(params)
        options = params.initialization_options
        state.init_options = _as_settings(options) if options is not None else {}
        apply_settings(state)

    @server.feature(types.INITIALIZED)
    @guarded(state, what="initialized")
    async def initialized(params: types.InitializedParams) -> None:
        try:
            await fetch_workspace_settings(state)
            apply_settings(state)
        finally:
            state.settings_loaded.set()
        state.run_hooks(state.on_initialized)

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    @guarded(state, what="didChangeConfiguration")
    async def did_change_configuration(params: types.DidChangeConfigurationParams) -> None:
        pushed = params.settings
        state.init_options = _user_level_only(state.init_options)
        if isinstance(pushed, dict) and isinstance(pushed.get(SECTION), dict):
            state.workspace_settings = pushed[SECTION]
        else:
            await fetch_workspace_settings(state)
        apply_settings(state)
