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
import os

from kernel_lsp.core.index import build_index
from kernel_lsp.core.profile import M_MEMORY_PCT, M_SM_PCT
from kernel_lsp.core.profiling_tree import Sample, static_facts
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
