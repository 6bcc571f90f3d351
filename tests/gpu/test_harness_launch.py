"""The launch mode (what ncu and compute-sanitizer wrap) on a real GPU; skipped without one."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from kernel_lsp.services.harness.compile import compile_cubin, find_entry
from kernel_lsp.services.harness.verify import cuda_tool
from kernel_lsp.services.proc import run
from kernel_lsp.services.toolchain import BuildFlags

from test_harness_examples import ROOT  # tests/gpu is on sys.path (pytest's prepend import mode)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def streaming(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("launch"))
    with open(os.path.join(ROOT, "streaming", "original.cu"), encoding="utf-8") as f:
        built = compile_cubin(f.read(), workdir, "original", BuildFlags(nvcc=cuda_tool("nvcc")).for_arch("sm_90"))
    assert built.ok, built.log
    entry, problem = find_entry(built.entries, "scale_add")
    assert entry, problem
    return built.cubin_path, entry


def _launch(cubin, entry, *extra, wrap=()):
    argv = [*wrap, sys.executable, "-m", "kernel_lsp.services.harness.launch", "--cubin", cubin, "--kernel", entry,
            "--spec", os.path.join(ROOT, "streaming", "spec.json"), *extra]
    return run(argv, timeout_s=300)


def test_launch_once_and_repeated(streaming):
    cubin, entry = streaming
    assert _launch(cubin, entry).returncode == 0
    assert _launch(cubin, entry, "--variant", "2", "--repeat", "3", "--candidate-launch").returncode == 0


def test_timed_launches_write_their_event_durations(streaming, tmp_path):
    cubin, entry = streaming
    timings = tmp_path / "timings.json"
    assert _launch(cubin, entry, "--variant", "2", "--timed", "5", "--timings-file", str(timings)).returncode == 0
    values = json.loads(timings.read_text())
    assert len(values) == 5 and all(0 < v < 1e6 for v in values)


def test_launch_reports_a_bad_kernel_name(streaming):
    cubin, _ = streaming
    result = _launch(cubin, "no_such_kernel")
    assert result.returncode == 4 and "'no_such_kernel'" in result.stderr


def test_launch_bad_variant_is_usage_error(streaming):
    cubin, entry = streaming
    result = _launch(cubin, entry, "--variant", "99")
    assert result.returncode == 2 and "--variant 99" in result.stderr


@pytest.mark.skipif(shutil.which(cuda_tool("compute-sanitizer")) is None, reason="compute-sanitizer not installed")
def test_initcheck_is_clean_for_a_kernel_that_writes_before_reading(streaming):
    cubin, entry = streaming
    result = _launch(cubin, entry, "--variant", "2", "--no-init-out", wrap=(cuda_tool("compute-sanitizer"), "--tool", "initcheck", "--error-exitcode", "86"))
    assert result.returncode == 0, result.stdout + result.stderr
