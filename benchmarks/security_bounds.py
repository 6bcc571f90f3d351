"""Issue 27, measured: what a hostile workspace runs, and how long and how much memory hostile files cost.

    .venv/bin/python benchmarks/security_bounds.py [--label after] [--repo DIR] [--rows NAME,...]

Every row of the issue, against the kernel-lsp at ``--repo`` (default: this checkout; a copy of an older
commit gives the "before" figures) with the real nvcc on PATH:

* **injection**: each form of :mod:`tests.security.hostile` through ``kernel-lsp check`` and through the
  server (``didOpen``, then the compile's diagnostics): did the marker file appear?
* **bounded**: the server on generated files (a 66 KB line of 4,400 ``__global__ int;``, whose 8,800 nvcc
  warnings each echo the whole line: 1.36 GB of nvcc output; 4.9 MB and 50 MB of small kernels; 20,000
  diagnostics from a stand-in nvcc; ``macros``: a macro of 2**40 tokens in a directive, in code and in a
  launch), with a probe request every 50 ms for the whole run (its slowest answer
  is the longest the event loop was held) and the server's peak RSS (``VmHWM``); ``check`` on the same files
  (wall time, peak RSS). A process past ``--rss-cap-gb`` is killed and the row says so.
* **smaller**: NUL bytes, ``compileTimeoutS: -1``, a spec's missing or outside ``file(...)``, a spec of 1,005
  parameters for a 5-parameter kernel in each command, a foreign SQLite ``kbPath``, ``kb import`` of
  ``attempts: 2**64``, duplicate ids and ``speedup: 1e308``, ``kb --db`` on a missing file.

Prints a table and merges the run, under ``--label``, into ``benchmarks/results/security_bounds.json`` with
the machine, the date, the command and every raw sample (probe latencies included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "security_bounds.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "security"))

import hostile  # noqa: E402
from lsp_latency import Client  # noqa: E402

PROBE_EVERY_S = 0.05


# --------------------------------------------------------------------------- generated files
line_66k, kernels_of, FAKE_NVCC_20K = hostile.line_66k, hostile.kernels_of, hostile.FAKE_NVCC_20K


# --------------------------------------------------------------------------- processes
class Peak:
    """Samples a process's ``VmHWM`` every 100 ms and kills it past a cap."""

    def __init__(self, pid: int, cap_bytes: int) -> None:
        self.pid = pid
        self.cap_bytes = cap_bytes
        self.peak_bytes = 0
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_bytes = max(self.peak_bytes, int(line.split()[1]) * 1024)
        except OSError:
            pass
        return self.peak_bytes

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            if self.read() > self.cap_bytes:
                self.killed = True
                try:
                    os.kill(self.pid, 9)
                except OSError:
                    pass
                return

    def stop(self) -> int:
        self.read()
        self._stop.set()
        self._thread.join()
        return self.peak_bytes


def run_cli(repo: Path, args: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float,
            cap_bytes: int) -> dict[str, Any]:
    """``kernel-lsp ARGS`` from ``repo``: exit code, wall time, peak RSS, the tail of its output."""
    argv = [sys.executable, "-m", "kernel_lsp", *args]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, "PYTHONPATH": str(repo), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    peak = Peak(proc.pid, cap_bytes)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    wall_s = time.perf_counter() - start
    return {"argv": args, "returncode": proc.returncode, "wall_s": round(wall_s, 3), "timed_out": timed_out,
            "peak_rss_mb": round(peak.stop() / 2**20, 1), "killed_over_cap": peak.killed,
            "stdout_lines": out.count("\n"), "stdout_tail": out[-600:], "stderr_tail": err[-1500:],
            "traceback": "Traceback" in err or "Traceback" in out}


