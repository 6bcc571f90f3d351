"""Issue 27's smaller ones: each is a clear message, nothing is changed, nothing raises.

Before (``benchmarks/results/security_bounds.json``, "before"): a NUL byte left the index empty without a
word; ``compileTimeoutS: -1`` turned diagnostics off ("did not finish within -1 s"); a missing
``file(...)`` input was a traceback under ``verify`` and one outside the spec's folder was read; ``check``,
``optimize --dry-run`` and ``sweep`` took a spec of 1,005 parameters for a 5-parameter kernel; another
application's SQLite file as the knowledge base got 8 tables and WAL; ``kb import`` of ``attempts: 2**64``
raised OverflowError, two attempts with one id were merged and ``speedup: 1e308`` made it predict 1e307x;
``kb --db`` on a missing file created one.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from lsp_helpers import lsp_session, open_doc, wait_message

from kernel_lsp import cli
from kernel_lsp.services.kb import APPLICATION_ID, KbError, KnowledgeBase

KERNEL5 = ("__global__ void k(int n, float a, const float* x, float* y, int m) {\n"
           "    int i = threadIdx.x; if (i < n) y[i] = a * x[i];\n}\n")


def spec5(init: str = "uniform(-1,1)", extra: int = 0) -> dict:
    params = [{"name": "n", "scalar": "int32", "value": 256}, {"name": "a", "scalar": "float32", "value": 2.0},
              {"name": "x", "array": "float32", "size": "n", "init": init, "role": "in"},
              {"name": "y", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
              {"name": "m", "scalar": "int32", "value": 1}]
    params += [{"name": f"p{i}", "scalar": "int32", "value": 1} for i in range(extra)]
    return {"kernel": "k", "params": params, "grid": [1, 1, 1], "block": [256, 1, 1]}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the 5-parameter kernel and a candidate, user settings and knowledge base of its own."""
    monkeypatch.setenv("KERNEL_LSP_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("KERNEL_LSP_KB", str(tmp_path / "kb.sqlite3"))
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "k.cu").write_text(KERNEL5)
    (folder / "cand.cu").write_text(KERNEL5)
    monkeypatch.chdir(folder)
    return folder


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# ---------------------------------------------------------------- NUL bytes and settings

NUL_SOURCE = "__global__ void k(float* a) { a[0] = 1.0f; }\n\x00\n__global__ void j(float* a) { a[1] = 2.0f; }\n"


def test_check_names_the_nul_byte(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "nul.cu").write_text(NUL_SOURCE)
    code, said = run(["check", "nul.cu", "--no-compile"], capsys)
    assert code == 0 and "holds a NUL byte (line 2, byte 1)" in said and "read as binary data" in said


async def test_server_names_the_nul_byte(tmp_path: Path) -> None:
    path = tmp_path / "nul.cu"
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        open_doc(client, path, NUL_SOURCE)
        message = await wait_message(client, "holds a NUL byte")
    assert "line 2" in message.message and "remove the NUL bytes" in message.message


