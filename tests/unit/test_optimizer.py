"""The search driver with a scripted verifier and a scripted model: ordering, budgets, the
knowledge base and trace updates, no-GPU and cancellation behaviour."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from kernel_lsp.core.candidates import Candidate, OptimizeRequest
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.spec import Spec, parse_spec
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.agent import AgentBudgets, AgentTools, CompileFeedback, ModelGenerator
from kernel_lsp.services.harness import GpuUnavailable, VerifyCancelled
from kernel_lsp.services.kb import KnowledgeBase
from scripted_model import ScriptedModel
from kernel_lsp.services.optimizer import Budget, candidate_hash, optimize
from kernel_lsp.services.traces import TraceStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str) -> tuple[str, Spec]:
    return (EXAMPLES / name / "original.cu").read_text(), parse_spec(json.loads((EXAMPLES / name / "spec.json").read_text()))


class ScriptedVerifier:
    """Verdicts chosen per technique; records what it was asked (sources and the launch it got)."""

    def __init__(self, speedups: dict[str, float | None], default: Reason = Reason.MISMATCH):
        self.speedups = speedups
        self.default = default
        self.calls: list[tuple[str, Spec]] = []

    def __call__(self, original: str, candidate: str, spec: Spec, cancel: threading.Event | None) -> Verdict:
        self.calls.append((candidate, spec))
        for marker, speedup in self.speedups.items():
            if marker in candidate:
                if speedup is None:
                    return Verdict(False, Reason.COMPILE_ERROR, ("scripted compile error",))
                accepted = speedup >= 1.05
                return Verdict(accepted, Reason.OK if accepted else Reason.NOT_FASTER, speedup=speedup,
                               speedup_ci_low=speedup * 0.97, speedup_ci_high=speedup * 1.03, max_rel_error=1e-7)
        return Verdict(False, self.default, ("scripted mismatch",))


@pytest.fixture
def kb(tmp_path: Path):
    with KnowledgeBase.open(tmp_path / "kb.sqlite3") as store:
        yield store


def test_best_is_the_accepted_candidate_with_the_highest_lower_bound(kb) -> None:
    source, spec = _example("transpose")
    verifier = ScriptedVerifier({"kl_tile": 2.4, "int c = blockIdx.y": 1.3, "__restrict__": 1.01})
    result = optimize(source, "t.cu", "transpose", spec, verifier=verifier, kb=kb, budget=Budget(max_candidates=10))
    assert result.best is not None
    assert result.best.candidate.technique == "transpose-via-shared-memory"
    assert [r.candidate.technique for r in result.accepted][:2] == ["transpose-via-shared-memory", "coalesce-index-mapping"]
    statuses = {r.candidate.technique: r.status() for r in result.results}
    assert statuses["restrict-const"] == "slower"
    # The verifier got each candidate's own launch: the tiled transpose's, not the spec's candidate field.
    tiled_spec = next(spec for src, spec in verifier.calls if "kl_tile" in src)
    assert tiled_spec.candidate_launch.block == ("32", "8", "1")
    restrict_spec = next(spec for src, spec in verifier.calls if "__restrict__" in src and "kl_tile" not in src)
    assert restrict_spec.candidate_launch == restrict_spec.launch


def test_every_verdict_is_recorded_in_the_knowledge_base(kb) -> None:
    source, spec = _example("histogram")
    verifier = ScriptedVerifier({"kl_priv": 3.0})
    result = optimize(source, "h.cu", "seg_histogram", spec, verifier=verifier, kb=kb)
    attempts = kb.attempts()
    assert len(attempts) == len(result.results) >= 2
    by_technique = {a.technique: a for a in attempts}
    privatized = by_technique["privatized-histogram"]
    assert privatized.accepted and privatized.speedup == pytest.approx(3.0)
    assert privatized.candidate_source and "kl_priv" in privatized.candidate_source
    # No profile: the state comes from the source (global atomics).
    assert privatized.state == result.state == "memory-instruction-throttled"
    rejected = [a for a in attempts if not a.accepted]
    assert rejected and all(a.speedup is None and a.candidate_source is None for a in rejected)
    entry = next(e for e in kb.entries(result.state) if e.technique == "privatized-histogram")
    assert entry.attempts >= 1 and entry.successes >= 1


def test_a_profile_whose_tree_leaf_ranks_by_the_source_gets_the_static_state(kb) -> None:
    from kernel_lsp.core import profile as P

    source, spec = _example("histogram")
    # A streaming signature: on its own it matches the bandwidth state, not the atomics the source shows.
    metrics = {P.M_MEMORY_PCT: 92.0, P.M_DRAM_PCT: 90.0, P.M_SM_PCT: 15.0, P.M_DURATION_NS: 2e6}
    measured = P.KernelProfile("seg_histogram", metrics=metrics, tree_leaf="busy_memory")
    by_profile = optimize(source, "h.cu", "seg_histogram", spec, kb=kb, profile=measured, verify=False)
    assert by_profile.state == kb.match_state(measured.signature()).state == "memory-bandwidth-saturated"
    by_source = optimize(source, "h.cu", "seg_histogram", spec, kb=kb, verify=False,
                         profile=P.KernelProfile("seg_histogram", metrics=metrics, tree_leaf="src", state_from="source"))
    assert by_source.state == "memory-instruction-throttled"
    assert any("leaf src ranks by the source" in m for m in by_source.messages)


def test_no_gpu_stops_verification_and_accepts_nothing(kb) -> None:
    source, spec = _example("softmax")
    calls = []

    def no_gpu(original, candidate, spec, cancel):
        calls.append(candidate)
        raise GpuUnavailable("no CUDA GPU available: pycuda cannot be imported")

    result = optimize(source, "s.cu", "softmax_rows", spec, verifier=no_gpu, kb=kb, budget=Budget(max_candidates=4))
    assert len(calls) == 1  # asked once, then every other candidate is listed unverified
    assert result.best is None and result.accepted == ()
    assert result.gpu_error and "pycuda" in result.gpu_error
    assert len(result.results) == 4 and all(r.verdict is None for r in result.results)
    assert kb.attempts() == []


def test_candidate_budget_and_cancellation() -> None:
    source, spec = _example("spmv")
    verifier = ScriptedVerifier({})
    result = optimize(source, "m.cu", "spmv_csr", spec, verifier=verifier, budget=Budget(max_candidates=2))
    assert len(result.results) == 2 and "candidate budget" in (result.stopped or "")

    cancel = threading.Event()

    def cancelling(original, candidate, spec, ev):
        cancel.set()
        raise VerifyCancelled("cancelled")

    result = optimize(source, "m.cu", "spmv_csr", spec, verifier=cancelling, cancel=cancel)
    assert result.stopped == "cancelled" and len(result.results) == 1 and result.best is None


def test_time_budget_uses_the_injected_clock() -> None:
    source, spec = _example("spmv")
    ticks = iter(range(0, 1000, 10))
    result = optimize(source, "m.cu", "spmv_csr", spec, verifier=ScriptedVerifier({}),
                      budget=Budget(max_candidates=50, max_seconds=25), clock=lambda: next(ticks))
    assert "time budget" in (result.stopped or "") and 1 <= len(result.results) <= 3


def test_dry_run_lists_unverified_candidates_without_calling_the_verifier() -> None:
    source, spec = _example("reduction")

    def never(*args):
        raise AssertionError("verifier called in a dry run")

    result = optimize(source, "r.cu", "chunk_sum", spec, verifier=never, verify=False)
    assert result.results and all(r.status() == "unverified" for r in result.results)
    assert result.results[0].candidate.technique == "warp-shuffle-reduction"


def test_dry_run_lists_a_sequence_after_its_listed_first_step() -> None:
    """Without verification a sequence's later step is listed once its first step was (a benchmark's
    generation saves it, and its verification tries it only once that step is accepted)."""
    source, spec = _example("matmul")
    result = optimize(source, "m.cu", "matmul", spec, verify=False, budget=Budget(max_candidates=20))
    names = [r.candidate.generator for r in result.results]
    step = names.index("rule:index-swap")
    assert names[step + 1] == "rule:index-swap+tile-contraction"
    assert result.results[step + 1].candidate.after == "rule:index-swap"


def test_progress_reports_each_candidate() -> None:
    source, spec = _example("streaming")
    seen: list[tuple[str, int | None]] = []
    optimize(source, "s.cu", "scale_add", spec, verifier=ScriptedVerifier({}), budget=Budget(max_candidates=3),
             progress=lambda m, p: seen.append((m, p)))
    assert sum(1 for m, _ in seen if m.startswith(("1/3", "2/3", "3/3"))) == 3
    assert seen[-1][1] == 100


TILED = (EXAMPLES / "transpose" / "honest_tiled.cu").read_text()
TILED_KERNEL = TILED[TILED.index('extern "C"'):]


def test_scripted_model_candidate_is_verified_and_traced(tmp_path: Path, kb) -> None:
    source, spec = _example("transpose")
    reply = json.dumps({"final": {"technique": "shared-memory-tiling", "explanation": "tiles",
                                  "kernel_source": "#define TILE 32\n#define BLOCK_ROWS 8\n" + TILED_KERNEL}})
    model = ScriptedModel([reply])
    traces = TraceStore(tmp_path / "traces.sqlite3")
    generator = ModelGenerator(model, AgentTools(compile=lambda s: CompileFeedback(True, "compiled")),
                               AgentBudgets(max_techniques=1, samples_per_technique=1), trace_sink=traces.record_attempt)
    verifier = ScriptedVerifier({"BLOCK_ROWS": 2.2})
    result = optimize(source, "t.cu", "transpose", spec, generators=[generator], verifier=verifier, kb=kb, traces=traces)
    assert len(result.results) == 1
    best = result.best
    assert best is not None and best.candidate.generator == "model:scripted"
    assert result.tokens > 0
    records = list(traces.attempts())
    assert len(records) == 1 and records[0]["verdict"]["accepted"] is True
    assert kb.attempts()[0].model == "scripted"
    traces.close()


def test_rule_verdicts_reach_the_trace_store(tmp_path: Path) -> None:
    source, spec = _example("transpose")
    traces = TraceStore(tmp_path / "traces.sqlite3")
    result = optimize(source, "t.cu", "transpose", spec, verifier=ScriptedVerifier({"kl_tile": 2.0}),
                      traces=traces, budget=Budget(max_candidates=2))
    records = list(traces.attempts())
    assert [r["generator"] for r in records] == [r.candidate.generator for r in result.results]
    assert all(r["verdict"] is not None for r in records)
    traces.close()


def test_duplicate_candidates_are_verified_once() -> None:
    source, spec = _example("spmv")

    class Twice:
        name = "twice"

        def generate(self, request):
            c = Candidate(request.kernel, request.source + "\n", "restrict-const", "rule:dup", "same")
            yield c
            yield c

    verifier = ScriptedVerifier({})
    result = optimize(source, "m.cu", "spmv_csr", spec, generators=[Twice()], verifier=verifier)
    assert len(verifier.calls) == 1 and len(result.results) == 1
    assert result.results[0].candidate_hash == candidate_hash(result.results[0].candidate)


def test_a_step_that_only_makes_the_next_possible_is_followed_once_correct() -> None:
    """A sequence's later step waits for the step before to be accepted, unless that step only makes it
    possible (``after_correct``): then a correct, not faster step is enough. A wrong one is never followed."""
    source, spec = _example("spmv")

    class Steps:
        name = "steps"

        def generate(self, request):
            for base, marker in (("rule:enable", "/*enable*/"), ("rule:wrong", "/*wrong*/")):
                yield Candidate(request.kernel, request.source + marker, "loop-invariant-hoisting", base, "base")
                yield Candidate(request.kernel, request.source + marker + "/*batch*/", "loop-unrolling", base + "+batch",
                                "then a batch", after=base, after_correct=True)
                yield Candidate(request.kernel, request.source + marker + "/*other*/", "warp-per-row", base + "+other",
                                "then another", after=base)

    verifier = ScriptedVerifier({"/*batch*/": 1.6, "/*other*/": 1.6, "/*enable*/": 1.0})
    result = optimize(source, "m.cu", "spmv_csr", spec, generators=[Steps()], verifier=verifier)
    tried = {r.candidate.generator: r.verdict.reason for r in result.results}
    assert tried == {"rule:enable": Reason.NOT_FASTER, "rule:enable+batch": Reason.OK, "rule:wrong": Reason.MISMATCH}
    assert result.best is not None and result.best.candidate.generator == "rule:enable+batch"


def test_register_accumulate_makes_a_load_batch_possible() -> None:
    """SHOC's reduction adds each thread's loads into its shared slot (``sdata[tid] += …`` in a ``while``
    loop): the store in every iteration keeps a load batch out until the slot is kept in a register."""
    corpus = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "shoc_reduction"
    source = (corpus / "kernel.cu").read_text()
    spec = parse_spec(json.loads((corpus / "spec.json").read_text()))
    listed = list(RuleGenerator().generate(OptimizeRequest(source=source, path=str(corpus / "kernel.cu"),
                                                           kernel=spec.kernel, spec=spec.to_json())))
    batch = next(c for c in listed if c.generator == "rule:register-accumulate+load-batch[batch=4]")
    assert batch.after == "rule:register-accumulate" and batch.after_correct
    assert ("for (int kl_u = 0; kl_u < 4; ++kl_u) { kl_acc0 += g_idata[i] + g_idata[i+blockSize];"
            in batch.source)
    deeper = next(c for c in listed if c.generator == "rule:register-accumulate+load-batch[batch=4]+tree-to-shuffle")
    assert not deeper.after_correct


def test_kb_order_puts_hinted_rules_first(kb) -> None:
    source, spec = _example("streaming")
    result = optimize(source, "s.cu", "scale_add", spec, generators=[RuleGenerator()], verifier=ScriptedVerifier({}),
                      kb=kb, verify=False, budget=Budget(max_candidates=20))
    hinted = [t for t in result.techniques if t in {r.candidate.technique for r in result.results}]
    produced = list(dict.fromkeys(r.candidate.technique for r in result.results))
    assert produced[: len(hinted)] == hinted