class Server(Client):
    """The benchmark's LSP client: answers ``workspace/configuration`` with given settings, probes the loop."""

    def __init__(self, repo: Path, cwd: Path, env: dict[str, str], workspace_settings: dict | None,
                 cap_bytes: int) -> None:
        self.workspace_settings = workspace_settings
        self.diagnostics: dict[str, list[dict]] = {}
        self.messages: list[str] = []
        self.probes: list[tuple[float, float | None]] = []
        """(sent at, answered at) of every probe, perf_counter seconds."""
        super().__init__([sys.executable, "-m", "kernel_lsp", "serve"], str(cwd),
                         {"PYTHONPATH": str(repo), **env})
        self.peak = Peak(self.proc.pid, cap_bytes)
        self._probing = threading.Event()

    def _read_loop(self) -> None:
        # Configuration requests get the workspace settings; notifications are recorded as they arrive.
        original_put = self.notifications.put

        def put(message: dict) -> None:
            if message.get("method") == "textDocument/publishDiagnostics":
                self.diagnostics[message["params"]["uri"]] = message["params"]["diagnostics"]
            elif message.get("method") == "window/showMessage":
                self.messages.append(message["params"]["message"])
            original_put(message)

        self.notifications.put = put  # type: ignore[method-assign]
        super()._read_loop()

    def start_probe(self) -> None:
        def probe() -> None:
            while not self._probing.wait(PROBE_EVERY_S):
                rid, _ = self.send("kernelLsp/probe", {})
                # Timed from when the probe is in the pipe: one queued behind a 50 MB didOpen the client is
                # still writing waits for the write, which is the client's time, not the server's.
                self.probes.append((time.perf_counter(), None))
                self._probe_ids.append(rid)
        self._probe_ids: list[int] = []
        threading.Thread(target=probe, daemon=True).start()

    def stop_probe(self) -> list[float]:
        """Each probe's latency in ms (unanswered ones count until now)."""
        self._probing.set()
        now = time.perf_counter()
        latencies = []
        for (sent, _), rid in zip(self.probes, self._probe_ids):
            arrived = self.arrived.get(rid)
            latencies.append(((arrived[0] if arrived else now) - sent) * 1000.0)
        return latencies

    def open(self, path: Path, text: str | None = None) -> str:
        uri = path.as_uri()
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "cuda", "version": 1,
            "text": path.read_text(errors="replace") if text is None else text}})
        return uri

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate() or self.proc.poll() is not None:
                return predicate()
            time.sleep(0.02)
        return False

    def hover(self, uri: str, line: int, character: int, timeout_s: float = 300.0) -> float | None:
        start = time.perf_counter()
        try:
            self.request("textDocument/hover", {"textDocument": {"uri": uri},
                                                "position": {"line": line, "character": character}}, timeout_s)
        except Exception:
            return None
        return time.perf_counter() - start


def _answer_configuration(server: Server) -> None:
    """Patch the reader so ``workspace/configuration`` is answered with the server's workspace settings."""
    settings = server.workspace_settings
    base_send = Client._send

    def send(message: dict) -> None:
        if "result" in message and isinstance(message.get("result"), list) and settings is not None:
            message = {**message, "result": [settings for _ in message["result"]]}
        try:
            base_send(server, message)
        except (BrokenPipeError, ValueError, OSError):
            pass

    server._send = send  # type: ignore[method-assign]


def start_server(repo: Path, root: Path, env: dict[str, str], *, init_options: dict | None = None,
                 workspace_settings: dict | None = None, cap_bytes: int) -> Server:
    server = Server(repo, root, env, workspace_settings, cap_bytes)
    _answer_configuration(server)
    server.initialize(root, init_options or {})
    return server


def close(server: Server) -> int:
    peak = server.peak.stop()
    if server.proc.poll() is None:
        try:
            server.close()
        except Exception:
            server.proc.kill()
    return peak


