"""The spec's grid written as C over the kernel's parameters, for a rewrite whose kernel must know how
many blocks the original launch had (a block that serves several of them guards the last)."""

from __future__ import annotations

from kernel_lsp.core import expr
from kernel_lsp.core.rules.base import RuleContext
from kernel_lsp.core.static_check import problem_sizes


def grid_c(node: expr.Node, params: set[str]) -> str | None:
    """A spec expression as C over the kernel's parameters (None when it names anything else)."""
    if isinstance(node, expr.Num):
        return str(node.value)
    if isinstance(node, expr.Name):
        return node.name if node.name in params else None
    if isinstance(node, expr.Unary):
        inner = grid_c(node.operand, params)
        return None if inner is None else f"({node.op}{inner})"
    if isinstance(node, expr.Binary):
        a, b = grid_c(node.left, params), grid_c(node.right, params)
        return None if a is None or b is None else f"({a} {node.op} {b})"
    if isinstance(node, expr.Call) and len(node.args) == 2:
        a, b = (grid_c(x, params) for x in node.args)
        if a is None or b is None:
            return None
        if node.func == "ceil_div":
            return f"(({a} + {b} - 1) / {b})"
        return f"({a} {'<' if node.func == 'min' else '>'} {b} ? {a} : {b})"
    return None


def literals(node: expr.Node) -> list[expr.Num]:
    if isinstance(node, expr.Num):
        return [node]
    if isinstance(node, expr.Unary):
        return literals(node.operand)
    if isinstance(node, expr.Binary):
        return literals(node.left) + literals(node.right)
    if isinstance(node, expr.Call):
        return [n for a in node.args for n in literals(a)]
    return []


def original_grid(ctx: RuleContext, params: set[str]) -> tuple[str | None, str]:
    """The spec's grid x extent as C over ``params`` (the kernel's unassigned integer parameters), for a
    kernel that must know how many blocks the original launch had; or why it cannot say."""
    try:
        grid = grid_c(expr.parse(str(ctx.spec.launch.grid[0])), params)  # type: ignore[union-attr]
    except expr.ExprError:
        grid = None
    if grid is None:
        return None, (f"the spec's grid `{ctx.spec.launch.grid[0]}` is not an expression of the kernel's integer "  # type: ignore[union-attr]
                      "parameters (the kernel must know how many original blocks there are)")
    sizes = problem_sizes(ctx.spec)  # type: ignore[arg-type]
    written = [n.value for n in literals(expr.parse(str(ctx.spec.launch.grid[0]))) if n.value in sizes]  # type: ignore[union-attr]
    if written:
        return None, (f"the grid is written with the literal {written[0]}, {sizes[written[0]]}: in the kernel, the "
                      "harness's static check would take it for a problem size written in")
    return grid, ""