async def test_negative_timeout_from_the_workspace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void k(float* a) { a[0] = 1.0f; }\n")
    async with lsp_session(tmp_path, workspace_settings={"compileTimeoutS": -1, "verifySeeds": 10**9},
                           init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        open_doc(client, tmp_path / "k.cu")
        timeout = await wait_message(client, "'compileTimeoutS' ignored")
        seeds = await wait_message(client, "'verifySeeds' ignored")
    assert "from 1 to 3600" in timeout.message and "from 1 to 1000" in seeds.message
    assert not any("-1 s" in m.message for m in client.messages)


# ---------------------------------------------------------------- specs

@pytest.mark.parametrize("init, why", [
    ("file(missing.npy)", "no such file in the spec's folder"),
    ("file(../../elsewhere/x.npy)", "must name a file in the spec's own folder"),
    ("file(/etc/x.npy)", "must name a file in the spec's own folder"),
    ("file(link/x.npy)", "outside the spec's folder"),
])
@pytest.mark.parametrize("command", ["verify", "check", "optimize"])
def test_spec_files_outside_or_missing_are_usage_errors(project: Path, capsys: pytest.CaptureFixture[str],
                                                        init: str, why: str, command: str) -> None:
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    np.save(elsewhere / "x.npy", np.zeros(256, dtype=np.float32))
    (project / "link").symlink_to(elsewhere, target_is_directory=True)
    (project / "spec.json").write_text(json.dumps(spec5(init=init)))
    argv = {"verify": ["verify", "k.cu", "cand.cu", "--spec", "spec.json"],
            "check": ["check", "k.cu", "--spec", "spec.json", "--no-compile"],
            "optimize": ["optimize", "k.cu", "--spec", "spec.json", "--dry-run"]}[command]
    code, said = run(argv, capsys)
    assert code == 2 and why in said and "Traceback" not in said, said


@pytest.mark.parametrize("argv", [
    ["check", "k.cu", "--spec", "many.json", "--no-compile"],
    ["verify", "k.cu", "cand.cu", "--spec", "many.json"],
    ["profile", "k.cu", "--spec", "many.json"],
    ["optimize", "k.cu", "--spec", "many.json", "--dry-run"],
    ["optimize", "k.cu", "--spec", "many.json"],
], ids=lambda argv: " ".join(a for a in argv if not a.endswith((".cu", ".json"))))
def test_spec_of_1005_parameters_for_5_is_refused_by_every_command(project: Path, capsys, argv) -> None:
    (project / "many.json").write_text(json.dumps(spec5(extra=1_000)))
    code, said = run(argv, capsys)
    assert code == 2 and "the spec lists 1005 parameters, 'k' takes 5" in said, said


def test_sweep_names_a_spec_that_does_not_fit(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "k.cu.k.spec.json").write_text(json.dumps(spec5(extra=1_000)))
    code, said = run(["sweep", str(project), "--dry-run", "--out", str(project.parent / "out")], capsys)
    assert code == 2 and "k.cu: the launch spec does not fit 'k'" in said, said


def test_scalar_for_an_array_is_refused(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = spec5()
    data["params"][2] = {"name": "x", "scalar": "int32", "value": 1}
    (project / "spec.json").write_text(json.dumps(data))
    code, said = run(["optimize", "k.cu", "--spec", "spec.json", "--dry-run"], capsys)
    assert code == 2 and "params[2]: the spec says a scalar" in said


# ---------------------------------------------------------------- the knowledge base

def _foreign(path: Path) -> bytes:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine')")
    conn.commit()
    conn.close()
    return path.read_bytes()


def test_foreign_sqlite_file_is_refused_untouched(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = project.parent / "notes.sqlite"
    before = _foreign(path)
    code, said = run(["kb", "stats", "--db", str(path)], capsys)
    assert code == 1 and "another application's SQLite database (tables notes)" in said
    with pytest.raises(KbError, match="another application's"):
        KnowledgeBase.open(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith("notes")) == ["notes.sqlite"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_kernel_lsp_databases_old_and_new_still_open(project: Path) -> None:
    new = project.parent / "new.sqlite3"
    KnowledgeBase.open(new).close()
    conn = sqlite3.connect(new)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.execute("PRAGMA application_id = 0")  # as one made before the id existed
    conn.commit()
    conn.close()
    with KnowledgeBase.open(new) as kb:
        assert kb.stats().techniques > 0


def test_kb_db_on_a_missing_file_needs_create(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = project.parent / "typo" / "kb.sqlite3"
    code, said = run(["kb", "stats", "--db", str(missing)], capsys)
    assert code == 1 and "pass --create" in said and not missing.exists()
    code, said = run(["kb", "stats", "--db", str(missing), "--create"], capsys)
    assert code == 0 and missing.exists()


ATTEMPT = {"type": "attempt", "id": "same-id", "kernel_hash": "h", "file": "k.cu", "kernel": "k",
           "state": "uncoalesced-access", "technique": "vectorized-loads", "candidate_hash": "c1",
           "verdict": "accepted", "accepted": True, "speedup": 1.5, "reason": "", "metrics_before": {},
           "metrics_after": {}, "features": {}, "model": None, "generator": "rules", "original_source": None,
           "candidate_source": None, "created_at": "2025-01-01T00:00:00+00:00"}
PRIOR_STATE = {"type": "state", "name": "derived-x", "description": "d", "signature": {}, "parent": "uncoalesced-access",
               "origin": "derived", "created_at": "2025-01-01T00:00:00+00:00",
               "priors": [{"technique": "vectorized-loads", "predicted_speedup": 1.2, "confidence": 0.5,
                           "attempts": 2**64, "successes": 1}]}


@pytest.mark.parametrize("records, why", [
    ([PRIOR_STATE], "'attempts' is out of range"),
    ([{**PRIOR_STATE, "priors": [{**PRIOR_STATE["priors"][0], "attempts": 10**10}]}], "attempts must be at most"),
    ([ATTEMPT, {**ATTEMPT, "candidate_hash": "c2", "speedup": 3.0}], "attempt id 'same-id' is also line 2's"),
    ([{**ATTEMPT, "speedup": 1e308}], "'speedup' must lie in (0, 1e+06]"),
    ([{**PRIOR_STATE, "priors": [{**PRIOR_STATE["priors"][0], "attempts": 2, "predicted_speedup": 1e9}]}],
     "predicted_speedup must lie in (0, 1e+06]"),
])
def test_kb_import_refuses_out_of_range_and_conflicting_records(project: Path, capsys, records, why) -> None:
    db = project.parent / "kb.sqlite3"
    export = project.parent / "export.jsonl"
    assert run(["kb", "export", str(export)], capsys)[0] == 0
    header = export.read_text().splitlines()[0]
    path = project.parent / "import.jsonl"
    path.write_text(header + "\n" + "".join(json.dumps(r) + "\n" for r in records))
    before = db.read_bytes()
    code, said = run(["kb", "import", str(path)], capsys)
    assert code == 1 and why in said and "nothing was imported" in said and "Traceback" not in said, said
    with KnowledgeBase.open(db) as kb:
        assert kb.stats().attempts == 0 and not [s for s in kb.states() if s.name == "derived-x"]
    assert len(db.read_bytes()) == len(before)


def test_kb_import_conflict_with_a_stored_attempt(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = project.parent / "export.jsonl"
    assert run(["kb", "export", str(export)], capsys)[0] == 0
    header = export.read_text().splitlines()[0]
    first, second = project.parent / "a.jsonl", project.parent / "b.jsonl"
    first.write_text(header + "\n" + json.dumps(ATTEMPT) + "\n")
    second.write_text(header + "\n" + json.dumps({**ATTEMPT, "speedup": 9.0}) + "\n")
    assert run(["kb", "import", str(first)], capsys)[0] == 0
    assert run(["kb", "import", str(first)], capsys) == (0, "imported 0 attempts (1 already known) and 0 states\n")
    code, said = run(["kb", "import", str(second)], capsys)
    assert code == 1 and "attempt id 'same-id' is already in" in said


def test_a_search_with_a_foreign_kb_path_goes_on_without_it(tmp_path: Path) -> None:
    # The server's and the CLI's searches open kbPath through Session.stores: a foreign file becomes the
    # message "knowledge base unavailable, continuing without it: ..." and is left as it was.
    from kernel_lsp.config import Settings
    from kernel_lsp.services.session import Session

    path = tmp_path / "notes.sqlite"
    before = _foreign(path)
    with Session(Settings(kb_path=str(path))).stores(traces=False) as stores:
        assert stores.kb is None and "another application's SQLite database" in stores.messages[0]
    assert path.read_bytes() == before