# --------------------------------------------------------------------------- rows: injection
def injection_rows(repo: Path, tmp: Path, cap: int) -> list[dict[str, Any]]:
    rows = []
    for form in hostile.FORMS:
        for where in ("check", "server"):
            root = tmp / f"inject-{len(rows)}"
            case = hostile.make(form, root)
            env = case.env()
            row: dict[str, Any] = {"row": f"inject: {form}", "via": where}
            if where == "check":
                done = run_cli(repo, ["check", str(case.source)], cwd=case.workspace, env=env, timeout_s=300,
                               cap_bytes=cap)
                row.update(returncode=done["returncode"], wall_s=done["wall_s"],
                           warned="not passed to nvcc" in done["stdout_tail"] + done["stderr_tail"]
                           or "ignored" in done["stderr_tail"])
            else:
                server = start_server(repo, case.workspace, env, init_options=case.init_options,
                                      workspace_settings=case.workspace_settings, cap_bytes=cap)
                uri = server.open(case.source)
                start = time.perf_counter()
                row["diagnostics_arrived"] = server.wait_for(
                    lambda: any(d.get("source") != "kernel-lsp (tree-sitter)" for d in server.diagnostics.get(uri, [])),
                    180)
                row["wall_s"] = round(time.perf_counter() - start, 3)
                shown = [d["message"] for d in server.diagnostics.get(uri, [])] + server.messages
                row["warned"] = any("not passed" in m or "ignored" in m or "dropped" in m for m in shown)
                close(server)
            row["marker"] = case.marker.exists()
            rows.append(row)
            print(f"  {row['row']:<40} {where:<7} marker {'YES' if row['marker'] else 'no ':<4} "
                  f"warned {row['warned']}", flush=True)
    return rows


# --------------------------------------------------------------------------- rows: bounded work
def server_on(repo: Path, tmp: Path, name: str, text: str, cap: int, *, hover_at: tuple[int, int] | None,
              init_options: dict | None = None, wait_compile_s: float = 240.0, env: dict | None = None) -> dict:
    """The server on one generated file: probe latencies through open, compile and a hover; peak RSS."""
    root = tmp / name
    root.mkdir()
    path = root / f"{name}.cu"
    path.write_text(text)
    server = start_server(repo, root, {"HOME": str(root), "KERNEL_LSP_CONFIG": str(root / "none.json"), **(env or {})},
                          init_options=init_options, cap_bytes=cap)
    server.start_probe()
    start = time.perf_counter()
    uri = server.open(path, text)
    row: dict[str, Any] = {"row": name, "via": "server", "bytes": len(text)}
    if hover_at is not None:
        took = server.hover(uri, *hover_at)
        row["first_hover_s"] = round(time.perf_counter() - start, 3) if took is not None else None
    # The compile's end: its diagnostics, or the message that it timed out or was not run.
    ended = ("did not finish within", "not indexed, analysed or compiled")
    server.wait_for(lambda: any(d.get("source") != "kernel-lsp (tree-sitter)" for d in server.diagnostics.get(uri, []))
                    or any(e in m for m in server.messages for e in ended), wait_compile_s)
    row["diagnostics_arrived"] = any(d.get("source") != "kernel-lsp (tree-sitter)"
                                     for d in server.diagnostics.get(uri, []))
    row["diagnostics_s"] = round(time.perf_counter() - start, 3) if row["diagnostics_arrived"] else None
    row["diagnostics"] = len(server.diagnostics.get(uri, []))
    if hover_at is not None and server.proc.poll() is None:
        took = server.hover(uri, *hover_at, timeout_s=120)
        row["hover_after_s"] = round(took, 3) if took is not None else None
    latencies = server.stop_probe()
    row["messages"] = [m[:300] for m in server.messages]
    row["killed_over_cap"] = server.peak.killed
    row["exited"] = server.proc.poll() is not None
    row["peak_rss_mb"] = round(close(server) / 2**20, 1)
    row["probe_max_ms"] = round(max(latencies), 1) if latencies else None
    row["probe_ms"] = [round(v, 1) for v in latencies]
    print(f"  {name:<24} server: probe max {row['probe_max_ms']} ms, peak RSS {row['peak_rss_mb']} MB, "
          f"diagnostics {row['diagnostics']} after {row['diagnostics_s']} s, hover {row.get('first_hover_s')} s"
          f"{' KILLED over cap' if row['killed_over_cap'] else ''}", flush=True)
    return row


