"""The optimize session: one place that wires the services for a file, used by the server and the CLI alike.

Like rust-analyzer's ``AnalysisHost``, a :class:`Session` holds the inputs
(settings, workspace root, the compile database cache, where the knowledge base
and trace store live) and answers everything that must agree between callers:

* :meth:`Session.build_flags` — the nvcc flags of a file, for every nvcc run
  (diagnostics, ``kernel-lsp check``, the verifier, the profiler's build, the
  model's compile tool): the compile database, include paths, ``extraFlags``;
* :meth:`Session.macro_view` — the file's preprocessed macro view (its own macros
  and local headers expanded with the build flags' ``-I`` folders and ``-D``
  macros), whose macro table launch sizes and spec drafts read;
* :meth:`Session.resolve_spec` — a kernel's launch spec: ``--spec`` when given,
  else the sidecar ``<file>.<kernel>.spec.json``, else the in-source comment;
  one whose parameters do not fit the kernel's is refused there
  (:func:`spec_problem`), for every command and the editor alike;
* :meth:`Session.verify_options` — the verifier's options, built from the
  settings and the file's build flags (so the editor's verification compiles as
  its diagnostics do);
* :meth:`Session.stores` — the knowledge base and trace store, opened for one
  search and closed after it;
* :meth:`Session.optimize` — one search wired from all of the above.

A session is cheap: the server makes one from its current state per request
(:meth:`kernel_lsp.server.base.ServerState.session`), the CLI one per command.
What must outlive a request (the compile database's cache, a loaded model) is
passed in by its owner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.core.index import KernelIndex, build_index
from kernel_lsp.core.parse import comment_ranges
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.source import Preprocessed, directive_lines, preprocess
from kernel_lsp.core.spec import Spec, SpecError, find_inline_specs, parse_spec
from kernel_lsp.core.static_check import alias_resolver, spec_mismatch
from kernel_lsp.services import optimizer
from kernel_lsp.services.compile_db import CompileDb
from kernel_lsp.services.harness import VerifyOptions, load_spec_file
from kernel_lsp.services.harness.specfile import with_files_checked
from kernel_lsp.services.profiler import find_spec, sidecar_path
from kernel_lsp.services.source_view import FileAnalysis, analyze_source, full_view_budget, header_reader, timed_budget
from kernel_lsp.services.toolchain import BuildFlags, CompileResult, build_flags, compile_source

#: The local model serves one conversation at a time: searches that use it take turns (per process).
MODEL_LOCK = threading.Lock()
#: Macro views kept (per process): one per file and flag set being edited.
_MACRO_VIEWS_KEPT = 32
_MACRO_VIEWS: "OrderedDict[tuple[Any, ...], tuple[Preprocessed, tuple[tuple[str, Any], ...]]]" = OrderedDict()
_MACRO_VIEWS_LOCK = threading.Lock()


def include_dirs(flags: BuildFlags) -> tuple[str, ...]:
    """The ``-I`` folders of a command line, in order (``-I dir``, ``-Idir``, ``--include-path``)."""
    out: list[str] = []
    items = flags.flags
    for i, flag in enumerate(items):
        if flag in ("-I", "--include-path", "-isystem") and i + 1 < len(items):
            out.append(items[i + 1])
        elif flag.startswith("--include-path="):
            out.append(flag.split("=", 1)[1])
        elif flag.startswith("-I") and len(flag) > 2:
            out.append(flag[2:])
        elif flag.startswith("-isystem") and len(flag) > len("-isystem"):
            out.append(flag[len("-isystem"):])
    return tuple(dict.fromkeys(out))


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


@dataclass(frozen=True)
class SpecLookup:
    """Where a kernel's launch spec came from, the spec itself, or why there is none."""

    spec: Spec | None
    """The parsed spec; None when there is none or it is invalid (see ``problem``)."""
    origin: str | None
    """``--spec``, ``sidecar`` or ``in-source``; None when nothing was found."""
    spec_path: str | None = None
    """The file it was read from (``--spec`` or the sidecar); None for an in-source spec."""
    data: dict | None = None
    """The in-source spec's JSON object (the profiler takes it as is)."""
    problem: str | None = None
    """Why there is no spec, for the user."""
    warnings: tuple[str, ...] = ()
    """Element types of the spec that the kernel's C types may not hold (the spec is still used)."""


