"""nvcc to a cubin, and the kernel's (possibly mangled) entry name.

The entry names come from ptxas's verbose output ("Compiling entry function
'_Z5saxpyifPKfPf' for 'sm_90'"), which lists exactly the kernels of the cubin, so
no cuobjdump or cu++filt is needed. A C++ name is matched by reading its
Itanium-mangled base name (:func:`mangled_base_name`).
"""

from __future__ import annotations

import os
import re
import struct
import threading
from dataclasses import dataclass

from kernel_lsp.services.proc import ToolMissing, run

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    cubin_path: str | None
    entries: tuple[str, ...]
    """Kernel entry names in the cubin, mangled as the linker sees them."""
    log: str
    """nvcc's stderr (errors, warnings, ptxas info)."""
    wall_s: float


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


def compile_cubin(
    source: str,
    workdir: str,
    stem: str,
    *,
    arch: str,
    nvcc: str = "nvcc",
    include_dirs: tuple[str, ...] = (),
    extra_flags: tuple[str, ...] = (),
    timeout_s: float = 120.0,
    cancel: threading.Event | None = None,
) -> CompileResult:
    """Write ``source`` to ``workdir/stem.cu`` and compile it to ``stem.cubin`` for ``arch`` (``sm_90``)."""
    src_path = os.path.join(workdir, f"{stem}.cu")
    cubin_path = os.path.join(workdir, f"{stem}.cubin")
    with open(src_path, "w", encoding="utf-8") as f:
        f.write(source)
    argv = [nvcc, "-cubin", f"-arch={arch}", "-lineinfo", "-Xptxas", "-v", "-o", cubin_path]
    argv += [f"-I{d}" for d in include_dirs] + list(extra_flags) + [src_path]
    try:
        result = run(argv, timeout_s=timeout_s, cwd=workdir, cancel=cancel)
    except ToolMissing as exc:
        return CompileResult(False, None, (), f"{exc}. Install the CUDA toolkit or set nvccPath.", 0.0)
    # Paths of the scratch folder mean nothing to the user: "candidate.cu(9): error" reads better.
    log = (result.stdout + result.stderr).strip().replace(workdir + os.sep, "")
    if result.timed_out:
        return CompileResult(False, None, (), f"nvcc did not finish in {timeout_s:.0f} s", result.wall_s)
    if not result.ok or not os.path.exists(cubin_path):
        return CompileResult(False, None, (), log or f"nvcc exited with {result.returncode}", result.wall_s)
    entries = tuple(dict.fromkeys(_ENTRY.findall(log)))
    return CompileResult(True, cubin_path, entries, log, result.wall_s)


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