def check_on(repo: Path, tmp: Path, name: str, text: str, cap: int, timeout_s: float = 600) -> dict:
    root = tmp / f"check-{name}"
    root.mkdir()
    path = root / f"{name}.cu"
    path.write_text(text)
    done = run_cli(repo, ["check", str(path)], cwd=root,
                   env={"HOME": str(root), "KERNEL_LSP_CONFIG": str(root / "none.json")}, timeout_s=timeout_s,
                   cap_bytes=cap)
    done.update(row=name, via="check", bytes=len(text))
    print(f"  {name:<24} check: exit {done['returncode']}, {done['wall_s']} s, peak RSS {done['peak_rss_mb']} MB, "
          f"{done['stdout_lines']} lines{' KILLED over cap' if done['killed_over_cap'] else ''}"
          f"{' TIMED OUT' if done['timed_out'] else ''}", flush=True)
    return done


def bounded_rows(repo: Path, tmp: Path, cap: int, which: set[str]) -> list[dict[str, Any]]:
    rows = []
    if "66k" in which:
        text = line_66k()
        rows.append(check_on(repo, tmp, "line-66k", text, cap))
        rows.append(server_on(repo, tmp, "line-66k", text, cap, hover_at=(0, 3)))
    if "4.9mb" in which:
        text = kernels_of(int(4.9 * 2**20))
        rows.append(check_on(repo, tmp, "kernels-4.9mb", text, cap))
        rows.append(server_on(repo, tmp, "kernels-4.9mb", text, cap, hover_at=(1000, 17)))
    if "50mb" in which:
        text = kernels_of(50 * 2**20)
        rows.append(check_on(repo, tmp, "kernels-50mb", text, cap))
        rows.append(server_on(repo, tmp, "kernels-50mb", text, cap, hover_at=(1000, 17)))
    if "20k" in which:
        fake = tmp / "fake-nvcc"
        fake.write_text(FAKE_NVCC_20K.format(python=sys.executable))
        fake.chmod(0o755)
        text = "__global__ void k(float* a) {\n  a[0] = 1.0f;\n}\n"
        rows.append(server_on(repo, tmp, "diagnostics-20k", text, cap, hover_at=(0, 17),
                              init_options={"nvccPath": str(fake)}))
    if "macros" in which:
        # A40 expands to 2**40 tokens: the macro budget stops it in a directive, in code and in a launch.
        for use, text in sorted(hostile.MACRO_BOMBS.items()):
            rows.append(server_on(repo, tmp, f"macro-bomb-{use}", text, cap, hover_at=(41, 0),
                                  init_options={"nvccPath": "/nonexistent/nvcc"}))
    return rows


# --------------------------------------------------------------------------- rows: the smaller ones
KERNEL5 = "__global__ void k(int n, float a, const float* x, float* y, int m) { int i = threadIdx.x; if (i < n) y[i] = a * x[i]; }\n"


