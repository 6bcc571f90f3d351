"""nvcc to a cubin in the verifier's or profiler's folder, and the kernel's (possibly mangled) entry name.

The compile itself is :func:`kernel_lsp.services.toolchain.compile_in` with the
file's :class:`~kernel_lsp.services.toolchain.BuildFlags`: the same command and
the same :class:`~kernel_lsp.services.toolchain.CompileResult` as the editor's
diagnostics. Its entry names come from ptxas's verbose output ("Compiling entry
function '_Z5saxpyifPKfPf' for 'sm_90'"), which lists exactly the kernels of the
cubin, so no cuobjdump or cu++filt is needed. A C++ name is matched by reading
its Itanium-mangled base name (:func:`mangled_base_name`).
"""

from __future__ import annotations

import threading

from kernel_lsp.services.toolchain import BuildFlags, CompileResult, compile_in

__all__ = ["CompileResult", "compile_cubin", "find_entry", "mangled_base_name"]


def mangled_base_name(symbol: str) -> str:
    """The unqualified function name inside an Itanium-mangled symbol (the symbol itself when not mangled)."""
    if not symbol.startswith("_Z"):
        return symbol
    i = 2
    if symbol[i : i + 1] == "L":
        i += 1
    nested = symbol[i : i + 1] == "N"
    if nested:
        i += 1
        while symbol[i : i + 1] in ("r", "V", "K"):
            i += 1
    last = symbol
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while j < len(symbol) and symbol[j].isdigit():
            j += 1
        length = int(symbol[i:j])
        last = symbol[j : j + length]
        i = j + length
        if not nested:
            break
    return last


def find_entry(entries: tuple[str, ...], kernel: str) -> tuple[str | None, str]:
    """(entry name, problem): the entry for ``kernel`` (``ns::name`` or ``name``), or why there is none."""
    if kernel in entries:
        return kernel, ""
    base = kernel.rsplit("::", 1)[-1]
    matches = [e for e in entries if mangled_base_name(e) == base]
    if len(matches) == 1:
        return matches[0], ""
    listed = ", ".join(entries) or "none"
    if not matches:
        return None, f"no kernel named '{kernel}' in the cubin (entries: {listed})"
    return None, f"'{kernel}' is ambiguous in the cubin (overloads or template instances: {', '.join(matches)})"


def compile_cubin(source: str, workdir: str, stem: str, flags: BuildFlags, *,
                  cancel: threading.Event | None = None) -> CompileResult:
    """Write ``source`` to ``workdir/stem.cu`` and compile it to ``workdir/stem.cubin`` (kept for the caller)."""
    return compile_in(source, workdir, f"{stem}.cu", flags, cancel=cancel)
