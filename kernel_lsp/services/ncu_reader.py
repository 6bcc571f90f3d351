"""Read Nsight Compute results into :class:`~kernel_lsp.core.profile.KernelProfile` objects.

Two readers, one result:

* NVIDIA's ``ncu_report`` Python module, found beside ``ncu``
  (``<install>/extras/python``) or installed from PyPI (``ncu-report``): reads the
  ``.ncu-rep`` file directly, metrics, rule results and per-PC source counters.
* The ``--csv`` exports of ``ncu -i REPORT``: ``--page raw`` (every metric),
  ``--page details --print-details all`` (rule results), ``--page source
  --print-source cuda`` (per-line counters). Used when the module is missing or
  cannot read the report.

The parsing functions take text and are pure; only :func:`read_report` runs
ncu (through :func:`kernel_lsp.services.proc.run`). Column and key names differ
between ncu versions, so every lookup goes through the small tables below.
"""

from __future__ import annotations

import csv
import glob
import importlib
import io
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from kernel_lsp.core.profile import COLLECTOR_NCU, KernelProfile, LineCounters, RuleAdvice
from kernel_lsp.services import proc

log = logging.getLogger(__name__)

#: Identity columns of the raw and details pages (not metrics).
_ID_COLUMNS = frozenset(
    {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
     "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value", "Function Name",
     "Demangled Name", "Kernel Name (demangled)", "Rule Name", "Rule Type", "Rule Description",
     "Estimated Speedup Type", "Estimated Speedup", "Id", "Rule Identifier"}
)
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_VERSION = re.compile(r"Version\s+(\d{4}\.\d+(?:\.\d+)*)")


class NcuReadError(RuntimeError):
    """A report or export that cannot be read; the message says why, for the user."""


@dataclass(frozen=True)
class KernelRecord:
    """One profiled kernel launch as read from an export, before it becomes a profile."""

    id: int
    name: str
    """Function name without parameters (``stream_triad``)."""
    full_name: str
    """Kernel name as ncu printed it (demangled, with parameters)."""
    metrics: dict[str, float] = field(default_factory=dict)
    strings: dict[str, str] = field(default_factory=dict)
    rules: tuple[RuleAdvice, ...] = ()
    sections: tuple[str, ...] = ()


def parse_number(text: str) -> float | None:
    """ncu's number formats (``1,234.5``, ``12``, ``n/a``) -> float or None."""
    t = text.strip().strip('"')
    if not t or not _NUMBER.match(t) or t in {"+", "-", "."}:
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return None


def short_name(kernel_name: str) -> str:
    """``void ns::saxpy<float>(float *, int)`` -> ``saxpy``."""
    name = kernel_name.strip()
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    head = name[:cut].strip()
    head = re.sub(r"<.*>$", "", head).strip()
    head = head.split()[-1] if head.split() else head
    return head.rsplit("::", 1)[-1]


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV rows of ``text``, skipping ncu's ``==PROF==`` log lines and the program's own output."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_raw_csv(text: str) -> list[KernelRecord]:
    """``--page raw --csv`` (with or without ``--print-units base``): one record per kernel launch."""
    rows = _csv_rows(text)
    header_at = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if header_at is None:
        raise NcuReadError("no raw-page CSV header (a row starting with \"ID\") in the ncu output")
    header = rows[header_at]
    records: list[KernelRecord] = []
    for row in rows[header_at + 1 :]:
        if not row or len(row) < len(header) or not row[0].strip():
            continue  # the units row has an empty ID
        if row[0] == "ID":
            continue  # a repeated header (several processes)
        cells = dict(zip(header, row))
        metrics: dict[str, float] = {}
        strings: dict[str, str] = {}
        for name, value in cells.items():
            if name in _ID_COLUMNS:
                continue
            number = parse_number(value)
            if number is None:
                if value.strip():
                    strings[name] = value
            else:
                metrics[name] = number
        full = cells.get("Kernel Name", "")
        records.append(KernelRecord(int(parse_number(cells["ID"]) or 0), short_name(full), full, metrics, strings))
    if not records:
        raise NcuReadError("the raw-page CSV holds no kernel (no kernel was profiled?)")
    return records


def _speedup(text: str | None) -> float | None:
    return None if text is None else parse_number(text)