def spec5(params: list[dict] | None = None, init: str = "uniform(-1,1)") -> dict:
    return {"kernel": "k", "params": params or [
        {"name": "n", "scalar": "int32", "value": 256}, {"name": "a", "scalar": "float32", "value": 2.0},
        {"name": "x", "array": "float32", "size": "n", "init": init, "role": "in"},
        {"name": "y", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
        {"name": "m", "scalar": "int32", "value": 1}], "grid": [1, 1, 1], "block": [256, 1, 1]}


def smaller_rows(repo: Path, tmp: Path, cap: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base = {"HOME": str(tmp), "KERNEL_LSP_CONFIG": str(tmp / "none.json"), "KERNEL_LSP_KB": str(tmp / "kb.sqlite")}

    def cli(name: str, args: list[str], cwd: Path, **extra: Any) -> dict:
        done = run_cli(repo, args, cwd=cwd, env={**base, **extra.pop("env", {})}, timeout_s=300, cap_bytes=cap)
        done.update(row=name, via="cli", **extra)
        rows.append(done)
        print(f"  {name:<40} exit {done['returncode']}, traceback {done['traceback']}: "
              f"{(done['stderr_tail'].strip().splitlines() or [''])[-1][:140]}", flush=True)
        return done

    folder = tmp / "small"
    folder.mkdir()
    # NUL bytes: the index, in check and in the server.
    nul = folder / "nul.cu"
    nul.write_bytes(b"__global__ void k(float* a) { a[0] = 1.0f; }\n\x00\n__global__ void j(float* a) { a[1] = 2.0f; }\n")
    cli("NUL byte: check", ["check", str(nul), "--no-compile"], folder)
    server = start_server(repo, folder, base, init_options={"nvccPath": "/nonexistent/nvcc"}, cap_bytes=cap)
    uri = server.open(nul, nul.read_bytes().decode())
    symbols = server.request("textDocument/documentSymbol", {"textDocument": {"uri": uri}}).get("result") or []
    server.wait_for(lambda: any("NUL" in m for m in server.messages), 5)
    rows.append({"row": "NUL byte: server", "via": "server", "symbols": len(symbols),
                 "messages": [m for m in server.messages if "nvcc" not in m.lower()][:5]})
    close(server)
    print(f"  NUL byte: server                         {len(symbols)} symbols, messages {rows[-1]['messages']}")
    # compileTimeoutS: -1 from the workspace.
    k = folder / "t.cu"
    k.write_text("__global__ void k(float* a) { a[0] = 1.0f; }\n")
    server = start_server(repo, folder, base, workspace_settings={"compileTimeoutS": -1}, cap_bytes=cap)
    uri = server.open(k)
    server.wait_for(lambda: bool(server.messages), 60)
    server.wait_for(lambda: any("-1" in m or "compileTimeoutS" in m for m in server.messages), 30)
    rows.append({"row": "compileTimeoutS -1", "via": "server", "messages": server.messages[:5]})
    close(server)
    print(f"  compileTimeoutS -1                       messages {rows[-1]['messages']}")
    # Specs: a missing file(...), one outside the spec's folder, and 1,005 parameters for 5.
    spec_dir = tmp / "specs" / "project"
    spec_dir.mkdir(parents=True)
    (spec_dir / "k.cu").write_text(KERNEL5)
    (spec_dir / "cand.cu").write_text(KERNEL5)
    np_dir = tmp / "elsewhere"
    np_dir.mkdir()
    try:
        import numpy as np
        np.save(np_dir / "x.npy", np.zeros(256, dtype=np.float32))
    except ImportError:
        pass
    for name, data in (("spec file() missing", spec5(init="file(missing.npy)")),
                       ("spec file() outside its folder", spec5(init="file(../../elsewhere/x.npy)"))):
        spec_path = spec_dir / (name.split()[2] + ".json")
        spec_path.write_text(json.dumps(data))
        cli(f"{name}: verify", ["verify", "k.cu", "cand.cu", "--spec", str(spec_path)], spec_dir)
        cli(f"{name}: check --spec", ["check", "k.cu", "--spec", str(spec_path), "--no-compile"], spec_dir)
    many = spec5()
    many["params"] = many["params"] + [{"name": f"p{i}", "scalar": "int32", "value": 1} for i in range(1_000)]
    many_path = spec_dir / "many.json"
    many_path.write_text(json.dumps(many))
    for command in (["check", "k.cu", "--spec", str(many_path), "--no-compile"],
                    ["verify", "k.cu", "cand.cu", "--spec", str(many_path)],
                    ["profile", "k.cu", "--spec", str(many_path)],
                    ["optimize", "k.cu", "--spec", str(many_path), "--dry-run"],
                    ["optimize", "k.cu", "--spec", str(many_path)]):
        cli(f"1,005 params for 5: {' '.join(a for a in command if not a.endswith(('.json', '.cu')))}", command, spec_dir)
    sweep_dir = tmp / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "k.cu").write_text(KERNEL5)
    (sweep_dir / "k.cu.k.spec.json").write_text(json.dumps(many))
    cli("1,005 params for 5: sweep --dry-run", ["sweep", str(sweep_dir), "--dry-run", "--out", str(tmp / "sweep-out")],
        sweep_dir)
    # A foreign SQLite file as the knowledge base.
    foreign = tmp / "notes.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine')")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    done = cli("foreign SQLite kbPath", ["kb", "stats", "--db", str(foreign)], tmp)
    conn = sqlite3.connect(foreign)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    done.update(tables_after=tables, journal_mode_after=journal, unchanged=foreign.read_bytes() == before)
    # kb import: a huge integer, two attempts with one id, an absurd speedup.
    export = tmp / "export.jsonl"
    made = run_cli(repo, ["kb", "export", str(export)], cwd=tmp, env=base, timeout_s=120, cap_bytes=cap)
    header = export.read_text().splitlines()[0] if made["returncode"] == 0 else "{}"
    state = "uncoalesced-access"
    attempt = {"type": "attempt", "id": "same-id", "kernel_hash": "h", "file": "k.cu", "kernel": "k", "state": state,
               "technique": "vectorized-loads", "candidate_hash": "c1", "verdict": "accepted", "accepted": True,
               "speedup": 1.5, "reason": "", "metrics_before": {}, "metrics_after": {}, "features": {},
               "model": None, "generator": "rules", "original_source": None, "candidate_source": None,
               "created_at": "2025-01-01T00:00:00+00:00"}
    prior_state = {"type": "state", "name": "derived-x", "description": "d", "signature": {}, "parent": state,
                   "origin": "derived", "created_at": "2025-01-01T00:00:00+00:00",
                   "priors": [{"technique": "vectorized-loads", "predicted_speedup": 1.2, "confidence": 0.5,
                               "attempts": 2**64, "successes": 1}]}
    cases = {
        "kb import attempts 2**64": [prior_state],
        "kb import duplicate ids": [attempt, {**attempt, "candidate_hash": "c2", "speedup": 3.0}],
        "kb import speedup 1e308": [{**attempt, "id": "big", "speedup": 1e308}],
    }
    # An older kernel-lsp creates a missing --db file without being asked (it has no --create).
    create = ["--create"] if "--create" in run_cli(repo, ["kb", "import", "--help"], cwd=tmp, env=base, timeout_s=60,
                                                   cap_bytes=cap)["stdout_tail"] else []
    for name, records in cases.items():
        path = tmp / f"{name.split()[-1].replace('*', '')}.jsonl"
        path.write_text(header + "\n" + "".join(json.dumps(r) + "\n" for r in records))
        db = tmp / f"{path.stem}.sqlite"
        done = cli(name, ["kb", "import", str(path), "--db", str(db), *create], tmp)
        shown = run_cli(repo, ["kb", "show", "--db", str(db)], cwd=tmp, env=base, timeout_s=120, cap_bytes=cap)
        predicted = [line for line in shown["stdout_tail"].splitlines() if "vectorized-loads" in line]
        done["kb_show_coalesce"] = predicted[:3]
    missing = tmp / "no-such-folder" / "kb.sqlite"
    cli("kb --db on a missing file", ["kb", "stats", "--db", str(missing)], tmp)
    rows[-1]["created"] = missing.exists()
    return rows


