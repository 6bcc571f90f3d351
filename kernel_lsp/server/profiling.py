"""Background profiling in the editor: hover, hot-line hints, regression warnings, launch-spec drafts.

* On save (``profileOnSave``) and when a watched file changes outside the editor
  (``watchFiles``), every kernel with a launch spec (sidecar
  ``<file>.<kernel>.spec.json`` or in-source) — or every kernel, when
  ``profileProgram`` names the project's binary — gets a ``profile`` job: keyed
  by document and kernel, debounced, cancelled by a newer save, with
  ``$/progress``; the profiler service holds one GPU lock, so one profile runs at
  a time.
* Hover on a kernel: the profile summary, bottleneck with evidence, ncu's top
  advice. Hover on a line inside a profiled kernel: that line's counters.
* Diagnostics: hints on the three hottest lines of each kernel; a warning when a
  save made a kernel slower than its previous profile beyond the measured noise;
  a hint on kernels without a launch spec; a warning on an unfinished spec.
* Code action "Create launch spec for <kernel> (N values to fill in)" (N: the
  draft's ``FILL_ME`` placeholders) runs a command that writes the sidecar
  drafted by :mod:`kernel_lsp.core.spec_draft` beside the file (visible, easy
  to commit, found again by name), asks the editor to open it
  (``window/showDocument``) and publishes the ``.cu``'s diagnostics again at
  once: its "create a launch spec" hint gives way to "unfinished spec" without
  a save. Sidecars are watched (``workspace/didChangeWatchedFiles``, registered
  when the client can): filling one in updates the ``.cu``'s diagnostics when
  it is saved.
* Without ncu (or a GPU), the first failure is shown once; the last good
  profile stays visible, marked stale. Once the machine is known
  (:mod:`kernel_lsp.server.machine`) and cannot profile, no profile is
  scheduled and no kernel is told to get a launch spec "to enable profiling".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs
from lsprotocol import types

from kernel_lsp.core.classify import classify
from kernel_lsp.core.index import Function, KernelIndex, build_index
from kernel_lsp.core.profile import KernelProfile
from kernel_lsp.core.profile_render import hot_line_message, kernel_markdown, line_markdown, regression_message
from kernel_lsp.core.spec_draft import PLACEHOLDER, draft_spec, placeholder_count
from kernel_lsp.server import code_actions
from kernel_lsp.server.base import KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import line_range, to_range
from kernel_lsp.server.documents import DocumentState, uri_to_path
from kernel_lsp.services import gpu_worker
from kernel_lsp.services import profiler as prof
from kernel_lsp.services.jobs import JobKey
from kernel_lsp.services.spec_files import write_new_spec
from kernel_lsp.services.watch import SourceWatcher

log = logging.getLogger(__name__)

SOURCE = "kernel-lsp profile"
#: Quiet time after a save (or a burst of file events) before profiling starts, seconds. Short: with the
#: GPU worker a profile takes well under a second, and the save-to-hover budget is 1.5 s.
PROFILE_DEBOUNCE_S = 0.25
#: Hot lines marked per kernel.
HOT_LINES = 3


@dataclass
class ProfilingState:
    store: prof.ProfileStore
    results: dict[tuple[str, str], prof.ProfileResult] = field(default_factory=dict)
    """(absolute file path, kernel) -> latest result (or the stored last good profile)."""
    profiler: prof.Profiler | None = None
    profiler_settings: object = None
    watcher: object = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: gpu_worker.GpuWorker | None = None
    """The server's GPU worker (CUPTI profiles), started once the machine is known to have a GPU and pycuda
    (:func:`start_worker`), else on the first profile; None when disabled."""


_STATES: "weakref.WeakKeyDictionary[ServerState, ProfilingState]" = weakref.WeakKeyDictionary()


def store_folder(state: ServerState) -> str:
    if state.settings.profile_store:
        return state.settings.profile_store
    return os.path.join(platformdirs.user_cache_dir("kernel-lsp"), "profiles")


def pstate(state: ServerState) -> ProfilingState:
    ps = _STATES.get(state)
    folder = store_folder(state)
    if ps is None or ps.store.folder != folder:
        ps = ProfilingState(prof.ProfileStore(folder))
        _STATES[state] = ps
    return ps


def profiler_for(state: ServerState) -> prof.Profiler:
    """The profiler for the current settings (rebuilt when they change). Raises TreeError/OSError."""
    ps = pstate(state)
    with ps.lock:
        _make_worker(ps)
        if ps.profiler is None or ps.profiler_settings != state.settings:
            ps.profiler = prof.Profiler(state.settings, ps.store, flags=state.session().build_flags, worker=ps.worker)
            ps.profiler_settings = state.settings
        return ps.profiler


def _make_worker(ps: ProfilingState) -> gpu_worker.GpuWorker | None:
    """The state's GPU worker handle, made once (``KERNEL_LSP_GPU_WORKER=0``: none, every profile by ncu)."""
    if ps.worker is None and os.environ.get("KERNEL_LSP_GPU_WORKER", "1") != "0":
        ps.worker = gpu_worker.GpuWorker()
    return ps.worker


