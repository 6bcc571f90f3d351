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

import struct
import threading

from kernel_lsp.services.toolchain import BuildFlags, CompileResult, compile_in

__all__ = ["CompileResult", "compile_cubin", "device_globals", "find_entry", "mangled_base_name"]


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


def device_globals(cubin: bytes) -> tuple[tuple[str, int], ...]:
    """(symbol, bytes) of every ``__device__``/``__managed__`` variable in a cubin (an ELF64 file).

    They are the data symbols in the ``.nv.global`` sections (``.nv.global.init`` holds the
    initialized ones); ``__constant__`` variables live in ``.nv.constant*`` and cannot be written
    by a kernel. The child snapshots these to see whether a launch changed module state, which no
    parse of the source can promise (stores through pointers, inline PTX). Names are the
    symbols' own (mangled when declared in a namespace), as ``cuModuleGetGlobal`` wants them.
    Empty for anything that is not a readable little-endian ELF64 file.
    """
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        return ()
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(cubin):
        return ()
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def string(table: int, offset: int) -> str:
        start = sections[table][4] + offset
        end = cubin.find(b"\0", start)
        return cubin[start:end].decode("utf-8", "replace")

    names = [string(shstrndx, s[0]) for s in sections]
    found: dict[str, int] = {}
    for sh_name, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2 or entsize < 24:  # SHT_SYMTAB
            continue
        for at in range(offset, offset + size - entsize + 1, entsize):
            st_name, st_info, _, st_shndx, _, st_size = struct.unpack_from("<IBBHQQ", cubin, at)
            if st_info & 0xF != 1 or not 0 < st_shndx < len(sections):  # STT_OBJECT in a real section
                continue
            if names[st_shndx].startswith(".nv.global") and st_size > 0:
                found[string(link, st_name)] = st_size
    return tuple(found.items())


def compile_cubin(source: str, workdir: str, stem: str, flags: BuildFlags, *,
                  cancel: threading.Event | None = None) -> CompileResult:
    """Write ``source`` to ``workdir/stem.cu`` and compile it to ``workdir/stem.cubin`` (kept for the caller)."""
    return compile_in(source, workdir, f"{stem}.cu", flags, cancel=cancel)
