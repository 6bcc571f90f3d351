from kernel_lsp.config import Settings, resolve


def test_defaults():
    s = Settings()
    assert s.arch == "sm_90"
    assert s.nvcc_path == "nvcc"


def test_later_layers_win_and_camel_case_keys_map():
    s = resolve(("user", {"arch": "sm_80", "nvccPath": "/a/nvcc"}), ("workspace", {"arch": "sm_86"}))
    assert s.arch == "sm_86"
    assert s.nvcc_path == "/a/nvcc"
    assert s.problems == ()


def test_bad_values_are_dropped_with_a_message():
    s = resolve(("initializationOptions", {"compileTimeoutS": "soon", "noSuchKey": 1, "extraFlags": ["-O3"]}))
    assert s.compile_timeout_s == Settings().compile_timeout_s
    assert s.extra_flags == ("-O3",)
    assert any("compileTimeoutS" in p for p in s.problems)
    assert any("noSuchKey" in p for p in s.problems)


def test_non_object_settings_are_reported():
    s = resolve(("workspace", ["not", "a", "dict"]))
    assert s == Settings()
    assert s.problems
