"""Load the profiling-tree refinement dataset: recorded full profiles as :class:`Sample` objects.

A dataset folder holds raw-page CSV exports of ``--set full`` reports
(``ncu -i R.ncu-rep --csv --page raw --print-units base > NAME.csv``, optionally gzipped) and,
optionally, the .cu files they profiled: a kernel found in one of them gets its
``static.*`` facts. Every full profile can emulate any cheaper collection
(:func:`kernel_lsp.core.profiling_tree.emulate`), so one recording serves every
candidate tree.
"""

from __future__ import annotations

import glob
import gzip
import json
import os

from kernel_lsp.core.index import build_index
from kernel_lsp.core.profile import M_MEMORY_PCT, M_SM_PCT
from kernel_lsp.core.profiling_tree import Sample, static_facts
from kernel_lsp.core.tree_learning import Case, Tried
from kernel_lsp.services.ncu_reader import NcuReadError, parse_raw_csv


class DatasetError(ValueError):
    """A dataset folder that yields no usable sample."""


def load_dataset(folder: str, source_dirs: tuple[str, ...] = ()) -> list[Sample]:
    """Every kernel of every CSV in ``folder`` that has speed-of-light metrics, sorted by name.

    Kernels are looked up by name in the .cu files of ``folder`` and ``source_dirs``.
    """
    facts_by_kernel: dict[str, dict[str, float]] = {}
    for path in sorted(p for d in (folder, *source_dirs) for p in glob.glob(os.path.join(d, "*.cu"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
        index = build_index(source)
        for function in index.kernels:
            if function.name not in facts_by_kernel:
                facts_by_kernel[function.name] = static_facts(function, source, dict(index.constants))
    samples: list[Sample] = []
    problems: list[str] = []
    for path in sorted(glob.glob(os.path.join(folder, "*.csv")) + glob.glob(os.path.join(folder, "*.csv.gz"))):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        try:
            records = parse_raw_csv(text)
        except NcuReadError as exc:
            problems.append(f"{os.path.basename(path)}: {exc}")
            continue
        stem = os.path.basename(path).split(".")[0]
        for record in records:
            if M_MEMORY_PCT not in record.metrics or M_SM_PCT not in record.metrics:
                continue
            facts = facts_by_kernel.get(record.name, {})
            samples.append(Sample(f"{stem}:{record.name}:{record.id}", record.metrics, facts))
    if not samples:
        raise DatasetError(f"no full profile with speed-of-light metrics in {folder}" + (f" ({'; '.join(problems)})" if problems else ""))
    return sorted(samples, key=lambda s: s.name)


def recorded_dataset_dir() -> str:
    """The recorded full profiles of a checkout (``tests/fixtures/ncu/dataset``: 27 kernels on an H200, with
    their .cu files there and in ``programs``): what the shipped tree's agreement is tested and learned on."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "tests", "fixtures", "ncu", "dataset")


def load_recorded_samples(folder: str | None = None, source_dirs: tuple[str, ...] | None = None) -> list[Sample]:
    """:func:`load_dataset` of ``folder`` (default :func:`recorded_dataset_dir`) with the .cu files of
    ``source_dirs`` (default: the ``programs`` folder beside it)."""
    folder = folder or recorded_dataset_dir()
    if source_dirs is None:
        source_dirs = (os.path.join(os.path.dirname(os.path.abspath(folder)), "programs"),)
    return load_dataset(folder, source_dirs)


def load_corpus_cases(corpus_dir: str, profiles_path: str, outcomes_path: str) -> tuple[list[Case], list[str]]:
    """The learning cases of the corpus kernels that have both a recorded full profile and recorded verdicts.

    ``profiles_path``: ``benchmarks/tree_data.py``'s JSON (every metric group of each kernel, from the GPU);
    ``outcomes_path``: ``benchmarks/corpus_suite.py``'s JSON (each kernel's candidates and the harness's
    verdicts). The candidates the rules list today are joined with the verdicts by generator name; one the
    recording did not verify is kept as unverified. Returns the cases and the kernels left out (with why).
    """
    from kernel_lsp.core.rules import RuleGenerator
    from kernel_lsp.core.candidates import OptimizeRequest
    from kernel_lsp.core.spec import SpecError, parse_spec
    from kernel_lsp.core.static_state import static_state
    from kernel_lsp.core.features import static_features

    with open(profiles_path, encoding="utf-8") as f:
        profiles = {k["name"]: k for k in json.load(f)["kernels"] if k.get("metrics")}
    with open(outcomes_path, encoding="utf-8") as f:
        outcomes = {k["name"]: k for k in json.load(f)["kernels"]}
    cases: list[Case] = []
    left_out: list[str] = []
    for folder in sorted(glob.glob(os.path.join(corpus_dir, "*", "spec.json"))):
        name = os.path.basename(os.path.dirname(folder))
        if name not in profiles or name not in outcomes:
            left_out.append(f"{name}: {'no recorded profile' if name not in profiles else 'no recorded verdicts'}")
            continue
        source_path = os.path.join(os.path.dirname(folder), "kernel.cu")
        with open(source_path, encoding="utf-8") as f:
            source = f.read()
        with open(folder, encoding="utf-8") as f:
            raw_spec = json.load(f)
        try:
            spec = parse_spec(raw_spec, os.path.dirname(folder))
        except SpecError as exc:
            left_out.append(f"{name}: launch spec: {exc}")
            continue
        index = build_index(source)
        function = next((fn for fn in index.kernels if fn.name == spec.kernel), None)
        if function is None:
            left_out.append(f"{name}: no kernel {spec.kernel}")
            continue
        verdicts = {t["generator"]: t for t in outcomes[name].get("tried", [])}
        request = OptimizeRequest(source=source, path=source_path, kernel=spec.kernel, spec=spec.to_json())
        tried = []
        for candidate in RuleGenerator().generate(request):
            v = verdicts.get(candidate.generator)
            correct = v is not None and v.get("status") in ("accepted", "slower")
            tried.append(Tried(candidate.generator, candidate.technique,
                               float(v["speedup"]) if correct and v.get("speedup") else None,
                               accepted=v is not None and v.get("status") == "accepted",
                               after=candidate.after, verified=v is not None))
        features = static_features(function, source, dict(index.constants))
        guess = static_state(features)
        sample = Sample(name, {k: float(v) for k, v in profiles[name]["metrics"].items()},
                        static_facts(function, source, dict(index.constants)))
        cases.append(Case(sample, tuple(tried), guess.state if guess else None))
    return cases, left_out


def split_cases(cases: list[Case], held_out_every: int = 3) -> tuple[list[Case], list[Case]]:
    """(training, held-out): every ``held_out_every``-th case by name is held out, the rest train."""
    ordered = sorted(cases, key=lambda c: c.sample.name)
    held = [c for i, c in enumerate(ordered) if i % held_out_every == held_out_every - 1]
    return [c for c in ordered if c not in held], held
