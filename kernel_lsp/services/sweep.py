"""Sweeps: every kernel with a launch spec under some paths, optimized through the editor's session.

``kernel-lsp sweep`` is this module's front end. A sweep

1. **finds** the kernels (:func:`discover`): every ``.cu`` file under the paths (or the files of a
   ``compile_commands.json``), each ``__global__`` function of it, its launch spec looked up as the
   editor does (:meth:`Session.resolve_spec`: sidecar, then in-source), else the folder's ``spec.json``
   for the kernel it names (:func:`folder_spec`, the layout of ``examples/`` and ``benchmarks/corpus/``);
   a kernel without one gets a drafted spec written under ``<out>/drafts/`` with what still needs
   filling (the user's tree is never written);
2. **optimizes** each one through :meth:`Session.optimize` (:func:`run_job`), on this machine
   (``local``: one kernel at a time, one GPU job at a time as in the editor) or as one Ray task per
   kernel with ``num_gpus=1`` (``ray``): Ray places, runs and retries the tasks (a lost worker's
   task is retried by Ray, ``max_retries``); nothing here schedules, queues or retries;
3. **keeps** each kernel's outcome under a key (:func:`job_key`: the kernel's hash, its file's hash,
   its spec and every setting that decides a verdict) in ``<out>/results/``: a sweep started again
   runs only the kernels without an outcome, and a kernel is never verified twice for the same
   settings. Inside a kernel, every verdict is kept in ``<out>/verdicts/`` as it is made
   (:class:`VerdictCache`), so a task that Ray retries after its worker was lost verifies only the
   candidates its first attempt did not;
4. **reports** (:func:`write_report`): ``sweep.json`` and ``sweep.html`` (a table and a chart of the
   verified speedups, drawn with ``kernel-lsp report``'s helpers: this module imports
   :mod:`kernel_lsp.services.report`, never the other way), and a patch per accepted rewrite in
   ``<out>/patches/``; :func:`apply_patches` applies them to a clean git working tree only, and
   never one whose file changed since it was verified.

On a cluster, every node must see the sources (and their headers) at the paths the driver found
them and the sweep's folder (shared storage), and have kernel-lsp installed; the knowledge base is
then best a team's PostgreSQL (``kbUrl``), which every worker writes at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import html
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kernel_lsp.core.index import build_index
from kernel_lsp.core.spec import Spec, SpecError
from kernel_lsp.core.spec_draft import draft_spec, placeholder_count
from kernel_lsp.core.transforms.launch_edit import applied_source
from kernel_lsp.core.verdict import Verdict
from kernel_lsp.services import optimizer
from kernel_lsp.services.harness import load_spec_file
from kernel_lsp.services.proc import ToolMissing, run
from kernel_lsp.services.report import figure, html_page, svg
from kernel_lsp.services.session import Session

log = logging.getLogger(__name__)

KEY_VERSION = 1
"""Bumped when what an outcome holds changes: older outcomes are then not reused."""
RESULTS, VERDICTS, PATCHES, DRAFTS = "results", "verdicts", "patches", "drafts"
REPORT_JSON, REPORT_HTML = "sweep.json", "sweep.html"
RAY_MAX_RETRIES = 3
"""Ray runs a task again this many times when its worker process or node is lost."""
SKIPPED_DIRS = frozenset((".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv"))
GIT_TIMEOUT_S = 60.0

ENGINES = ("local", "ray")
FOLDER_SPEC = "spec.json"
"""A folder's launch spec for the kernel it names, as ``examples/*/`` and ``benchmarks/corpus/*/`` hold them."""
FOLDER_SPEC_FILES = ("kernel.cu", "original.cu")
"""The file a folder's ``spec.json`` describes, by the project's own names (the corpus' ``kernel.cu``, the
examples' ``original.cu``); in a folder without either, its only ``.cu`` file. The examples keep rewrites and
cheats of the same kernel beside ``original.cu``: candidates to verify against it, not kernels to optimize."""


class SweepError(RuntimeError):
    """The sweep cannot run as asked (Ray missing or unreachable, a bad path)."""


