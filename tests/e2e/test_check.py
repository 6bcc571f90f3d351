"""``kernel-lsp check`` and ``kernel-lsp serve --tcp`` as a user runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from lsp_helpers import SAXPY, needs_nvcc


def _check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", "check", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "KERNEL_LSP_CONFIG": str(cwd / "none.json")})


@needs_nvcc
def test_check_json_reports_resources_and_occupancy(tmp_path: Path) -> None:
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    done = _check("saxpy.cu", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    kernels = {k["name"]: k for k in report["kernels"]}
    assert set(kernels) == {"saxpy", "scale"}
    saxpy = kernels["saxpy"]
    assert saxpy["resources"]["registers_per_thread"] > 0 and saxpy["resources"]["shared_bytes_static"] == 1024
    [launch] = saxpy["launches"]
    assert launch["block_threads"] == 256 and 0 < launch["occupancy_pct"] <= 100 and launch["limiter"]
    assert report["compile"]["ran"] and not [m for m in report["compile"]["messages"] if m["severity"] == "error"]


@needs_nvcc
def test_check_exits_1_on_compile_errors_with_file_line_col(tmp_path: Path) -> None:
    (tmp_path / "bad.cu").write_text("__global__ void k(int* p) {\n    p[0] = nope;\n}\n")
    done = _check("bad.cu", cwd=tmp_path)
    assert done.returncode == 1
    assert f"{tmp_path / 'bad.cu'}:2:12: error" in done.stdout
    assert "__global__ void k(int" in done.stdout and "resources unknown (the compile failed)" in done.stdout


def test_check_without_nvcc_still_analyses(tmp_path: Path) -> None:
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    done = _check("saxpy.cu", "--nvcc", "/no/such/nvcc", cwd=tmp_path)
    assert done.returncode == 0
    assert "nvcc was not found" in done.stderr
    assert "resources unknown" in done.stdout and "block size" not in done.stdout


def test_check_bad_usage(tmp_path: Path) -> None:
    assert _check("missing.cu", cwd=tmp_path).returncode == 2
    latin = tmp_path / "latin.cu"
    latin.write_bytes(b"// caf\xe9\n__global__ void k() {}\n")
    done = _check("latin.cu", "--no-compile", cwd=tmp_path)
    assert done.returncode == 0 and "not valid UTF-8" in done.stderr and "1 kernels" in done.stdout


def test_serve_over_tcp_answers_initialize(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "serve", "--tcp", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                assert server.poll() is None, server.stderr.read() if server.stderr else "server exited"
                assert time.monotonic() < deadline, "server never listened"
                # Before it listens the server cannot notify anyone: polling the port is the only signal.
                time.sleep(0.05)
        with conn:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                               "params": {"processId": None, "rootUri": None, "capabilities": {}}}).encode()
            conn.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            data = b""
            while b"kernel-lsp" not in data:
                chunk = conn.recv(65536)
                assert chunk, "connection closed"
                data += chunk
        assert b'"textDocumentSync"' in data
    finally:
        server.kill()
        server.wait()


def test_serve_rejects_a_bad_address() -> None:
    done = subprocess.run([sys.executable, "-m", "kernel_lsp", "serve", "--tcp", "nonsense"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "HOST:PORT" in done.stderr
