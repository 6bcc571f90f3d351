"""Launch specs written inline, and one rule's outcome on a snippet, for the transformation tests."""

from __future__ import annotations

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec


def spec_of(kernel: str, params: list[dict], grid, block, variants=None) -> dict:
    data = {"kernel": kernel, "params": params, "grid": grid, "block": block, "tolerance": {"rtol": 1e-4, "atol": 1e-5}}
    if variants:
        data["variants"] = variants
    return data


def arr(name, size, role="in"):
    return {"name": name, "array": "float32", "size": size, "init": "uniform(-1,1)" if role != "out" else "zeros", "role": role}


def scalar(name, value):
    return {"name": name, "scalar": "int32", "value": value}


def outcome(rule: str, source: str, spec: dict):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name(rule)])[0]