@dataclass(frozen=True)
class SweepOptions:
    """What every kernel of a sweep is optimized with; sent as it is to each Ray task."""

    out_dir: str
    """The sweep's folder: results, verdicts, patches, drafts and the report."""
    workspace_root: str
    """Patches name files relative to it (the git top level when there is one)."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """camelCase settings over the user's settings file, as the CLI gives them (``verifySeeds``, ``minSpeedup``…)."""
    kb_path: str | None = None
    """The knowledge base (a file or a ``postgresql://`` URL); None: the settings' (``kbUrl``, ``kbPath``)."""
    use_kb: bool = True
    budget_candidates: int = 8
    budget_s: float = 600.0
    seed: int = optimizer.DEFAULT_SEED
    verify: bool = True
    """False: the dry run (candidates listed, nothing verified, no GPU asked for)."""
    arch: str | None = None
    time_budget_s: float = 2.0
    """Seconds of timed trials per candidate."""

    def session(self) -> Session:
        """The session a kernel is optimized in: the user's settings under :attr:`overrides`, as ``kernel-lsp optimize``'s."""
        from kernel_lsp.config import resolve
        from kernel_lsp.services.user_config import user_config_layer

        settings = resolve(user_config_layer(), ("command line", dict(self.overrides)))
        return Session(settings, workspace_root=self.workspace_root, kb_path=self.kb_path, use_kb=self.use_kb)

    def verify_overrides(self) -> dict[str, Any]:
        from kernel_lsp.services.harness.protocol import TimingOptions

        return {"arch": self.arch, "timing": dataclasses.replace(TimingOptions(), budget_s=self.time_budget_s)}

    def budget(self) -> optimizer.Budget:
        return optimizer.Budget(max_candidates=self.budget_candidates, max_seconds=self.budget_s)


@dataclass(frozen=True)
class KernelJob:
    """One kernel to optimize: its file's text and spec as the sweep found them."""

    path: str
    rel: str
    """``path`` relative to the workspace root (the patch's file name)."""
    kernel: str
    source: str
    spec: Spec
    spec_origin: str
    key: str
    """:func:`job_key`: where its outcome and verdicts are kept."""
    verify_context: str
    """The settings part of the key: verdicts are kept under it."""


@dataclass(frozen=True)
class DraftNote:
    path: str
    kernel: str
    draft_path: str | None
    """Where the drafted spec was written; None when it could not be."""
    todo: tuple[str, ...]
    placeholders: int = 0
    """Values of the draft still to fill in (``FILL_ME``)."""


@dataclass(frozen=True)
class Discovery:
    jobs: tuple[KernelJob, ...]
    drafts: tuple[DraftNote, ...]
    problems: tuple[str, ...]
    """Files that could not be read, invalid specs."""
    left_out: tuple[str, ...] = ()
    """One line per folder whose ``spec.json`` describes one file and other files define its kernel too."""


@dataclass(frozen=True)
class KernelOutcome:
    key: str
    path: str
    rel: str
    kernel: str
    status: str
    """``accepted``, ``none-faster``, ``listed`` (dry run), ``no-gpu`` or ``failed``."""
    original_sha256: str
    """The file's text the verdicts were made on: a patch applies only to this text."""
    technique: str | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    candidates: int = 0
    verified: int = 0
    """Candidates with a verdict (cached ones included)."""
    reused_verdicts: int = 0
    """Verdicts read from the verdict cache instead of verified again."""
    wall_s: float = 0.0
    gpu: str | None = None
    patch: str | None = None
    """The unified diff of the accepted rewrite (host launches edited to match), relative to the workspace root."""
    messages: tuple[str, ...] = ()
    result: Mapping[str, Any] = field(default_factory=dict)
    """The search's own record (:meth:`OptimizeResult.to_json`)."""

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["messages"] = list(self.messages)
        data["key_version"] = KEY_VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelOutcome:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["messages"] = tuple(values.get("messages", ()))
        return cls(**values)


@dataclass(frozen=True)
class SweepReport:
    outcomes: tuple[KernelOutcome, ...]
    """One per job, in discovery order."""
    drafts: tuple[DraftNote, ...]
    problems: tuple[str, ...]
    ran: int
    """Kernels optimized in this run (the others' outcomes were kept from before)."""
    wall_s: float
    engine: str
    dry_run: bool = False
    """Candidates were listed, none verified."""

    @property
    def accepted(self) -> tuple[KernelOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status == "accepted")

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "dry_run": self.dry_run, "wall_s": self.wall_s, "ran": self.ran,
            "kept": len(self.outcomes) - self.ran,
            "kernels": len(self.outcomes), "accepted": len(self.accepted),
            "outcomes": [{k: v for k, v in o.to_json().items() if k != "result"} for o in self.outcomes],
            "drafts": [dataclasses.asdict(d) for d in self.drafts], "problems": list(self.problems),
        }