# --------------------------------------------------------------------------- the table
def summary(row: dict[str, Any]) -> str:
    """One row's figures in a few words."""
    parts = []
    if "marker" in row:
        parts.append("RAN" if row["marker"] else "ran nothing")
    for key, unit in (("wall_s", "s"), ("first_hover_s", "s to first hover"), ("diagnostics_s", "s to diagnostics"),
                      ("probe_max_ms", "ms stall"), ("peak_rss_mb", "MB")):
        if row.get(key) is not None and "marker" not in row:
            parts.append(f"{row[key]:g} {unit}")
    if row.get("killed_over_cap"):
        parts.append("killed past the RSS cap")
    if "returncode" in row and "marker" not in row:
        parts.append(f"exit {row['returncode']}" + (", traceback" if row.get("traceback") else ""))
    if "tables_after" in row:
        parts.append(f"tables after: {len(row['tables_after'])}, journal {row['journal_mode_after']}")
    if "created" in row:
        parts.append("created" if row["created"] else "not created")
    if "symbols" in row:
        parts.append(f"{row['symbols']} symbols, {len(row['messages'])} messages")
    said = [line for line in row.get("stderr_tail", "").splitlines() if line.strip() and "WARNING" not in line]
    said += [m for m in row.get("messages", []) if "no GPU" not in m]
    if said and "bytes" not in row and "marker" not in row:
        parts.append(said[0].split(": ", 1)[-1][:80])
    return ", ".join(parts)


