"""Integer expressions of launch specs: C semantics, no eval()."""

import pytest

from kernel_lsp.core.expr import ExprError, evaluate, names, parse


@pytest.mark.parametrize(
    "text, env, expected",
    [
        ("(n+255)/256", {"n": 16777216}, 65536),
        ("(n+255)/256", {"n": 1000003}, 3907),
        ("-7/2", {}, -3),  # C truncates toward zero; Python's // would give -4
        ("7/-2", {}, -3),
        ("-7%3", {}, -1),  # the sign of the dividend, as in C99
        ("7%-3", {}, 1),
        ("1<<4+1", {}, 32),  # + binds tighter than <<
        ("256>>2", {}, 64),
        ("2+3*4", {}, 14),
        ("(2+3)*4", {}, 20),
        ("-(-5)", {}, 5),
        ("+5", {}, 5),
        ("min(a,b)", {"a": 3, "b": -2}, -2),
        ("max(a, b*2)", {"a": 3, "b": 4}, 8),
        ("ceil_div(n, 256)", {"n": 257}, 2),
        ("ceil_div(n, 256)", {"n": 256}, 1),
        ("ceil_div(min(n,1000), 3)", {"n": 5000}, 334),
        ("0x10 + 1", {}, 17),
        (4096, {}, 4096),
        ("  n  ", {"n": 9}, 9),
    ],
)
def test_evaluate(text, env, expected):
    assert evaluate(text, env) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("n/0", "division by zero"),
        ("n%0", "modulo by zero"),
        ("1<<-1", "negative shift"),
        ("m+1", "unknown name 'm'"),
        ("(n+1", "unexpected end"),
        ("n+", "unexpected end"),
        ("n)", r"unexpected '\)'"),
        ("pow(n,2)", "unknown function 'pow'"),
        ("min(n)", "takes 2 arguments"),
        ("n ** 2", "unexpected '*'"),
        ("n; import os", "unexpected character ';'"),
        ("", "empty expression"),
        ("1.5*n", "unexpected character '.'"),
        ("__import__('os')", "unexpected character"),
    ],
)
def test_errors(text, message):
    with pytest.raises(ExprError, match=message):
        evaluate(text, {"n": 10})


def test_names_lists_every_variable():
    assert names(parse("ceil_div(rows*cols, tile) + min(k, 3)")) == {"rows", "cols", "tile", "k"}


def test_rejects_non_integer_values_and_bools():
    with pytest.raises(ExprError, match="not an integer"):
        evaluate("a+1", {"a": 1.5})
    with pytest.raises(ExprError):
        parse(True)


def test_large_values_do_not_wrap():
    assert evaluate("n*n", {"n": 1 << 31}) == 1 << 62