# --------------------------------------------------------------------------- keys and stores


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _kernel_hash(source: str, kernel: str) -> str:
    index = build_index(source)
    fn = next((f for f in index.kernels if f.name == kernel), None)
    body = source.encode("utf-8")[fn.span.start_byte:fn.span.end_byte] if fn is not None else source.encode("utf-8")
    return hashlib.sha256(body).hexdigest()


def verify_context(options: SweepOptions, session: Session, path: str) -> str:
    """What decides a verdict besides the two texts and the spec: the verifier's options (nvcc, its
    flags, seeds, minimum speedup, architecture, timing), the search's budget and seed, dry run or not."""
    verify = dataclasses.asdict(session.verify_options(path, **options.verify_overrides()))
    # Where the interpreter and the sanitizer live differs between machines, not what they decide.
    for machine_specific in ("python", "sanitizer"):
        verify.pop(machine_specific, None)
    key = [KEY_VERSION, verify, options.budget_candidates, options.budget_s, options.seed, options.verify]
    return sha256_text(json.dumps(key, sort_keys=True, default=str))


def job_key(source: str, kernel: str, spec: Spec, context: str) -> str:
    """An outcome's key: the kernel's own hash, its file's hash (the verifier compiles the whole file:
    helpers, macros and launches outside the kernel change what is measured), the spec and the settings."""
    parts = [KEY_VERSION, _kernel_hash(source, kernel), sha256_text(source), kernel,
             json.dumps(spec.to_json(), sort_keys=True, default=str), context]
    return sha256_text(json.dumps(parts))


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
    partial.replace(path)


class ResultStore:
    """Outcomes by key in ``<out>/results/<key>.json`` (each written whole, atomically)."""

    def __init__(self, out_dir: str):
        self.folder = Path(out_dir) / RESULTS

    def get(self, key: str) -> KernelOutcome | None:
        try:
            data = json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if data.get("key_version") != KEY_VERSION:
            return None
        return KernelOutcome.from_json(data)

    def put(self, outcome: KernelOutcome) -> None:
        _write_json(self.folder / f"{outcome.key}.json", outcome.to_json())


class VerdictCache:
    """Verdicts by (original text, candidate text, spec with the candidate's launch, settings) in
    ``<out>/verdicts/``, written the moment they are made: what a retried task finds already verified."""

    def __init__(self, out_dir: str, context: str):
        self.folder = Path(out_dir) / VERDICTS
        self.context = context
        self.reused = 0
        self._replayed: set[str] = set()

    def replayed(self, result: optimizer.CandidateResult) -> bool:
        """Whether ``result``'s verdict was read from the cache: the knowledge base has it from the run that made it.

        (A worker lost between keeping a verdict and recording it leaves that one attempt unrecorded; recording
        replays instead would count every retried verdict twice.)"""
        return sha256_text(result.candidate.source) in self._replayed

    def _path(self, original: str, candidate: str, spec: Spec) -> Path:
        key = [self.context, sha256_text(original), sha256_text(candidate), json.dumps(spec.to_json(), sort_keys=True, default=str)]
        return self.folder / f"{sha256_text(json.dumps(key))}.json"

    def wrap(self, verifier: optimizer.Verifier) -> optimizer.Verifier:
        def cached(original: str, candidate: str, spec: Spec, cancel: Any) -> Verdict:
            path = self._path(original, candidate, spec)
            try:
                verdict = Verdict.from_json(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                verdict = None
            if verdict is not None:
                self.reused += 1
                self._replayed.add(sha256_text(candidate))
                return verdict
            verdict = verifier(original, candidate, spec, cancel)
            try:
                _write_json(path, verdict.to_json())
            except OSError as exc:  # an unwritable cache costs a second verification on a retry, no more
                log.warning("cannot keep the verdict in %s: %s", path, exc)
            return verdict

        return cached


# --------------------------------------------------------------------------- discovery


def _cu_files(paths: Sequence[str], out_dir: str) -> tuple[list[str], list[str]]:
    """The ``.cu`` files under ``paths`` (a ``compile_commands.json`` gives its entries'), sorted; and problems."""
    found: list[str] = []
    problems: list[str] = []
    skip = os.path.abspath(out_dir)
    for given in paths:
        path = os.path.abspath(given)
        if os.path.basename(path) == "compile_commands.json":
            try:
                entries = json.loads(Path(path).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                problems.append(f"{given}: cannot read the compile database ({exc})")
                continue
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("file"), str) and entry["file"].endswith(".cu"):
                    directory = entry.get("directory") if isinstance(entry.get("directory"), str) else os.path.dirname(path)
                    found.append(os.path.normpath(os.path.join(directory, entry["file"])))
        elif os.path.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and os.path.join(folder, d) != skip)
                found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".cu")]
        elif os.path.isfile(path):
            found.append(path)
        else:
            problems.append(f"{given}: no such file or folder")
    return sorted(dict.fromkeys(found)), problems


