"""User-level settings: a workspace layer cannot choose what kernel-lsp runs or loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_lsp import config
from kernel_lsp.config import USER_LEVEL, resolve
from kernel_lsp.server.settings import _user_level_only
from kernel_lsp.services.toolchain import settings_flags

EXTENSION = Path(__file__).resolve().parents[2] / "editors" / "vscode" / "package.json"


@pytest.mark.parametrize("key", ["nvccPath", "ncuPath", "profileProgram", "profileArgs", "model", "modelLora",
                                 "modelEndpoint", "kbPath", "kbUrl", "allowedCompilers"])
def test_workspace_layer_cannot_set_user_level_settings(key):
    value = ["/evil"] if key in ("profileArgs", "allowedCompilers") else "/evil"
    settings = resolve(("user file", {}), ("workspace settings", {key: value, "arch": "sm_80"}, False))
    assert settings == resolve(("user file", {"arch": "sm_80"}))  # only arch got through
    assert any(f"'{key}' ignored" in p and "not a workspace" in p for p in settings.problems)


def test_user_sources_still_set_them():
    settings = resolve(("user file", {"nvccPath": "/opt/cuda/bin/nvcc"}),
                       ("workspace settings", {"nvccPath": "/evil"}, False),
                       ("initializationOptions", {"ncuPath": "/opt/ncu"}))
    assert (settings.nvcc_path, settings.ncu_path) == ("/opt/cuda/bin/nvcc", "/opt/ncu")


def test_user_level_fields_say_so_in_their_docs():
    docs = config.Settings.__dataclass_fields__
    assert USER_LEVEL <= set(docs)
    source = Path(config.__file__).read_text()
    for name in USER_LEVEL:
        doc = source.split(f"    {name}:", 1)[1].split('"""', 2)[1]
        assert doc.startswith("User-level only"), name


def test_vscode_manifest_scopes_user_level_settings_to_the_machine():
    properties = json.loads(EXTENSION.read_text())["contributes"]["configuration"]["properties"]
    for name in config.FIELDS:
        prop = properties["kernelLsp." + config._camel(name)]
        assert (prop.get("scope") == "machine") == (name in USER_LEVEL), name


@pytest.mark.parametrize("layer", ["workspace settings", "initializationOptions", "user file"])
def test_extra_flags_of_every_layer_pass_the_flag_policy(tmp_path, layer):
    # initializationOptions too: the VS Code extension fills them from settings a workspace can set.
    settings = resolve((layer, {"extraFlags": ["-DOK", "-ccbin", "/evil", "-include", "/etc/passwd"], "arch": "sm_80"},
                        layer != "workspace settings"))
    kept, dropped = settings_flags(settings, str(tmp_path))
    assert kept == ("-DOK",)
    assert [key for key, _ in dropped] == ["extraFlags", "extraFlags"]
    assert settings_flags(resolve((layer, {"extraFlags": "-DA -ccbin /x"})), str(tmp_path))[0] == ("-DA",)
    assert settings_flags(resolve(), None) == ((), ())


def test_user_level_init_options_survive_a_configuration_change():
    assert _user_level_only({"nvccPath": "/opt/nvcc", "arch": "sm_80", "kb_path": "/k"}) == {"nvccPath": "/opt/nvcc",
                                                                                          "kb_path": "/k"}


def test_the_users_own_value_repeated_by_the_editor_is_not_reported():
    from kernel_lsp.server.settings import _without_repeats

    init = {"nvccPath": "/opt/cuda/bin/nvcc", "arch": "sm_80"}
    answered = {"nvccPath": "/opt/cuda/bin/nvcc", "ncuPath": "/evil", "arch": "sm_90"}
    assert _without_repeats(answered, init) == {"ncuPath": "/evil", "arch": "sm_90"}
    settings = resolve(("workspace settings", _without_repeats(answered, init), False), ("initializationOptions", init))
    assert [p for p in settings.problems if "ignored" in p] == [p for p in settings.problems if "'ncuPath'" in p]
