"""Settings: ``initializationOptions`` and ``workspace/configuration`` (section ``kernelLsp``).

Resolution order (see :mod:`kernel_lsp.config`): defaults < user config file <
workspace settings < initializationOptions. Settings are re-read on
``workspace/didChangeConfiguration``; each problem (unknown key, bad value) is
shown to the user once.

initializationOptions are the editor's settings as they were at start-up; once
the editor reports a change, they are dropped, or the stale start-up value of
a setting would keep hiding the one the user just changed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lsprotocol import types

from kernel_lsp.config import resolve
from kernel_lsp.server.base import KernelLspServer, ServerState, guarded
from kernel_lsp.server.documents import uri_to_path
from kernel_lsp.services.user_config import user_config_layer

log = logging.getLogger(__name__)

SECTION = "kernelLsp"


def apply_settings(state: ServerState) -> None:
    """Re-resolve the settings from the stored layers, tell the user about problems, run ON_SETTINGS."""
    old = state.settings
    state.settings = resolve(
        user_config_layer(),
        ("workspace settings", state.workspace_settings),
        ("initializationOptions", state.init_options),
    )
    for problem in state.settings.problems:
        state.show(f"kernel-lsp: {problem}", types.MessageType.Warning, once_key=f"settings:{problem}")
    if state.settings != old:
        log.info("settings changed: %s", state.settings)
        state.run_hooks(state.on_settings)


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
        state.init_options = {}
        if isinstance(pushed, dict) and isinstance(pushed.get(SECTION), dict):
            state.workspace_settings = pushed[SECTION]
        else:
            await fetch_workspace_settings(state)
        apply_settings(state)