def _rel(path: str, root: str) -> str:
    """``path`` relative to ``root``, or as it is when it lies outside (an absolute path stays one)."""
    rel = os.path.relpath(path, root)
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


@dataclass(frozen=True)
class FolderSpec:
    """A folder's ``spec.json``: the kernel it names, its spec, and the file of the folder it describes."""

    path: str
    kernel: str
    spec: Spec | None
    problem: str | None
    """Why the spec cannot be used (it names a kernel but does not parse); None when it can."""
    file: str | None
    """The ``.cu`` file it describes (:data:`FOLDER_SPEC_FILES`); None when the folder does not say which."""


def folder_spec(folder: str) -> FolderSpec | None:
    """The launch spec ``folder/spec.json`` holds, or None when there is none (or the file is no launch spec:
    JSON without a ``kernel`` name is another tool's)."""
    path = os.path.join(folder, FOLDER_SPEC)
    if not os.path.isfile(path):
        return None
    try:
        spec, problem = load_spec_file(path), None
        kernel = spec.kernel
    except SpecError as exc:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            data = None
        kernel = data.get("kernel") if isinstance(data, dict) else None
        if not isinstance(kernel, str):
            return None
        spec, problem = None, f"the launch spec {path} is invalid: {exc}"
    sources = sorted(f for f in os.listdir(folder) if f.endswith(".cu") and os.path.isfile(os.path.join(folder, f)))
    named = [f for f in FOLDER_SPEC_FILES if f in sources]
    file = named[0] if named else (sources[0] if len(sources) == 1 else None)
    return FolderSpec(path, kernel, spec, problem, os.path.join(folder, file) if file else None)


def discover(paths: Sequence[str], options: SweepOptions) -> Discovery:
    """The kernels under ``paths`` that have a launch spec, and drafts for those that have none."""
    session = options.session()
    files, problems = _cu_files(paths, options.out_dir)
    # Drafts are laid out below the folder all the files share, so their paths stay short and relative.
    drafts_base = os.path.commonpath([os.path.dirname(f) for f in files]) if files else ""
    folders: dict[str, FolderSpec | None] = {}
    left_out: dict[str, list[str]] = {}
    jobs: list[KernelJob] = []
    drafts: list[DraftNote] = []
    for path in files:
        try:
            source = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: cannot read ({exc})")
            continue
        index = build_index(source)
        names = list(dict.fromkeys(f.name for f in index.kernels))
        if not names:
            continue
        context = verify_context(options, session, path)
        rel = _rel(path, options.workspace_root)
        folder = os.path.dirname(path)
        if folder not in folders:
            folders[folder] = folder_spec(folder)
        shared = folders[folder]
        analysis = None
        for kernel in names:
            found = session.resolve_spec(path, source, kernel, index=index)
            if found.spec is not None:
                jobs.append(KernelJob(path, rel, kernel, source, found.spec, found.origin or "",
                                      job_key(source, kernel, found.spec, context), context))
                continue
            if found.origin is not None:  # a spec exists but is invalid: say so, draft nothing over it
                problems.append(f"{rel}: {found.problem}")
                continue
            if shared is not None and shared.kernel == kernel:
                if shared.file != path:
                    left_out.setdefault(shared.path, []).append(os.path.basename(path))
                elif shared.spec is not None:
                    jobs.append(KernelJob(path, rel, kernel, source, shared.spec, FOLDER_SPEC,
                                          job_key(source, kernel, shared.spec, context), context))
                continue
            if analysis is None:
                analysis = session.analysis(path, source)
            drafts.append(_draft(options, rel, os.path.relpath(path, drafts_base), index, source, kernel, analysis))
    for shared in folders.values():
        if shared is not None and shared.problem and shared.file is not None:
            problems.append(shared.problem)
    notes = []
    for spec_path, others in left_out.items():
        shared = folders[os.path.dirname(spec_path)]
        where = _rel(os.path.dirname(spec_path), options.workspace_root)
        if shared is not None and shared.file is not None:
            notes.append(f"{where}: {FOLDER_SPEC} is {os.path.basename(shared.file)}'s; {len(others)} other file"
                         f"{'s' if len(others) > 1 else ''} defining {shared.kernel} left out as its candidates")
        else:
            problems.append(f"{where}: {FOLDER_SPEC} names {shared.kernel if shared else '?'}, which "
                            f"{', '.join(others)} define; none is named {' or '.join(FOLDER_SPEC_FILES)}: write the "
                            f"spec beside the one to sweep as FILE.cu.KERNEL.spec.json")
    return Discovery(tuple(jobs), tuple(drafts), tuple(problems), tuple(notes))