def spec_problem(spec: Spec, index: KernelIndex, text: str) -> str | None:
    """Why ``spec`` cannot launch its kernel as ``index`` (of ``text``) defines it (another parameter count, an
    array for a scalar, types read through the file's aliases), or None. A kernel the index does not see (defined through a macro) is not judged here: the
    verifier's signature check reads the compiled file."""
    kernels = [f for f in index.kernels if f.name == spec.kernel]
    if not kernels:
        return None
    resolve = alias_resolver(text)
    problems = [spec_mismatch(spec, fn, resolve)[0] for fn in kernels]
    if all(problems):
        return f"the launch spec does not fit '{spec.kernel}': " + "; ".join(problems[0])
    return None


def spec_warnings(spec: Spec, index: KernelIndex, text: str,
                  macros: Callable[[], Mapping[str, str]] | None = None) -> tuple[str, ...]:
    """Element types of ``spec`` that its kernel's C types may not hold, read through the file's aliases and, where
    that leaves a mismatch, its object-like macros (``macros``, asked for only then: ``#define fp double``)."""
    kernel = next((f for f in index.kernels if f.name == spec.kernel), None)
    if kernel is None:
        return ()
    _, warnings = spec_mismatch(spec, kernel, alias_resolver(text))
    if warnings and macros is not None:
        _, warnings = spec_mismatch(spec, kernel, alias_resolver(text, macros()))
    return tuple(warnings)


def resolve_spec(path: str, text: str, kernel: str | None, explicit: str | None = None, *,
                 index: KernelIndex | None = None, macros: Callable[[], Mapping[str, str]] | None = None) -> SpecLookup:
    """The launch spec of ``kernel`` in the file at ``path`` whose text is ``text``.

    ``explicit`` (a path, the CLI's ``--spec``) wins; else the sidecar
    ``<file>.<kernel>.spec.json``; else the in-source ``// kernel-lsp: spec``
    comment of that kernel. With ``kernel`` None the file must hold exactly one
    in-source spec (or ``explicit`` names the spec). A spec that does not fit
    the kernel (:func:`spec_problem`, against ``index`` or the text's own) is
    refused with the reason; element types it may not hold are its ``warnings`` (``macros``: the file's
    object-like macros, asked for where a type still does not match).
    """
    found = _lookup(path, text, kernel, explicit)
    if found.spec is None:
        return found
    index = index if index is not None else build_index(text)
    problem = spec_problem(found.spec, index, text)
    if problem:
        return dataclasses.replace(found, spec=None, problem=problem)
    return dataclasses.replace(found, warnings=spec_warnings(found.spec, index, text, macros))


def _lookup(path: str, text: str, kernel: str | None, explicit: str | None) -> SpecLookup:
    def load(file: str, origin: str) -> SpecLookup:
        try:
            return SpecLookup(load_spec_file(file), origin, spec_path=file)
        except SpecError as exc:
            return SpecLookup(None, origin, spec_path=file, problem=f"the launch spec {file} is invalid: {exc}")

    if explicit:
        return load(explicit, "--spec")
    if kernel is not None:
        # The profiler's look-up: the same sidecar-then-comment order wherever a spec is needed.
        sidecar, data, error = find_spec(path, text, kernel)
        if sidecar is not None:
            return load(sidecar, "sidecar")
        return _inline(path, data, error, f"no launch spec for {kernel}: use the code action "
                                          f"'Create launch spec for {kernel}' first (or write {sidecar_path(path, kernel)})")
    found = find_inline_specs(text)
    if len(found) > 1:
        names = ", ".join(str(s.kernel) for s in found)
        return SpecLookup(None, None, problem=f"the file has in-source specs for {names}; name the kernel")
    return _inline(path, found[0].data if found else None, found[0].error if found else None,
                   "no launch spec: --spec not given, and no single sidecar or in-source spec "
                   "('// kernel-lsp: spec {...}' above the kernel) found")


def _inline(path: str, data: dict | None, error: str | None, missing: str) -> SpecLookup:
    if error:
        return SpecLookup(None, "in-source", data=data, problem=f"the launch spec is invalid: {error}")
    if data is None:
        return SpecLookup(None, None, problem=missing)
    try:
        spec = with_files_checked(parse_spec(data, os.path.dirname(os.path.abspath(path))))
    except SpecError as exc:
        return SpecLookup(None, "in-source", data=data, problem=f"the launch spec is invalid: {exc}")
    return SpecLookup(spec, "in-source", data=data)