def worker_may_start(state: ServerState) -> bool:
    """The machine has what the GPU worker needs (a GPU and pycuda) and saves profile."""
    machine = state.machine
    return (machine is not None and machine.gpu is not None and machine.pycuda and state.settings.profile_on_save
            and os.environ.get("KERNEL_LSP_GPU_WORKER", "1") != "0")


def start_worker(state: ServerState) -> None:
    """Start the GPU worker now, off the event loop, where it may run (``state.on_machine``): its start
    (Python, pycuda, a CUDA context, CUPTI: about 2 s) must not fall on the first save, whose profile
    should show within 1.5 s. Then the inputs of every open file's specs are made ahead of their profiles."""
    if not worker_may_start(state) or state.loop is None:
        return
    ps = pstate(state)
    with ps.lock:
        worker = _make_worker(ps)
    if worker is None:
        return

    def start() -> None:
        try:
            info = worker.ensure()
            log.info("GPU worker ready on %s in %.2f s (CUPTI %s)", info.device, info.startup_s,
                     "usable" if info.cupti_ok else f"unusable: {info.cupti_error}")
        except gpu_worker.WorkerError as exc:
            log.info("GPU worker not started: %s (profiles use ncu)", exc)

    state.loop.run_in_executor(None, start)
    for doc in state.documents.all():
        prepare_inputs(state, doc)


def prepare_inputs(state: ServerState, doc: DocumentState) -> None:
    """Have the GPU worker make the inputs of every kernel of ``doc`` that has a spec, in one job off the event
    loop (the index of a big document is built there too); a newer open or save of the file replaces it."""
    if doc.path is None or not worker_may_start(state):
        return
    path, text = doc.path, doc.text()

    def work(ctx) -> list[str]:
        problems = []
        for function in doc.index().kernels:
            if ctx.cancelled:
                break
            spec_path, spec_data, problem = prof.find_spec(path, text, function.name)
            if problem or (spec_path is None and spec_data is None) or (spec_path and PLACEHOLDER in _read(spec_path)):
                continue
            target = prof.Target(source_path=path, source_text=text, kernel=function.name, spec_path=spec_path,
                                 spec_data=spec_data)
            problem = profiler_for(state).prepare_inputs(target)
            if problem:
                problems.append(f"{function.name}: {problem}")
        return problems

    def done(problems: list[str]) -> None:
        for problem in problems:
            log.info("inputs not prepared for %s", problem)

    state.jobs.submit(JobKey(doc.uri, "prepare"), work, publish=done)


def result_for(state: ServerState, path: str, kernel: str) -> prof.ProfileResult | None:
    """The latest result, or the last good profile from the store (shown stale-free until a run fails)."""
    ps = pstate(state)
    key = (os.path.abspath(path), kernel)
    if key not in ps.results:
        stored = ps.store.last_good(path, kernel)
        if stored is None:
            return None
        ps.results[key] = prof.ProfileResult(stored, classify(stored.metrics), None, cached=True)
    return ps.results[key]


# --------------------------------------------------------------------------- jobs


def has_launch(state: ServerState, path: str, text: str, kernel: str) -> bool:
    spec_path, spec_data, _ = prof.find_spec(path, text, kernel)
    return spec_path is not None or spec_data is not None or bool(state.settings.profile_program)


def schedule_profiles(state: ServerState, uri: str, path: str, text: str, index: KernelIndex, version: int | None) -> int:
    """Queue a profile job for every kernel of the file that can be launched; returns how many."""
    count = 0
    for function in index.kernels:
        spec_path, spec_data, problem = prof.find_spec(path, text, function.name)
        if problem or (spec_path is None and spec_data is None and not state.settings.profile_program):
            continue
        if spec_path is not None and PLACEHOLDER in _read(spec_path):
            continue
        target = prof.Target(
            source_path=path, source_text=text, kernel=function.name, spec_path=spec_path, spec_data=spec_data,
            program=state.settings.profile_program, program_args=state.settings.profile_args,
            cwd=state.workspace_root,
        )
        _submit(state, uri, target, version)
        count += 1
    return count