def _draft(options: SweepOptions, rel: str, draft_rel: str, index: Any, source: str, kernel: str,
           analysis: Any) -> DraftNote:
    """A drafted spec at ``<out>/drafts/<draft_rel>.<kernel>.spec.json`` (never beside the user's file), with
    what still needs filling."""
    try:
        draft = draft_spec(index, source, kernel, analysis.preprocessed, analysis.kernels.get(kernel))
    except Exception as exc:  # a draft is a help only; the sweep goes on
        log.exception("drafting the spec of %s failed", kernel)
        return DraftNote(rel, kernel, None, (f"no draft: {exc}",))
    todo = list(draft.todo)
    missing = placeholder_count(draft.spec)
    if missing and not todo:
        todo.append("fill in the values marked as placeholders")
    target = Path(options.out_dir) / DRAFTS / f"{draft_rel}.{kernel}.spec.json"
    data = dict(draft.spec)
    if todo:
        data["comment"] = "Fill in: " + " | ".join(todo)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        return DraftNote(rel, kernel, None, tuple(todo) + (f"cannot write the draft: {exc}",), missing)
    return DraftNote(rel, kernel, str(target), tuple(todo), missing)


# --------------------------------------------------------------------------- one kernel


def unified_patch(rel: str, before: str, after: str) -> str:
    """A unified diff ``git apply`` takes (a last line without a newline is marked as git marks it)."""
    lines = []
    for line in difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                     f"a/{rel}", f"b/{rel}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines)


def run_job(job: KernelJob, options: SweepOptions, verifier: optimizer.Verifier | None = None) -> KernelOutcome:
    """Optimize one kernel through the session (this is the body of a Ray task too).

    ``verifier`` replaces the harness (tests); either way every verdict goes through the sweep's
    :class:`VerdictCache`.
    """
    start = time.monotonic()
    session = options.session()
    cache = VerdictCache(options.out_dir, job.verify_context)
    base = verifier or session.verifier(job.path, **options.verify_overrides())
    result = session.optimize(job.source, job.path, job.kernel, job.spec, budget=options.budget(), verify=options.verify,
                              seed=options.seed, verifier=cache.wrap(base), already_recorded=cache.replayed)
    best = result.best
    verified = [r for r in result.results if r.verdict is not None]
    gpu = next((r.verdict.gpu.name for r in verified if r.verdict.gpu is not None), None)  # type: ignore[union-attr]
    patch = None
    if best is not None and options.verify:
        patch = unified_patch(job.rel, job.source, applied_source(best.candidate, job.source).source)
    if not options.verify:
        status = "listed"
    elif best is not None:
        status = "accepted"
    elif result.gpu_error:
        status = "no-gpu"
    else:
        status = "none-faster"
    v = best.verdict if best is not None else None
    return KernelOutcome(
        key=job.key, path=job.path, rel=job.rel, kernel=job.kernel, status=status,
        original_sha256=sha256_text(job.source), technique=best.candidate.technique if best is not None else None,
        speedup=v.speedup if v else None, speedup_ci_low=v.speedup_ci_low if v else None,
        speedup_ci_high=v.speedup_ci_high if v else None, candidates=len(result.results), verified=len(verified),
        reused_verdicts=cache.reused, wall_s=time.monotonic() - start, gpu=gpu, patch=patch,
        messages=tuple(result.messages) + ((result.gpu_error,) if result.gpu_error else ()), result=result.to_json(),
    )


def _failed(job: KernelJob, why: str) -> KernelOutcome:
    return KernelOutcome(key=job.key, path=job.path, rel=job.rel, kernel=job.kernel, status="failed",
                         original_sha256=sha256_text(job.source), messages=(why,))


# --------------------------------------------------------------------------- engines


