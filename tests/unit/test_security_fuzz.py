"""Fuzzing the spec parser, the in-source scanner and the expression evaluator (hypothesis).

Properties: nothing but :class:`SpecError` / :class:`ExprError` ever escapes, whatever the input;
the linear scanner finds what the regex it replaced found; an accepted spec round-trips.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_lsp.core import expr
from kernel_lsp.core.spec import SpecError, find_inline_specs, parse_spec

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
expression_text = st.text(alphabet="0123456789xnm+-*/%()<<>>, minaxceil_d", max_size=40)

#: A spec whose every field may be replaced by a hostile value.
BASE = {
    "kernel": "k",
    "params": [{"name": "n", "scalar": "int32", "value": 1024},
               {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "inout"}],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
}


@FUZZ
@given(json_values)
def test_parse_spec_raises_only_spec_errors_on_any_json(value):
    try:
        parse_spec(value)
    except SpecError as exc:
        assert exc.errors
        str(exc)


@FUZZ
@given(st.sampled_from(["kernel", "params", "grid", "block", "dynamic_smem", "tolerance", "variants", "candidate"]),
       json_values | expression_text)
def test_any_field_replaced_gives_a_spec_or_a_spec_error(field, value):
    data = json.loads(json.dumps(BASE))
    data[field] = value
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        assert all(isinstance(e, str) and e for e in exc.errors)
        return
    assert parse_spec(spec.to_json()) == spec


@FUZZ
@given(st.integers(0, 1), expression_text)
def test_array_size_expressions(index, text):
    data = json.loads(json.dumps(BASE))
    data["params"][1]["size"] = text if index else f"n*({text})"
    try:
        spec = parse_spec(data)
    except SpecError:
        return
    assert 0 <= spec.resolve().sizes["x"] <= 2**64


@FUZZ
@given(expression_text, st.integers(-(2**64), 2**64))
def test_expressions_raise_only_expr_errors_and_stay_in_range(text, n):
    try:
        value = expr.evaluate(text, {"n": n, "m": 3})
    except expr.ExprError:
        return
    assert -(2**64) <= value <= 2**64


# The regex the scanner replaced (quadratic on hostile input, fine on short texts): the oracle.
_OLD_MARKER = re.compile(r"^\s*//\s*kernel-lsp:\s*spec\b(.*)$")
_OLD_COMMENT = re.compile(r"^\s*//(.*)$")
_OLD_NAME = re.compile(r"__global__[^;{(]*?\b([A-Za-z_]\w*)\s*\(", re.S)


def old_kernels(source: str) -> list[tuple[int, str | None]]:
    lines = source.splitlines()
    found, i = [], 0
    while i < len(lines):
        if _OLD_MARKER.match(lines[i]) is None:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and _OLD_COMMENT.match(lines[i]) and not _OLD_MARKER.match(lines[i]):
            i += 1
        name = _OLD_NAME.search("\n".join(lines[i:]))
        found.append((start, name.group(1) if name else None))
    return found


pieces = st.sampled_from(["__global__", " ", "\n", "\r\n", "\x0c", "(", ";", "{", "k", "x1", "_", "é", "9",
                          "// kernel-lsp: spec {}\n", "//c\n", "// kernel-lsp: spec {\"block\": [1,1,1]}\n",
                          "// kernel-lsp: spec [\n", "void "])


@settings(max_examples=1000, deadline=None)
@given(st.lists(pieces, max_size=30).map("".join))
def test_scanner_finds_what_the_old_regex_found(source):
    assert [(f.line, f.kernel) for f in find_inline_specs(source)] == old_kernels(source)


@FUZZ
@given(st.text(max_size=300))
def test_scanner_never_raises(source):
    for found in find_inline_specs(source):
        assert (found.data is None) == (found.error is not None)
