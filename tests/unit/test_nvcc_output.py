"""nvcc diagnostics, ptxas resource usage and demangling, on output recorded from real nvcc runs.

See tests/fixtures/nvcc/README.md for how each sample was made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_lsp.core.demangle import base_name, demangle
from kernel_lsp.core.nvcc_output import CompilerMessage, include_line, parse_diagnostics, parse_resource_usage

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvcc"


def _sample(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_edg_errors_and_warnings_with_columns() -> None:
    messages = parse_diagnostics(_sample("errors.sm_90.txt"))
    got = [(m.path, m.line, m.column, m.severity, m.code) for m in messages]
    assert got == [
        ("errors.cu", 5, 24, "error", None),
        ("errors.cu", 7, 5, "error", None),
        ("errors.cu", 4, 9, "warning", "177-D"),
        ("errors.cu", 6, 11, "warning", "177-D"),
    ]
    assert messages[0].message == 'identifier "undefined_name" is undefined'
    # The column points at the identifier in the real source line.
    source = (FIXTURES / "errors.cu").read_text().splitlines()
    assert source[4][messages[0].column - 1 :].startswith("undefined_name")
    assert source[3][messages[2].column - 1 :].startswith("unused")


def test_gcc_fatal_error() -> None:
    (message,) = parse_diagnostics(_sample("preproc.sm_90.txt"))
    assert message == CompilerMessage(
        "preproc.cu", 1, 10, "error", None, "missing_header.h: No such file or directory", "host"
    )
    (host,) = parse_diagnostics(_sample("host_error.sm_90.txt"))
    assert (host.line, host.column, host.severity, host.message) == (1, 2, "error", '#error "host preprocessor stop"')


def test_ptxas_error_names_entry() -> None:
    (message,) = parse_diagnostics(_sample("too_much_shared.sm_90.txt"))
    assert (message.tool, message.severity, message.path, message.line, message.mangled_name) == (
        "ptxas", "error", None, None, "_Z3bigPf",
    )
    assert "too much shared data" in message.message


def test_success_output_has_only_the_warning() -> None:
    messages = parse_diagnostics(_sample("warnings.sm_90.txt"))
    assert [(m.line, m.severity, m.code) for m in messages] == [(2, "warning", "177-D")]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("k.cu(12): error C2065: 'x': undeclared identifier", ("k.cu", 12, None, "error", "C2065", "host")),
        ("C:\\src\\k.cu(3,7): warning C4244: conversion", ("C:\\src\\k.cu", 3, 7, "warning", "C4244", "host")),
        ("/abs/k.cu:8:3: warning: unused variable 'q' [-Wunused-variable]", ("/abs/k.cu", 8, 3, "warning", "-Wunused-variable", "host")),
        ("k.cu(9): catastrophic error: cannot open source file \"x.h\"", ("k.cu", 9, None, "error", None, "nvcc")),
        ("k.cu(2): remark #550-D: variable set but never used", ("k.cu", 2, None, "info", "550-D", "nvcc")),
        ("nvcc fatal   : Unsupported gpu architecture 'compute_99'", (None, None, None, "error", None, "nvcc")),
    ],
)
def test_other_formats(line: str, expected: tuple[object, ...]) -> None:
    (message,) = parse_diagnostics(line)
    assert (message.path, message.line, message.column, message.severity, message.code, message.tool) == expected


def test_edg_instantiation_context_kept() -> None:
    text = (
        'k.cu(4): error: no operator "+" matches these operands\n'
        "      return a + b;\n"
        "               ^\n"
        '          detected during instantiation of "T add(T, T) [with T=S]" at line 9\n'
        "\n"
    )
    (message,) = parse_diagnostics(text)
    assert message.column == 14
    assert message.message.endswith('detected during instantiation of "T add(T, T) [with T=S]" at line 9')


def test_garbage_never_raises() -> None:
    assert parse_diagnostics("\x00\x01 random (12): text\n::::\n(((") == ()
    assert parse_resource_usage("ptxas info : Used lots registers") == ()


def test_resource_usage_sm90() -> None:
    usage = {u.mangled_name: u for u in parse_resource_usage(_sample("resources.sm_90.txt"))}
    assert set(usage) == {
        "_ZN2ns5inner3barEPdy", "_ZN2ns3fooEv", "_Z9by_struct6ParamsPf", "_Z6spillsPfi", "plain_c",
        "_Z6kernelIdEvPT_i", "_Z6kernelIfEvPT_i", "_Z5saxpyifPKfPf",
    }
    saxpy = usage["_Z5saxpyifPKfPf"]
    assert (saxpy.arch, saxpy.registers_per_thread, saxpy.barriers, saxpy.shared_bytes_static, saxpy.constant_bytes) == (
        "sm_90", 10, 0, 0, None,
    )
    assert (saxpy.base_name, saxpy.qualified_name) == ("saxpy", "saxpy")
    kd = usage["_Z6kernelIdEvPT_i"]
    assert (kd.registers_per_thread, kd.barriers, kd.shared_bytes_static, kd.qualified_name, kd.base_name) == (
        12, 1, 2048, "kernel<double>", "kernel",
    )
    assert usage["_Z6spillsPfi"].stack_frame_bytes == 1024
    assert usage["plain_c"].base_name == "plain_c"
    assert usage["_ZN2ns5inner3barEPdy"].qualified_name == "ns::inner::bar"


def test_resource_usage_sm80_lists_constant_banks() -> None:
    usage = {u.mangled_name: u for u in parse_resource_usage(_sample("resources.sm_80.txt"))}
    bar = usage["_ZN2ns5inner3barEPdy"]
    assert (bar.arch, bar.registers_per_thread, bar.constant_bytes) == ("sm_80", 8, 368)


def test_spills_and_device_function_skipped() -> None:
    (heavy,) = parse_resource_usage(_sample("spills.sm_90.txt"))
    assert heavy.mangled_name == "_Z5heavyPKfPfi"
    assert (heavy.registers_per_thread, heavy.spill_store_bytes, heavy.spill_load_bytes, heavy.stack_frame_bytes) == (
        24, 7416, 9940, 6056,
    )
    assert heavy.has_spills


@pytest.mark.parametrize(
    ("mangled", "qualified", "base", "params"),
    [
        ("_Z5saxpyifPKfPf", "saxpy", "saxpy", ("int", "float", "const float*", "float*")),
        ("_ZN2ns3fooEv", "ns::foo", "foo", ()),
        ("_Z6kernelIfEvPT_i", "kernel<float>", "kernel", ("float*", "int")),
        ("_ZN2ns2tkIfLi256EEEvPT_PKS1_NS_3FooENS_3TagIXT0_EEE", "ns::tk<float, 256>", "tk",
         ("float*", "const float*", "ns::Foo", "ns::Tag<256>")),
        ("_ZN1a1b1c4deepEPNS1_2S2ES3_", "a::b::c::deep", "deep", ("a::b::c::S2*", "a::b::c::S2*")),
        ("_Z3twoIdaEvPT_PT0_S0_S2_yb", "two<double, signed char>", "two",
         ("double*", "signed char*", "double", "signed char", "unsigned long long", "bool")),
        ("_Z2bkILb1EEvPi", "bk<true>", "bk", ("int*",)),
        ("_ZN2ns40_GLOBAL__N__a489b932_8_names_cu__Z4usemv4anonEi", "ns::(anonymous namespace)::anon", "anon", ("int",)),
        ("_Z2fpPFviE6float2P6__half", "fp", "fp", ("void (*)(int)", "float2", "__half*")),
        ("_Z3arrPA32_fRf", "arr", "arr", ("float (*)[32]", "float&")),
        ("_Z4kernILi128ELi4EEvPfS0_", "kern<128, 4>", "kern", ("float*", "float*")),
        ("_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector<int, std::allocator<int>>::push_back", "push_back", ("const int&",)),
        ("plain_c", "plain_c", "plain_c", ()),
    ],
)
def test_demangle(mangled: str, qualified: str, base: str, params: tuple[str, ...]) -> None:
    result = demangle(mangled)
    assert result is not None
    assert (result.qualified_name, result.base_name, result.parameters) == (qualified, base, params)


@pytest.mark.parametrize("bad", ["_Z", "_Zxyz", "_Z3fo", "_ZN3foo", "_Z1fS5_", "", "a b"])
def test_demangle_rejects_malformed(bad: str) -> None:
    assert demangle(bad) is None
    assert base_name(bad) == bad


def test_include_line_finds_the_directive_that_brings_a_header_in():
    source = '#include <cstdio>\n#include "util.cuh"\n  # include "sub/util.cuh"\n#include "./other.h"\n'
    assert include_line(source, "/w/sub/util.cuh") == 2  # the longer matching name wins
    assert include_line(source, "/w/util.cuh") == 1
    assert include_line(source, "/w/other.h") == 3
    assert include_line(source, "C:\\w\\sub\\util.cuh") == 2
    assert include_line(source, "/usr/include/cstdio") == 0
    assert include_line(source, "/w/nested.cuh") is None
    assert include_line("int x; // #include \"util.cuh\"\n", "/w/util.cuh") is None
    assert include_line('/* old:\n#include "util.cuh"\n*/\n#include "util.cuh"\n', "/w/util.cuh") == 3