def _local(jobs: Sequence[KernelJob], options: SweepOptions, verifier: optimizer.Verifier | None) -> Iterator[KernelOutcome]:
    """This machine: one kernel after another (the session's GPU lock keeps one GPU job at a time)."""
    for job in jobs:
        try:
            yield run_job(job, options, verifier)
        except Exception as exc:  # one kernel's failure is its outcome; the sweep goes on
            log.exception("sweep of %s failed", job.kernel)
            yield _failed(job, f"{type(exc).__name__}: {exc}")


def _ray(jobs: Sequence[KernelJob], options: SweepOptions, verifier: optimizer.Verifier | None,
         address: str | None) -> Iterator[KernelOutcome]:
    """One Ray task per kernel, ``num_gpus=1`` (none for a dry run); outcomes in the order they finish."""
    try:
        import ray
    except ImportError as exc:
        raise SweepError("--engine ray needs Ray: pip install 'kernel-lsp[ray]'") from exc
    started = not ray.is_initialized()
    if started:
        # No address: Ray starts a cluster of this machine (its GPUs), without its dashboard (the progress is
        # ours); "auto" or host:port joins a running one as it was started.
        here = {"include_dashboard": False} if address is None else {}
        try:
            ray.init(address=address, logging_level=logging.WARNING, configure_logging=False, **here)
        except Exception as exc:  # Ray's connection errors have no common base class
            raise SweepError(f"cannot reach the Ray cluster at {address or 'this machine'}: {exc}") from exc
    try:
        task = ray.remote(run_job).options(num_gpus=1 if options.verify else 0, max_retries=RAY_MAX_RETRIES)
        pending = {task.remote(job, options, verifier): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(done[0])
            try:
                yield ray.get(done[0])
            except Exception as exc:  # the task raised, or its worker was lost more often than Ray retries
                yield _failed(job, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}")
    finally:
        if started:
            ray.shutdown()


class Progress:
    """The sweep's progress on stderr: a bar redrawn in place on a terminal, a line per kernel otherwise."""

    def __init__(self, total: int, kept: int, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 *, dry_run: bool = False):
        self.total = total
        self.done = kept
        self.accepted = 0
        self.listed = 0
        self.dry_run = dry_run
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.start = clock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self, last: KernelOutcome | None = None) -> str:
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        tail = f"  {last.rel}:{last.kernel} {last.status}" if last is not None else ""
        counted = f"{self.listed} candidates listed" if self.dry_run else f"{self.accepted} accepted"
        return f"sweep [{bar}] {self.done}/{self.total} kernels, {counted}, {self.clock() - self.start:.0f} s{tail}"

    def update(self, outcome: KernelOutcome) -> None:
        self.done += 1
        self.accepted += outcome.status == "accepted"
        self.listed += outcome.candidates
        self._show(self.line(outcome))

    def _show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run_sweep(discovery: Discovery, options: SweepOptions, *, engine: str = "local", address: str | None = None,
              verifier: optimizer.Verifier | None = None, progress: Progress | None = None,
              stream: TextIO | None = None) -> SweepReport:
    """Optimize every kernel of ``discovery`` that has no outcome under its key yet, keep the outcomes, and
    write the report and patches (:func:`write_report`)."""
    if engine not in ENGINES:
        raise SweepError(f"unknown engine '{engine}' (one of {', '.join(ENGINES)})")
    start = time.monotonic()
    store = ResultStore(options.out_dir)
    kept = {job.key: store.get(job.key) for job in discovery.jobs}
    pending = [job for job in discovery.jobs if kept[job.key] is None]
    bar = progress or Progress(len(discovery.jobs), len(discovery.jobs) - len(pending), stream, dry_run=not options.verify)
    outcomes = {key: o for key, o in kept.items() if o is not None}
    runs = _local(pending, options, verifier) if engine == "local" else _ray(pending, options, verifier, address)
    for outcome in runs:
        # A failure is not kept: the next sweep tries that kernel again.
        if outcome.status not in ("failed", "no-gpu"):
            store.put(outcome)
        outcomes[outcome.key] = outcome
        bar.update(outcome)
    report = SweepReport(tuple(outcomes[j.key] for j in discovery.jobs if j.key in outcomes), discovery.drafts,
                         discovery.problems, len(pending), time.monotonic() - start, engine, dry_run=not options.verify)
    write_report(report, options.out_dir)
    return report


# --------------------------------------------------------------------------- report and patches


def patch_name(outcome: KernelOutcome) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{outcome.rel}.{outcome.kernel}")
    return f"{stem}.patch"