def parse_details_csv(text: str) -> dict[int, tuple[tuple[str, ...], tuple[RuleAdvice, ...], dict[str, float]]]:
    """``--page details --print-details all --csv`` -> kernel id -> (sections, rule results, metrics shown)."""
    rows = _csv_rows(text)
    header_at = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if header_at is None:
        raise NcuReadError("no details-page CSV header in the ncu output")
    header = rows[header_at]
    out: dict[int, tuple[list[str], list[RuleAdvice], dict[str, float]]] = {}
    for row in rows[header_at + 1 :]:
        if not row or row[0] == "ID":
            continue
        cells = dict(zip(header, row))
        kid = int(parse_number(cells.get("ID", "")) or 0)
        sections, rules, metrics = out.setdefault(kid, ([], [], {}))
        section = cells.get("Section Name", "").strip()
        if section and section not in sections:
            sections.append(section)
        rule_name = (cells.get("Rule Name") or "").strip()
        if rule_name:
            kind = (cells.get("Rule Type") or "").strip().upper()
            message = " ".join((cells.get("Rule Description") or "").split())
            speedup = _speedup(cells.get("Estimated Speedup"))
            scope = (cells.get("Estimated Speedup Type") or "").strip().lower() or None
            rules.append(RuleAdvice(rule_name, rule_name, message, kind or "INF", speedup, scope))
            continue
        metric_name = (cells.get("Metric Name") or "").strip()
        value = parse_number(cells.get("Metric Value", ""))
        if metric_name and value is not None:
            metrics[f"{section}/{metric_name}" if section else metric_name] = value
    return {kid: (tuple(s), tuple(r), m) for kid, (s, r, m) in out.items()}


# ------------------------------------------------------------------- source page

#: Source-page column -> LineCounters field (ncu 2025: ``--page source --print-source cuda,sass``).
_SOURCE_COLUMNS: dict[str, str] = {
    "Warp Stall Sampling (All Samples)": "samples_total",
    "Warp Stall Sampling (Not-issued Samples)": "samples_not_issued",
    "Instructions Executed": "instructions_executed",
    "L2 Theoretical Sectors Global Excessive": "excessive_global_sectors",
    "L1 Wavefronts Shared Excessive": "shared_excessive_wavefronts",
    "Divergent Branches": "divergent_branches",
}
#: Short stall names of the source page and of ``smsp__pcsamp_warps_issue_stalled_*`` -> our reason names.
STALL_ALIASES: dict[str, str] = {
    "long_sb": "long_scoreboard", "short_sb": "short_scoreboard", "lg": "lg_throttle", "mio": "mio_throttle",
    "math": "math_pipe_throttle", "no_inst": "no_instruction", "no_instructions": "no_instruction",
    "imc": "imc_miss", "dispatch": "dispatch_stall", "sleep": "sleeping", "tex": "tex_throttle",
}
_LINE_HEADERS = ("Line No", "# Line", "Line", "#")


def stall_reason(short: str) -> str:
    return STALL_ALIASES.get(short, short)


def parse_source_csv(text: str) -> dict[str, dict[int, LineCounters]]:
    """``--page source --print-source cuda,sass --csv`` -> file -> line -> counters.

    Each file starts with a ``"File Path","..."`` row (and a ``"Function Name"`` row
    per kernel); the header row starts with ``Line No``. Rows with a line number
    carry the counters summed over that line's SASS; SASS rows (empty line number)
    are skipped. ``--print-source cuda`` alone prints no counters.
    """
    out: dict[str, dict[int, LineCounters]] = {}
    current = ""
    header: list[str] | None = None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        first = row[0].strip()
        if first in ("File Path", "File Name") and len(row) >= 2:
            current, header = row[1].strip(), None
            continue
        if first in _LINE_HEADERS and len(row) > 2:
            header = [c.strip() for c in row]
            continue
        if header is None or not first:
            continue
        line_no = parse_number(first)
        if line_no is None:
            continue
        counters = _line_counters(current, int(line_no), header, row)
        if counters is not None:
            merged = out.setdefault(current, {})
            merged[counters.line] = _merge_lines(merged.get(counters.line), counters)
    return out