@dataclass(frozen=True)
class Stores:
    """The knowledge base and trace store of one search (either None when not used or unavailable)."""

    kb: Any
    traces: Any
    messages: tuple[str, ...]
    """What the user should hear about them (unavailable, a corrupt file moved aside)."""


@dataclass(frozen=True)
class Session:
    settings: Settings = dataclasses.field(default_factory=Settings)
    workspace_root: str | None = None
    compile_db: CompileDb | None = None
    """The server's long-lived database cache; None: a fresh one (the CLI reads each database once anyway)."""
    kb_path: str | None = None
    """The knowledge base (a SQLite file or a ``postgresql://`` URL); None: :attr:`kb_target`'s settings."""
    use_kb: bool = True
    traces_path: str | None = None
    """The trace store; None: the per-user one."""
    keep_traces: bool = False
    """Record every verdict in the trace store even without a model (the CLI's ``--traces``)."""
    buffers: Mapping[str, str] | None = None
    """Open editor buffers by path: a header being edited is read from its buffer, not the disk."""
    give_way: Callable[[], None] | None = None
    """The preprocessor's yield point (the server's: background work pauses while its loop is busy)."""

    # --- build flags ---------------------------------------------------------------

    def build_flags(self, path: str) -> BuildFlags:
        """The nvcc flags of every compile of ``path`` (see :func:`kernel_lsp.services.toolchain.build_flags`)."""
        return build_flags(self.settings, path, workspace_root=self.workspace_root, compile_db=self.compile_db)

    def compile(self, source: str | bytes, path: str, *, cancel: threading.Event | None = None) -> CompileResult:
        """Diagnostics and resources: ``source`` compiled as the file at ``path``."""
        return compile_source(source, path, flags=self.build_flags(path), cancel=cancel)

    # --- the preprocessed view -------------------------------------------------

    def macro_view(self, path: str | None, text: str | None = None, *,
                   directives: Sequence[str] | None = None, cached_only: bool = False) -> Preprocessed | None:
        """The macro view of the file at ``path`` whose text is ``text``: its directives (own and local
        headers') expanded with the build flags' ``-I`` folders and ``-D`` macros, so
        :meth:`~kernel_lsp.core.source.Preprocessed.object_macros` is the table the compiler ends with.
        ``directives``: the text's :func:`~kernel_lsp.core.source.directive_lines` instead of the text
        (an editor's document has them from its tree).

        Only the directive lines are preprocessed, so the view's lines are theirs, not the file's: it is
        read for its macro table. Reused while the directives, the flags and the headers' modification
        times are unchanged: hover, code lens and inlay hints ask after every edit. ``cached_only``: None
        instead of running the preprocessor (the server's event loop never runs it). The run has
        :func:`~kernel_lsp.services.source_view.timed_budget`; over it, the view has no macros and says why.
        """
        if directives is None:
            data = (text or "").encode("utf-8", errors="replace")
            directives = directive_lines(data, comment_ranges(data))
        flags = self.build_flags(path) if path else BuildFlags(flags=())
        dirs = include_dirs(flags)
        defines = flags.defines
        absolute = os.path.abspath(path) if path else None
        if not directives and not defines:
            # Nothing to expand: no preprocessor run, and nothing to wait for.
            return Preprocessed(text="", path=absolute or "/<buffer>", origins=())
        key = (path, tuple(directives), dirs, tuple(sorted(defines.items())))
        with _MACRO_VIEWS_LOCK:
            hit = _MACRO_VIEWS.get(key)
            if hit is not None and all(self._stamp(header) == stamp for header, stamp in hit[1]):
                _MACRO_VIEWS.move_to_end(key)
                return hit[0]
        if cached_only:
            return None
        reader = header_reader(self._header_dirs(absolute, dirs), self.buffers)
        view = preprocess("".join(line + "\n" for line in directives), absolute, reader, dirs, defines,
                          timed_budget(give_way=self.give_way))
        stamps = tuple((header, self._stamp(header)) for header in view.includes)
        with _MACRO_VIEWS_LOCK:
            _MACRO_VIEWS[key] = (view, stamps)
            while len(_MACRO_VIEWS) > _MACRO_VIEWS_KEPT:
                _MACRO_VIEWS.popitem(last=False)
        return view

    def index(self, path: str | None, source: str | bytes) -> KernelIndex:
        """The kernel index of the file at ``path`` whose text is ``source``, with the units that macros
        define or fill read from their expansion (the file's macro view): what ``check``, ``report`` and
        the profiler list, the same kernels the editor shows."""
        data = source if isinstance(source, bytes) else source.encode("utf-8", errors="replace")
        return build_index(data, self.macro_view(path, data.decode("utf-8", errors="replace")),
                           timed_budget(give_way=self.give_way))

    def _header_dirs(self, absolute: str | None, dirs: tuple[str, ...]) -> tuple[str, ...]:
        """Where the preprocessor may read headers: the file's folder, its ``-I`` folders, the workspace."""
        return ((os.path.dirname(absolute),) if absolute else ()) + dirs + ((self.workspace_root,) if self.workspace_root else ())

    def _stamp(self, header: str) -> tuple[float | None, int | None]:
        """What decides whether a header changed: its modification time, or its open buffer's text."""
        buffer = self.buffers.get(header) if self.buffers else None
        return _mtime(header), hash(buffer) if buffer is not None else None

    def preprocessed(self, path: str | None, text: str) -> Preprocessed:
        """The full preprocessed view of the file (code included), with the ``-I`` folders and ``-D`` macros
        of its compile: what the rules and the access analysis read."""
        flags = self.build_flags(path) if path else BuildFlags(flags=())
        dirs = include_dirs(flags)
        absolute = os.path.abspath(path) if path else None
        reader = header_reader(self._header_dirs(absolute, dirs), self.buffers)
        return preprocess(text, absolute, reader, dirs, flags.defines, full_view_budget(text, self.give_way))

    def analysis(self, path: str | None, text: str) -> FileAnalysis:
        """The full preprocessed view of the file and every kernel's access analysis, with the same
        ``-I`` folders and ``-D`` macros as its compile (:meth:`build_flags`)."""
        flags = self.build_flags(path) if path else BuildFlags(flags=())
        return analyze_source(text, os.path.abspath(path) if path else None, include_dirs(flags), flags.defines,
                              self.buffers, self.workspace_root, self.give_way)

    # --- specs -------------------------------------------------------------------

    def resolve_spec(self, path: str, text: str, kernel: str | None, explicit: str | None = None, *,
                     index: KernelIndex | None = None) -> SpecLookup:
        return resolve_spec(path, text, kernel, explicit, index=index,
                            macros=lambda: self.preprocessed(path, text).object_macros())

    # --- verification --------------------------------------------------------------

    def verify_options(self, path: str, **overrides: Any) -> VerifyOptions:
        """The verifier's options for the file at ``path``: seeds, minimum speedup and timeout from the
        settings, nvcc and its flags from :meth:`build_flags`; ``overrides`` replace fields (the CLI's)."""
        s = self.settings
        fields: dict[str, Any] = dict(seeds=s.verify_seeds, min_speedup=s.min_speedup, timeout_s=s.verify_timeout_s,
                                      build=self.build_flags(path))
        fields.update(overrides)
        return VerifyOptions(**fields)

    def verifier(self, path: str, **overrides: Any) -> optimizer.Verifier:
        return optimizer.harness_verifier(self.verify_options(path, **overrides))

    # --- knowledge base and traces -------------------------------------------------

    @property
    def kb_target(self) -> str | None:
        """Which knowledge base a search opens: ``kb_path`` when given, else ``kbUrl`` (a team's PostgreSQL),
        else ``kbPath``; None: ``$KERNEL_LSP_KB`` or the per-user file."""
        return self.kb_path or self.settings.kb_url or self.settings.kb_path

    @contextlib.contextmanager
    def stores(self, *, traces: bool) -> Iterator[Stores]:
        """The knowledge base (unless ``use_kb`` is off) and, when ``traces`` or ``keep_traces``, the trace
        store; both are closed when the block ends. A store that cannot be opened is a message, not an error."""
        from kernel_lsp.services.kb import KnowledgeBase
        from kernel_lsp.services.traces import TraceStore

        messages: list[str] = []
        kb = store = None
        if self.use_kb:
            try:
                kb = KnowledgeBase.open(self.kb_target)
                # A corrupt database was moved aside and replaced: the user must hear of it.
                messages.extend(kb.messages)
            except Exception as exc:
                messages.append(f"knowledge base unavailable, continuing without it: {exc}")
        try:
            if traces or self.keep_traces:
                try:
                    store = TraceStore(self.traces_path)
                except Exception as exc:
                    messages.append(f"trace store unavailable, continuing without it: {exc}")
            yield Stores(kb, store, tuple(messages))
        finally:
            if kb is not None:
                kb.close()
            if store is not None:
                store.close()

    # --- the search ----------------------------------------------------------------

    def model_generator(self, model: Any, spec: Spec, source: str, path: str, *, verifier: optimizer.Verifier | None,
                        budget: optimizer.Budget, cancel: threading.Event | None, traces: Any,
                        rules: RuleGenerator | None = None, job_budgets: Any = None, verified: Any = None) -> Any:
        """The model's generator (``modelMode``: the three jobs, which order ``rules``' candidates, or the agent
        loop), its compile tool building with the file's flags; ``verified``: a verified candidate and its
        speedup for the editor to refine."""
        flags = self.build_flags(path)
        mode = "agent" if self.settings.model_mode == "agent" else "jobs"
        return optimizer.model_generator(model, spec, source, verifier=verifier, budget=budget, cancel=cancel,
                                         traces=traces, workspace_root=self.workspace_root or os.path.dirname(os.path.abspath(path)),
                                         flags=flags, mode=mode, rules=rules, job_budgets=job_budgets,
                                         verified=verified)

    def optimize(
        self,
        source: str,
        path: str,
        kernel: str,
        spec: Spec,
        *,
        model: Any = None,
        budget: optimizer.Budget = optimizer.Budget(),
        verify: bool = True,
        verify_overrides: Mapping[str, Any] | None = None,
        profile: Any = None,
        cancel: threading.Event | None = None,
        progress: optimizer.ProgressFn | None = None,
        document_version: int | None = None,
        generators: Sequence[Any] | None = None,
        seed: int = optimizer.DEFAULT_SEED,
        verifier: optimizer.Verifier | None = None,
        already_recorded: Any = None,
    ) -> optimizer.OptimizeResult:
        """One search for ``kernel`` of the file at ``path`` (text ``source``): rules, plus ``model`` when given;
        every candidate verified with :meth:`verify_options`; the stores opened and closed around it.
        ``generators`` replaces the rules and model (tests); ``verifier`` wraps or replaces the harness
        (the sweep's verdict cache around :meth:`verifier`, a scripted one in tests); ``already_recorded``
        names the verdicts that cache replayed (see :func:`kernel_lsp.services.optimizer.optimize`)."""
        verifier = verifier or self.verifier(path, **dict(verify_overrides or {}))
        with self.stores(traces=model is not None) as stores:
            # The rules read the file as the compiler does: local headers' macros expanded with the file's flags.
            pre = self.preprocessed(path, source) if generators is None else None
            chosen: list[Any] = list(generators) if generators is not None else [RuleGenerator(
                preprocessed=pre, reprocess=lambda text: self.preprocessed(path, text))]
            if model is not None and generators is None:
                # Model attempts (and every verdict of the search) become distillation data. The jobs' planner
                # orders the rules' candidates, so its generator takes the rules' place.
                generator = self.model_generator(model, spec, source, path, verifier=verifier if verify else None,
                                                 budget=budget, cancel=cancel, traces=stores.traces, rules=chosen[0])
                chosen = [generator] if getattr(generator, "rules", None) is chosen[0] else [*chosen, generator]
            lock: contextlib.AbstractContextManager[Any] = MODEL_LOCK if model is not None else contextlib.nullcontext()
            with lock:
                result = optimizer.optimize(source, path, kernel, spec, generators=chosen, verifier=verifier, kb=stores.kb,
                                            profile=profile, budget=budget, cancel=cancel, progress=progress,
                                            traces=stores.traces, document_version=document_version, verify=verify,
                                            seed=seed, already_recorded=already_recorded)
        if stores.messages:
            result = dataclasses.replace(result, messages=result.messages + stores.messages)
        return result


def cli_session(overrides: Mapping[str, Any] | None = None, **fields: Any) -> tuple[Session, tuple[str, ...]]:
    """A session for a CLI command: the user's settings file under the command line's ``overrides``
    (camelCase keys), the current folder as the workspace root. Returns it with the settings' problems."""
    from kernel_lsp.config import resolve
    from kernel_lsp.services.user_config import user_config_layer

    settings = resolve(user_config_layer(), ("command line", dict(overrides or {})))
    return Session(settings, workspace_root=os.getcwd(), **fields), settings.problems