def write_report(report: SweepReport, out_dir: str) -> tuple[Path, Path]:
    """``sweep.json``, ``sweep.html`` and one patch per accepted rewrite (stale patches removed)."""
    out = Path(out_dir)
    patches = out / PATCHES
    patches.mkdir(parents=True, exist_ok=True)
    wanted = {patch_name(o): o.patch for o in report.accepted if o.patch}
    for old in patches.glob("*.patch"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        (patches / name).write_text(text or "", encoding="utf-8")
    _write_json(out / REPORT_JSON, report_json(report))
    html_path = out / REPORT_HTML
    html_path.write_text(sweep_page(report), encoding="utf-8")
    return out / REPORT_JSON, html_path


def report_json(report) -> dict:  # noqa: ANN001 - SweepReport
    """The report as ``sweep.json`` holds it (and ``sweep --json`` prints it): each accepted rewrite's patch
    named by its file under the sweep folder instead of inlined."""
    data = report.to_json()
    for row in data["outcomes"]:
        accepted = row["status"] == "accepted" and row.get("patch")
        row["patch_file"] = os.path.join(PATCHES, patch_name(KernelOutcome.from_json(row))) if accepted else None
        row.pop("patch", None)
    return data


@dataclass(frozen=True)
class ApplyResult:
    applied: tuple[str, ...]
    """``file:kernel`` of each patch applied."""
    skipped: tuple[str, ...]
    """Each patch not applied, with why."""
    refused: str | None = None
    """Why nothing was applied (not a git working tree, or not a clean one)."""


def _git(root: str, *args: str) -> Any:
    return run(("git", "-C", root, *args), timeout_s=GIT_TIMEOUT_S)


def git_toplevel(folder: str) -> str | None:
    try:
        result = _git(folder, "rev-parse", "--show-toplevel")
    except ToolMissing:
        return None
    return result.stdout.strip() if result.ok and result.stdout.strip() else None


def apply_patches(report: SweepReport, out_dir: str, root: str) -> ApplyResult:
    """Apply every accepted rewrite's patch to the git working tree at ``root``.

    Refused whole unless the tree is clean (no change to a tracked file, staged or not; untracked files,
    the sweep's own folder among them, do not count). A patch is applied only while its file's text is
    the one its rewrite was verified on; after one patch changed a file, the file's other patches were
    verified on the old text and are skipped (a new sweep verifies them on the new one).
    """
    try:
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
    except ToolMissing:
        return ApplyResult((), (), "git is not installed: --apply works on a git working tree only")
    if not status.ok:
        return ApplyResult((), (), f"{root} is not a git working tree: --apply works on one only")
    if status.stdout.strip():
        changed = ", ".join(line[3:] for line in status.stdout.splitlines()[:5])
        return ApplyResult((), (), f"the working tree has uncommitted changes ({changed}); commit or stash them first")
    applied: list[str] = []
    skipped: list[str] = []
    for outcome in report.accepted:
        name = f"{outcome.rel}:{outcome.kernel}"
        patch = Path(out_dir) / PATCHES / patch_name(outcome)
        try:
            current = sha256_text(Path(outcome.path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            skipped.append(f"{name}: cannot read the file ({exc})")
            continue
        if current != outcome.original_sha256:
            skipped.append(f"{name}: {outcome.rel} changed since the rewrite was verified; sweep again to verify it on the new text")
            continue
        result = _git(root, "apply", "--whitespace=nowarn", str(patch.resolve()))
        if not result.ok:
            skipped.append(f"{name}: git apply failed: {result.stderr.strip()}")
            continue
        applied.append(name)
    return ApplyResult(tuple(applied), tuple(skipped))


def outcome_rows(outcomes: Iterable[KernelOutcome]) -> list[tuple[str, str, str, str, str]]:
    """(kernel, status, technique, speedup [interval], candidates) per outcome, for the terminal and the page."""
    rows = []
    for o in outcomes:
        speed = ""
        if o.speedup is not None:
            speed = f"{o.speedup:.2f}x"
            if o.speedup_ci_low is not None and o.speedup_ci_high is not None:
                speed += f" [{o.speedup_ci_low:.2f}, {o.speedup_ci_high:.2f}]"
        rows.append((f"{o.rel}:{o.kernel}", o.status, o.technique or "", speed, f"{o.verified}/{o.candidates}"))
    return rows


def speedups(outcomes: Iterable[KernelOutcome]) -> list[tuple[str, float, float | None, float | None]]:
    """(kernel label, verified speedup, interval low, high) of each accepted outcome, for the chart."""
    return [(f"{o.rel}:{o.kernel}", o.speedup, o.speedup_ci_low, o.speedup_ci_high)
            for o in outcomes if o.status == "accepted" and o.speedup is not None]


def speedups_svg(rows: Sequence[tuple[str, float, float | None, float | None]]) -> str:
    """Horizontal bars: each accepted kernel's verified speedup with its interval, 1x marked."""
    # Margins from the drawing itself (``tight``): kernel labels are paths of any length, and the chart is one per sweep.
    fig, ax = figure(7.0, 0.4 * len(rows) + 1.3, left_in=0.5, bottom_in=0.6)
    labels = [label for label, *_ in rows][::-1]
    values = [speedup for _, speedup, _, _ in rows][::-1]
    low = [speedup - (lo if lo is not None else speedup) for _, speedup, lo, _ in rows][::-1]
    high = [(hi if hi is not None else speedup) - speedup for _, speedup, _, hi in rows][::-1]
    bars = ax.barh(labels, values, xerr=[low, high], color="#27ae60", ecolor="#555555", capsize=3)
    ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], padding=6, fontsize=8)
    ax.axvline(1.0, color="#555555", ls="--", lw=1)
    ax.set_xlabel("verified speedup (baseline / rewrite), with its interval")
    ax.set_xlim(0, max([1.2, *(v + h for v, h in zip(values, high))]) * 1.2)
    ax.set_title("Verified speedups per kernel", fontsize=10)
    return svg(fig, tight=True)


def sweep_page(report: SweepReport) -> str:
    """The sweep's page: the chart of verified speedups and a table of every kernel, then the drafted specs
    and the problems."""
    esc = html.escape
    accepted = speedups(report.outcomes)
    kept = len(report.outcomes) - report.ran
    if report.dry_run:
        listed = sum(o.candidates for o in report.outcomes)
        parts = [f"<h1>kernel-lsp sweep (dry run): {len(report.outcomes)} kernels, {listed} candidates listed</h1>",
                 f"<p class=\"note\">engine {esc(report.engine)}; nothing verified; {report.ran} listed in this run, "
                 f"{kept} kept from before; {report.wall_s:.1f} s.</p>"]
    else:
        parts = [f"<h1>kernel-lsp sweep: {len(report.outcomes)} kernels, {len(accepted)} faster</h1>",
                 f"<p class=\"note\">engine {esc(report.engine)}; {report.ran} optimized in this run, "
                 f"{kept} kept from before; {report.wall_s:.1f} s.</p>"]
        if accepted:
            parts.append(f"<figure id=\"speedups\">{speedups_svg(accepted)}</figure>")
        else:
            parts.append("<p class=\"note\">No verified speedup yet.</p>")
    by_key = {f"{o.rel}:{o.kernel}": o for o in report.outcomes}
    body = ""
    for kernel, status, technique, speed, tried in outcome_rows(report.outcomes):
        outcome = by_key[kernel]
        patch = (f"<a href=\"patches/{esc(patch_name(outcome))}\">patch</a>"
                 if status == "accepted" and outcome.patch else "")
        body += (f"<tr><td><code>{esc(kernel)}</code></td><td class=\"{'accepted' if status == 'accepted' else ''}\">"
                 f"{esc(status)}</td><td>{esc(technique)}</td><td>{esc(speed)}</td><td>{esc(tried)}</td>"
                 f"<td>{esc(outcome.gpu or '')}</td><td>{outcome.wall_s:.1f} s</td><td>{patch}</td></tr>")
    parts.append("<h2>Kernels</h2><table><tr><th>kernel</th><th>outcome</th><th>technique</th><th>speedup</th>"
                 f"<th>verified / candidates</th><th>GPU</th><th>wall</th><th></th></tr>{body}</table>")
    if report.drafts:
        items = "".join(f"<li><code>{esc(d.path)}:{esc(d.kernel)}</code>: {esc(' | '.join(d.todo) or 'complete')}"
                        f"{' (draft: ' + esc(d.draft_path) + ')' if d.draft_path else ''}</li>" for d in report.drafts)
        parts.append(f"<h2>Kernels without a launch spec (drafted)</h2><ul>{items}</ul>")
    if report.problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(f"<li>{esc(p)}</li>" for p in report.problems) + "</ul>")
    return html_page("kernel-lsp sweep", "\n".join(parts))