def print_table(merged: dict[str, Any]) -> None:
    runs = merged.get("runs", {})
    labels = [label for label in ("before", "after") if label in runs] or list(runs)
    keyed = {label: {(r["row"], r["via"]): r for r in runs[label]["rows"]} for label in labels}
    keys = list(dict.fromkeys(k for label in labels for k in keyed[label]))
    print(f"\n{'row':<46} {'via':<7} " + " | ".join(f"{label:<60}" for label in labels))
    for key in keys:
        cells = [summary(keyed[label][key]) if key in keyed[label] else "-" for label in labels]
        print(f"{key[0][:46]:<46} {key[1]:<7} " + " | ".join(f"{c[:60]:<60}" for c in cells))


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="after", help="the name of this run in the JSON (before, after, ...)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the kernel-lsp checkout to measure")
    parser.add_argument("--rows", default="injection,66k,4.9mb,50mb,20k,macros,smaller")
    parser.add_argument("--rss-cap-gb", type=float, default=8.0, help="kill a process past this peak RSS")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--replace", action="store_true", help="replace the label's earlier run instead of merging")
    args = parser.parse_args(argv)
    which = set(args.rows.split(","))
    cap = int(args.rss_cap_gb * 2**30)
    if shutil.which("nvcc") is None:
        print("nvcc is not on PATH: the rows need it", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "-C", str(args.repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="security-bounds-") as tmp_name:
        tmp = Path(tmp_name)
        if "injection" in which:
            print("injection (marker = the command ran):")
            rows += injection_rows(args.repo.resolve(), tmp / "inject", cap)
        print("bounded work:")
        rows += bounded_rows(args.repo.resolve(), tmp, cap, which)
        if "smaller" in which:
            print("smaller ones:")
            (tmp / "smaller").mkdir()
            rows += smaller_rows(args.repo.resolve(), tmp / "smaller", cap)
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    run = {
        "machine": {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "nvcc": nvcc[0] if nvcc else None},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "repo_commit": commit or None,
        "rows": rows,
    }
    merged: dict[str, Any] = json.loads(args.output.read_text()) if args.output.exists() else {}
    previous = merged.setdefault("runs", {}).get(args.label)
    if previous is not None and not args.replace:
        # A run of some rows replaces those rows of the label's earlier run, keeping the others.
        ran = {(r["row"], r["via"]) for r in rows}
        run["rows"] = [r for r in previous["rows"] if (r["row"], r["via"]) not in ran] + rows
        run["parts"] = previous.get("parts", []) + [{"date": run["date"], "command": run["command"]}]
    merged["runs"][args.label] = run
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(merged, indent=1) + "\n")
    print_table(merged)
    print(f"wrote {args.output} ({args.label})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