def _submit(state: ServerState, uri: str, target: prof.Target, version: int | None) -> None:
    def work(ctx) -> prof.ProfileResult:
        try:
            profiler = profiler_for(state)
        except (OSError, ValueError) as exc:
            return prof.ProfileResult(None, None, None, message=f"profiling tree unusable: {exc}")
        result = profiler.profile(target, cancel=ctx.cancel, report=lambda message: ctx.report(message))
        if not ctx.cancelled:
            # Kept even when the document changed meanwhile: the profile describes the saved file.
            pstate(state).results[(os.path.abspath(target.source_path), target.kernel)] = result
        return result

    def current_version() -> int | None:
        doc = state.documents.get(uri)
        return doc.version if doc is not None else version

    def publish(result: prof.ProfileResult) -> None:
        if result.message:
            kind = "ncu" if "was not found" in result.message else result.message[:60]
            state.show(f"kernel-lsp: profiling {target.kernel}: {result.message}", types.MessageType.Warning,
                       once_key=f"profile:{kind}")
        doc = state.documents.get(uri)
        if doc is not None:
            state.publish_diagnostics(doc)
        state.refresh_views()

    state.jobs.submit(
        JobKey(uri, "profile", target.kernel),
        work,
        publish=publish,
        version=version,
        current_version=current_version,
        delay_s=PROFILE_DEBOUNCE_S,
        title=f"Profiling {target.kernel}",
        progress=state.progress_factory(),
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def can_profile(state: ServerState) -> bool:
    """False once the machine is known to lack a GPU or ncu (unknown yet: try, and fail once visibly)."""
    return state.machine is None or state.machine.can_profile


def on_save(state: ServerState, doc: DocumentState) -> None:
    if not state.settings.profile_on_save or doc.path is None or not can_profile(state):
        return
    path, text, version = doc.path, doc.text(), doc.version
    index = doc.index()
    completion = doc.complete_soon() if index.pending else None
    if completion is None:
        schedule_profiles(state, doc.uri, path, text, index, version)
        return

    # The kernels that macros define are known once the index is complete (on a worker thread).
    def completed(_future) -> None:
        if state.documents.get(doc.uri) is doc and doc.version == version:
            schedule_profiles(state, doc.uri, path, text, doc.index(), version)

    completion.add_done_callback(completed)


def on_file_changed(state: ServerState, path: str) -> None:
    """A watched file changed on disk (event loop)."""
    uri = Path(path).as_uri()
    doc = state.documents.get(uri)
    if doc is not None or not can_profile(state):
        return  # open in the editor: its saves drive profiling
    text = _read(path)
    if text:
        schedule_profiles(state, uri, path, text, build_index(text), None)


def on_settings(state: ServerState) -> None:
    ps = pstate(state)
    wanted = state.settings.watch_files and state.settings.profile_on_save and state.workspace_root
    if wanted and ps.watcher is None:
        def changed(path: str) -> None:
            try:
                state.post(lambda: on_file_changed(state, path))
            except RuntimeError:
                pass  # the loop is gone: shutting down

        ps.watcher = SourceWatcher.start(state.workspace_root, changed)
    elif not wanted and ps.watcher is not None:
        ps.watcher.stop()
        ps.watcher = None


# --------------------------------------------------------------------------- views


def _profile_lines(profile: KernelProfile, doc: DocumentState, function: Function):
    if profile.source_file and doc.path and os.path.basename(profile.source_file) != os.path.basename(doc.path):
        return []
    first, last = function.span.start.line + 1, function.span.end.line + 1
    return [c for c in profile.hottest_lines(len(profile.lines)) if first <= c.line <= last]


def profile_diagnostics(state: ServerState, doc: DocumentState) -> list[types.Diagnostic]:
    if doc.path is None:
        return []
    # Only from an index that already exists or is cheap: publishing runs on the event loop.
    index = doc.cached("index")
    if index is None and not doc.big and not doc.lock.locked():
        index = doc.index()
    if index is None:
        return []
    out: list[types.Diagnostic] = []
    text = None
    for function in index.kernels:
        name_range = to_range(doc.parsed, function.name_span)
        result = result_for(state, doc.path, function.name)
        if result is not None and result.profile is not None:
            profile = result.profile
            if result.regression is not None:
                out.append(types.Diagnostic(range=name_range, message=regression_message(function.name, result.regression),
                                            severity=types.DiagnosticSeverity.Warning, source=SOURCE, code="slower"))
            for counters in _profile_lines(profile, doc, function)[:HOT_LINES]:
                out.append(types.Diagnostic(range=line_range(doc.parsed, counters.line - 1),
                                            message=hot_line_message(counters, profile),
                                            severity=types.DiagnosticSeverity.Hint, source=SOURCE, code="hot-line"))
            continue
        text = text if text is not None else doc.text()
        sidecar = prof.sidecar_path(doc.path, function.name)
        if os.path.isfile(sidecar) and PLACEHOLDER in _read(sidecar):
            out.append(types.Diagnostic(
                range=name_range, severity=types.DiagnosticSeverity.Warning, source=SOURCE, code="spec-incomplete",
                message=f"launch spec {os.path.basename(sidecar)} is unfinished: replace every {PLACEHOLDER} "
                        f"({_todo(sidecar)})"))
        elif state.machine is not None and state.machine.can_profile and not has_launch(state, doc.path, text, function.name):
            out.append(types.Diagnostic(
                range=name_range, severity=types.DiagnosticSeverity.Hint, source=SOURCE, code="no-spec",
                message=f"Create a launch spec to enable profiling (code action \"Create launch spec for {function.name}\")"))
    return out


def _todo(sidecar: str) -> str:
    try:
        data = json.loads(_read(sidecar))
    except json.JSONDecodeError:
        return "the file is not valid JSON"
    comment = data.get("comment") if isinstance(data, dict) else None
    return comment if isinstance(comment, str) else "see the file"


def kernel_hover(ctx) -> str | None:
    fn = ctx.function
    if fn is None or not fn.is_kernel or ctx.doc.path is None:
        return None
    result = result_for(ctx.state, ctx.doc.path, fn.name)
    if result is None or result.profile is None:
        return None
    return kernel_markdown(result.profile, result.bottleneck, result.message)


def line_hover(state: ServerState, doc: DocumentState, index: KernelIndex, line: int) -> str | None:
    """Markdown for a 0-based line inside a profiled kernel, or None."""
    if doc.path is None:
        return None
    function = index.function_at(line, 0)
    if function is None or not function.is_kernel:
        return None
    result = result_for(state, doc.path, function.name)
    if result is None or result.profile is None:
        return None
    counters = result.profile.lines.get(line + 1)
    if counters is None or not counters.samples_total and not counters.stall_samples:
        return None
    return line_markdown(counters, result.profile)


# --------------------------------------------------------------------------- code action


def spec_actions(ctx) -> list[types.Command]:
    doc = ctx.doc
    if doc.path is None:
        return []
    kernels = [ctx.function] if ctx.function is not None and ctx.function.is_kernel else []
    launch = ctx.index.launch_at(ctx.start.line, ctx.start.column_byte)
    if launch is not None:
        kernels += [f for f in ctx.index.kernels if f.name == launch.kernel.rsplit("::", 1)[-1] and f not in kernels]
    actions = []
    for function in kernels:
        sidecar = prof.sidecar_path(doc.path, function.name)
        if os.path.exists(sidecar):
            continue
        actions.append(create_spec_action(ctx.state, doc, ctx.index, function.name, sidecar))
    return actions


CREATE_SPEC_COMMAND = "kernelLsp.createLaunchSpec"
#: How long the command waits for the client to open the written sidecar, in seconds.
SHOW_DOCUMENT_TIMEOUT_S = 10.0
#: Glob of the sidecars the client is asked to watch.
SPEC_GLOB = "**/*.spec.json"


def spec_text(state: ServerState, doc: DocumentState, index: KernelIndex, kernel: str) -> tuple[str, int, int]:
    """(the drafted sidecar's JSON, placeholders left, notes to check)."""
    # The session's preprocessed view and analysis: sizes from local headers, roles through macros.
    analysis = state.file_analysis(doc)
    draft = draft_spec(index, doc.text(), kernel, analysis.preprocessed if analysis else None,
                       analysis.kernels.get(kernel) if analysis else None)
    data = dict(draft.spec)
    if draft.todo:
        data["comment"] = "Fill in: " + " | ".join(draft.todo)
    placeholders = placeholder_count(draft.spec)
    return json.dumps(data, indent=2) + "\n", placeholders, len(draft.todo) - placeholders


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def create_spec_action(state: ServerState, doc: DocumentState, index: KernelIndex, kernel: str, sidecar: str) -> types.Command:
    _, placeholders, notes = spec_text(state, doc, index, kernel)
    title = f"Create launch spec for {kernel}"
    if placeholders:
        title += f" ({_plural(placeholders, 'value')} to fill in)"
    elif notes > 0:
        title += f" ({_plural(notes, 'note')} to check)"
    # A bare Command, as "Optimize" is: lsprotocol-based clients read a code action that carries a
    # command as a Command anyway (see optimize_actions.kernel_actions).
    return types.Command(title=title, command=CREATE_SPEC_COMMAND, arguments=[doc.uri, kernel])


async def create_spec(state: ServerState, uri: str, kernel: str) -> str | None:
    """Write the sidecar, open it in the editor, re-publish the .cu; returns the sidecar's URI (None: not written)."""
    doc = state.documents.get(uri)
    if doc is None or doc.path is None:
        state.show(f"kernel-lsp: cannot create a launch spec: {uri} is not an open file", types.MessageType.Warning)
        return None
    index = await doc.index_async()
    if index.function(kernel) is None or not index.function(kernel).is_kernel:
        state.show(f"kernel-lsp: no kernel named {kernel} in {os.path.basename(doc.path)}", types.MessageType.Warning)
        return None
    sidecar = prof.sidecar_path(doc.path, kernel)
    text, placeholders, _ = spec_text(state, doc, index, kernel)
    problem = write_new_spec(sidecar, text)
    if problem is not None:
        state.show(f"kernel-lsp: {problem}", types.MessageType.Warning)
        return None
    spec_uri = Path(sidecar).as_uri()
    state.publish_diagnostics(doc)
    todo = f": replace the {_plural(placeholders, PLACEHOLDER + ' value')}" if placeholders else ""
    shown = False
    if state.supports_show_document:
        try:
            # Bounded: the command answers even if the client never replies.
            result = await asyncio.wait_for(state.server.window_show_document_async(
                types.ShowDocumentParams(uri=spec_uri, take_focus=True)), SHOW_DOCUMENT_TIMEOUT_S)
            shown = bool(isinstance(result, types.ShowDocumentResult) and result.success)
        except Exception as exc:  # a failed, malformed or missing reply: the message below still says where it is
            log.warning("window/showDocument for %s failed: %s", spec_uri, type(exc).__name__ if not str(exc) else exc)
    state.show(f"kernel-lsp: wrote {os.path.basename(sidecar)}{todo}" + ("" if shown else f" ({sidecar})"),
               types.MessageType.Info)
    return spec_uri


def on_watched_files(state: ServerState, params: types.DidChangeWatchedFilesParams) -> None:
    """A sidecar changed on disk: the diagnostics of the .cu it belongs to say so at once."""
    changed = {uri_path for change in params.changes if (uri_path := _spec_source(change.uri)) is not None}
    for doc in state.documents.all():
        if doc.path is not None and os.path.abspath(doc.path) in changed:
            state.publish_diagnostics(doc)


def _spec_source(uri: str) -> str | None:
    """``/a/k.cu`` for ``file:///a/k.cu.kern.spec.json``; None for other files."""
    path = uri_to_path(uri)
    if path is None or not path.endswith(".spec.json"):
        return None
    stem = path[: -len(".spec.json")]
    source, dot, _ = stem.rpartition(".")
    return os.path.abspath(source) if dot else None


async def watch_specs(state: ServerState) -> None:
    """Ask the client to report changes of sidecars (when it can be asked)."""
    if not state.supports_watched_files_registration:
        return
    options = types.DidChangeWatchedFilesRegistrationOptions(watchers=[types.FileSystemWatcher(glob_pattern=SPEC_GLOB)])
    try:
        await state.server.client_register_capability_async(types.RegistrationParams(registrations=[types.Registration(
            id="kernel-lsp-spec-files", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES, register_options=options)]))
    except Exception as exc:  # the client refused: sidecars are still read on every publication
        log.info("client/registerCapability for spec files failed: %s", exc)


def _on_initialized(state: ServerState) -> None:
    task = asyncio.ensure_future(watch_specs(state))
    state.background_tasks.add(task)
    task.add_done_callback(state.background_tasks.discard)


def register(server: KernelLspServer) -> None:
    state = server.state
    state.on_save.append(on_save)
    state.on_settings.append(on_settings)
    state.diagnostic_sources.append(profile_diagnostics)
    state.hover_sections.append(kernel_hover)
    state.line_hovers.append(line_hover)
    state.on_initialized.append(_on_initialized)
    state.on_machine.append(start_worker)
    state.on_open.append(prepare_inputs)
    code_actions.providers(state).append(spec_actions)

    @server.command(CREATE_SPEC_COMMAND)
    @guarded(state, what=CREATE_SPEC_COMMAND)
    async def create_spec_command(uri: str, kernel: str) -> str | None:
        return await create_spec(state, uri, kernel)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    @guarded(state, what="didChangeWatchedFiles")
    def did_change_watched_files(params: types.DidChangeWatchedFilesParams) -> None:
        on_watched_files(state, params)