def _merge_lines(old: LineCounters | None, new: LineCounters) -> LineCounters:
    """One line listed under two kernels (an inlined device function): add the counters."""
    if old is None:
        return new

    def add(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else a + b

    stalls = dict(old.stall_samples)
    for reason, n in new.stall_samples.items():
        stalls[reason] = stalls.get(reason, 0.0) + n
    return LineCounters(
        old.file, old.line, stalls,
        add(old.samples_total, new.samples_total), add(old.samples_not_issued, new.samples_not_issued),
        add(old.instructions_executed, new.instructions_executed),
        add(old.excessive_global_sectors, new.excessive_global_sectors),
        add(old.shared_excessive_wavefronts, new.shared_excessive_wavefronts),
        add(old.divergent_branches, new.divergent_branches),
    )


def _line_counters(file: str, line: int, header: list[str], row: list[str]) -> LineCounters | None:
    values: dict[str, float] = {}
    stalls: dict[str, float] = {}
    for column, raw in zip(header, row):
        field_name = _SOURCE_COLUMNS.get(column)
        if field_name is None and not column.startswith("stall_"):
            continue
        number = parse_number(raw)
        if number is None:
            continue
        if field_name is not None:
            values[field_name] = number
        elif "(not issued)" not in column.lower() and number > 0:
            stalls[stall_reason(column.removeprefix("stall_"))] = number
    if not values and not stalls:
        return None
    return LineCounters(file=file, line=line, stall_samples=stalls, **values)


# ------------------------------------------------------------------- ncu_report module


def module_dirs(ncu_path: str) -> list[str]:
    """Candidate ``extras/python`` folders of the ncu install that ``ncu_path`` resolves to."""
    exe = proc.which(ncu_path)
    if exe is None:
        return []
    folder = os.path.dirname(os.path.realpath(exe))
    found: list[str] = []
    for _ in range(4):
        for candidate in [os.path.join(folder, "extras", "python"), *glob.glob(os.path.join(folder, "nsight-compute*", "extras", "python"))]:
            if os.path.isfile(os.path.join(candidate, "ncu_report.py")) and candidate not in found:
                found.append(candidate)
        folder = os.path.dirname(folder)
    return found


def import_ncu_report(ncu_path: str = "ncu"):
    """The ``ncu_report`` module beside ``ncu_path`` (preferred: it matches the reports), else an installed one, else None."""
    for folder in module_dirs(ncu_path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            module = importlib.import_module("ncu_report")
            return module
        except ImportError as exc:
            log.info("ncu_report in %s cannot be imported: %s", folder, exc)
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        return None


def _metric_value(metric) -> float | None:
    try:
        value = metric.value()
    except Exception:  # noqa: BLE001 - string/instanced metrics raise differently per version
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return parse_number(str(value)) if isinstance(value, str) else None


#: Instanced (per-PC) metrics of the SourceCounters section -> LineCounters field.
SOURCE_METRICS: dict[str, str] = {
    "smsp__pcsamp_sample_count": "samples_total",
    "inst_executed": "instructions_executed",
    "derived__memory_l2_theoretical_sectors_global_excessive": "excessive_global_sectors",
    "derived__memory_l1_wavefronts_shared_excessive": "shared_excessive_wavefronts",
    "smsp__branch_targets_threads_divergent": "divergent_branches",
}
_PCSAMP_STALL = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(?P<reason>[a-z_]+)$")


def records_from_module(module, path: str) -> list[KernelRecord]:
    """Every action of the report at ``path`` as :class:`KernelRecord` (metrics, rules) via ``ncu_report``."""
    try:
        context = module.load_report(path)
    except Exception as exc:  # noqa: BLE001 - the module raises plain exceptions for bad or newer files
        raise NcuReadError(f"ncu_report cannot read {path}: {exc}") from None
    records: list[KernelRecord] = []
    for r in range(context.num_ranges()):
        rng = context.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            metrics: dict[str, float] = {}
            strings: dict[str, str] = {}
            for name in action.metric_names():
                metric = action.metric_by_name(name)
                value = _metric_value(metric)
                if value is not None:
                    metrics[name] = value
                else:
                    try:
                        strings[name] = str(metric.as_string())
                    except Exception:  # noqa: BLE001
                        pass
            full = str(action.name())
            records.append(
                KernelRecord(len(records), short_name(full), full, metrics, strings, _module_rules(action))
            )
    if not records:
        raise NcuReadError(f"{path} holds no profiled kernel")
    return records


#: ``ncu_report`` message types (``MsgType_*``) -> the kinds the details page prints.
_MSG_KINDS = {0: "INF", 1: "INF", 2: "OPT", 3: "WRN", 4: "ERR"}
#: ``SpeedupType_*`` -> scope.
_SPEEDUP_SCOPES = {1: "local", 2: "global"}


def _module_rules(action) -> tuple[RuleAdvice, ...]:
    """Rule results via ``rule_results_as_dicts()`` (ncu 2024+); () when the module lacks it."""
    try:
        raw = action.rule_results_as_dicts()
    except Exception:  # noqa: BLE001 - older modules lack it
        return ()
    rules: list[RuleAdvice] = []
    for item in raw or []:
        if not isinstance(item, Mapping):
            continue
        rule_id = str(item.get("rule_identifier") or item.get("name") or "")
        title = str(item.get("name") or rule_id)
        speedup = item.get("speedup_estimation")
        estimate = speedup.get("speedup") if isinstance(speedup, Mapping) else None
        scope = _SPEEDUP_SCOPES.get(speedup.get("type")) if isinstance(speedup, Mapping) else None
        messages = item.get("rule_message")
        for message in messages if isinstance(messages, list) else [messages]:
            if not isinstance(message, Mapping):
                continue
            text = " ".join(str(message.get("message", "")).split())
            if text:
                kind = _MSG_KINDS.get(int(message.get("type", 0) or 0), "INF")
                rules.append(RuleAdvice(rule_id, title, text, kind, _as_float(estimate), scope))
    return tuple(rules)


def _as_float(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def lines_from_module(module, path: str, action_index: int = 0) -> dict[str, dict[int, LineCounters]]:
    """Per-line counters of one action: per-PC source metrics summed over the PCs of each line."""
    context = module.load_report(path)
    rng = context.range_by_idx(0)
    action = rng.action_by_idx(action_index)
    per_line: dict[tuple[str, int], dict[str, float]] = {}
    stalls: dict[tuple[str, int], dict[str, float]] = {}
    for name in action.metric_names():
        field_name = SOURCE_METRICS.get(name)
        stall = _PCSAMP_STALL.match(name)
        if field_name is None and stall is None:
            continue
        metric = action.metric_by_name(name)
        try:
            if not metric.has_correlation_ids():
                continue
            pcs = metric.correlation_ids()
            count = metric.num_instances()
        except Exception:  # noqa: BLE001
            continue
        for i in range(count):
            try:
                value = metric.as_double(i)
                info = action.source_info(pcs.as_uint64(i))
            except Exception:  # noqa: BLE001
                continue
            if info is None or not value:
                continue
            key = (str(info.file_name()), int(info.line()))
            if field_name is not None:
                per_line.setdefault(key, {})
                per_line[key][field_name] = per_line[key].get(field_name, 0.0) + value
            elif stall is not None and not stall.group("reason").endswith("not_issued"):
                stalls.setdefault(key, {})
                reason = stall_reason(stall.group("reason"))
                stalls[key][reason] = stalls[key].get(reason, 0.0) + value
    out: dict[str, dict[int, LineCounters]] = {}
    for key in set(per_line) | set(stalls):
        file, line = key
        out.setdefault(file, {})[line] = LineCounters(file, line, stalls.get(key, {}), **per_line.get(key, {}))
    return out


# ------------------------------------------------------------------- whole reports


def ncu_version(ncu_path: str, run: Callable[..., proc.ProcResult] = proc.run) -> str | None:
    try:
        result = run([ncu_path, "--version"], timeout_s=30)
    except proc.ToolMissing:
        return None
    m = _VERSION.search(result.stdout)
    return m.group(1) if m else None


def version_problem(stderr: str, report_path: str) -> str | None:
    """A clear message when ncu refuses a report made by another version; None otherwise."""
    low = stderr.lower()
    if "version" in low and any(w in low for w in ("newer", "older", "unsupported", "incompatible", "not supported")):
        return (
            f"{report_path} was written by a different Nsight Compute version than the ncu in use; "
            f"re-profile, or open it with the ncu that wrote it. ncu said: {stderr.strip()[:300]}"
        )
    return None


def to_profiles(records: Iterable[KernelRecord], lines: Mapping[str, Mapping[int, LineCounters]] | None = None, *,
                source_file: str | None = None, ncu_version_text: str | None = None) -> list[KernelProfile]:
    profiles = []
    for record in records:
        file_lines: Mapping[int, LineCounters] = {}
        chosen = source_file
        if lines:
            if source_file and source_file in lines:
                file_lines = lines[source_file]
            elif source_file:
                match = next((f for f in lines if f and os.path.basename(f) == os.path.basename(source_file)), None)
                if match:
                    file_lines, chosen = lines[match], match
            elif len(lines) == 1:
                chosen, file_lines = next(iter(lines.items()))
        profiles.append(
            KernelProfile(
                kernel=record.name,
                mangled=record.strings.get("Function Name") or None,
                metrics=dict(record.metrics),
                rules=record.rules,
                lines=dict(file_lines),
                source_file=chosen,
                sections=record.sections,
                ncu_version=ncu_version_text,
                collector=COLLECTOR_NCU,
            )
        )
    return profiles


def read_report(
    report_path: str,
    *,
    ncu_path: str = "ncu",
    source_file: str | None = None,
    with_lines: bool = True,
    timeout_s: float = 120.0,
    run: Callable[..., proc.ProcResult] = proc.run,
    prefer_module: bool = True,
) -> list[KernelProfile]:
    """Profiles of every kernel in ``report_path`` (``.ncu-rep``).

    Tries ``ncu_report`` first; falls back to ncu's CSV exports. Raises
    :class:`NcuReadError` with a message for the user when neither works.
    """
    version = None
    module = import_ncu_report(ncu_path) if prefer_module else None
    if module is not None:
        try:
            records = records_from_module(module, report_path)
            lines = lines_from_module(module, report_path) if with_lines else None
            return to_profiles(records, lines, source_file=source_file, ncu_version_text=version)
        except NcuReadError as exc:
            log.info("ncu_report failed, using CSV exports: %s", exc)
        except Exception as exc:  # noqa: BLE001 - an API change in the module must not stop profiling
            log.info("ncu_report API mismatch, using CSV exports: %s", exc)
    return _read_with_exports(report_path, ncu_path, source_file, with_lines, timeout_s, run)


def read_output(
    text: str,
    *,
    ncu_path: str = "ncu",
    source_file: str | None = None,
    run: Callable[..., proc.ProcResult] = proc.run,
) -> list[KernelProfile]:
    """Profiles from the raw-page CSV that a run with ``--csv --page raw`` printed (no report file).

    A run of metrics alone has no rules and no source page to export, so reading
    its own output spares the export process (about 0.5 s on the H200). Raises
    :class:`NcuReadError` when the output holds no CSV.
    """
    return to_profiles(parse_raw_csv(text), None, source_file=source_file, ncu_version_text=_cached_version(ncu_path, run))


def _export(report_path: str, ncu_path: str, args: list[str], timeout_s: float, run) -> str:
    try:
        result = run([ncu_path, "-i", report_path, "--csv", *args], timeout_s=timeout_s)
    except proc.ToolMissing as exc:
        raise NcuReadError(f"cannot export {report_path}: {exc}") from None
    if not result.ok:
        problem = version_problem(result.stderr + result.stdout, report_path)
        raise NcuReadError(problem or f"ncu -i {report_path} failed: {(result.stderr or result.stdout).strip()[:300]}")
    return result.stdout


#: The three exports of the CSV reader; they read the report only, so they run side by side.
_EXPORTS: dict[str, list[str]] = {
    "raw": ["--page", "raw", "--print-units", "base"],
    "details": ["--page", "details", "--print-details", "all", "--print-units", "base"],
    "source": ["--page", "source", "--print-source", "cuda,sass"],
}


def _read_with_exports(report_path, ncu_path, source_file, with_lines, timeout_s, run) -> list[KernelProfile]:
    pages = ["raw", "details"] + (["source"] if with_lines else [])
    with ThreadPoolExecutor(max_workers=len(pages) + 1) as pool:
        futures = {page: pool.submit(_export, report_path, ncu_path, _EXPORTS[page], timeout_s, run) for page in pages}
        version = pool.submit(_cached_version, ncu_path, run)
        records = parse_raw_csv(futures["raw"].result())
        try:
            details = parse_details_csv(futures["details"].result())
        except NcuReadError as exc:
            log.info("no rule results: %s", exc)
            details = {}
        lines = None
        # Several launches of one kernel (a repeated launch for timing) list the same lines once per
        # launch; parse_source_csv adds them up, which keeps every line's share of the samples.
        if with_lines:
            try:
                lines = parse_source_csv(futures["source"].result())
            except NcuReadError as exc:
                log.info("no source counters: %s", exc)
        version_text = version.result()
    records = [replace(r, rules=details[r.id][1]) if r.id in details else r for r in records]
    return to_profiles(records, lines, source_file=source_file, ncu_version_text=version_text)


_VERSIONS: dict[str, str | None] = {}


def _cached_version(ncu_path: str, run) -> str | None:
    """``ncu --version`` once per executable path (a process start costs ~0.3 s); stand-in runners are not cached."""
    if run is not proc.run:
        return ncu_version(ncu_path, run)
    if ncu_path not in _VERSIONS:
        _VERSIONS[ncu_path] = ncu_version(ncu_path, run)
    return _VERSIONS[ncu_path]
