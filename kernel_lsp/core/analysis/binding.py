"""Binding the facts to a launch: numbers for strides, sectors per request and trip counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kernel_lsp.core.analysis.facts import Access, KernelFacts, LoopFact, Opaque, thread_dependence
from kernel_lsp.core.poly import Poly

_WARP = 32
_SECTOR_BYTES = 32


# --------------------------------------------------------------------------------------------
# Binding to a launch: numbers for strides, sectors and trip counts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """The launch an analysis is evaluated under."""

    values: Mapping[str, int]
    """Integer scalar parameters by name."""
    block: tuple[int, int, int]
    grid: tuple[int, int, int] | None = None
    elem_bytes: Mapping[str, int] = field(default_factory=dict)
    """Element sizes by array name where the source cannot tell (templates): from the spec."""

    @staticmethod
    def from_spec(spec, variant: int | None = None) -> Binding:  # noqa: ANN001 - core.spec.Spec
        from kernel_lsp.core.spec import FLOAT_TYPES, ArrayParam

        resolved = spec.resolve(variant)
        values = {k: int(v) for k, v in resolved.values.items()
                  if not any(p.name == k and p.type in FLOAT_TYPES for p in spec.scalars)}
        sizes = {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4,
                 "int64": 8, "uint64": 8, "float64": 8}
        elem = {p.name: sizes[p.type] for p in spec.params if isinstance(p, ArrayParam) and p.type in sizes}
        return Binding(values, resolved.original.block, resolved.original.grid, elem)


@dataclass(frozen=True)
class Pattern:
    access: Access
    pattern: str
    """``coalesced``, ``strided``, ``broadcast`` (one address for the warp), ``gather`` (the index
    depends on loaded data or on something not modelled that varies by thread), ``serialized`` (a
    ``__constant__`` read at several addresses across a warp: the constant cache serves one address at a
    time) or ``unknown``."""
    warp_stride_elems: int | None
    """Elements between neighbouring lanes along ``threadIdx.x`` (None: not linear or not known)."""
    sectors_per_request: int | None
    ideal_sectors: int | None
    loop_stride_elems: int | None
    """Elements between consecutive iterations of the innermost enclosing loop, per thread."""
    why: str

    @property
    def uncoalesced(self) -> bool:
        return self.pattern in ("strided", "gather")


def _lane_env(lane: int, block: tuple[int, int, int]) -> dict[str, int]:
    bx, by, _ = block
    return {"tid.x": lane % bx, "tid.y": (lane // bx) % max(by, 1), "tid.z": lane // (bx * max(by, 1))}


def _base_env(facts: KernelFacts, binding: Binding) -> dict[str, int]:
    env = dict(binding.values)
    bx, by, bz = binding.block
    env.update({"bdim.x": bx, "bdim.y": by, "bdim.z": bz, "bid.x": 1, "bid.y": 1, "bid.z": 1})
    if binding.grid is not None:
        gx, gy, gz = binding.grid
        env.update({"gdim.x": gx, "gdim.y": gy, "gdim.z": gz})
    for loop in facts.loops:
        env[loop.trip_symbol] = 1
    return env


def evaluate(poly: Poly, env: Mapping[str, int], opaque: Mapping[str, Opaque]) -> int | None:
    """``poly``'s value under ``env``, computing opaque terms from their recipes; an opaque term
    without one counts 0 when it does not depend on the thread (the same for every lane, so it
    moves no address relative to another) and makes the value unknown otherwise."""
    values: dict[str, int] = {}
    for s in poly.symbols:
        if s in env:
            continue
        entry = opaque.get(s)
        if entry is None:
            return None
        value = _compute(entry, env, opaque) if entry.recipe is not None else (None if entry.deps else 0)
        if value is None:
            return None
        values[s] = value
    return poly.evaluate({**env, **values}) if values else poly.evaluate(env)


def _compute(entry: Opaque, env: Mapping[str, int], opaque: Mapping[str, Opaque]) -> int | None:
    recipe = entry.recipe
    if recipe[0] == "select":
        _, l, cmp, r, a, b = recipe
        lv, rv = evaluate(l, env, opaque), evaluate(r, env, opaque)
        if lv is None or rv is None:
            return None
        taken = {"<": lv < rv, "<=": lv <= rv, ">": lv > rv, ">=": lv >= rv, "==": lv == rv, "!=": lv != rv}[cmp]
        return evaluate(a if taken else b, env, opaque)
    op, a, b = recipe
    av, bv = evaluate(a, env, opaque), evaluate(b, env, opaque)
    if av is None or bv is None:
        return None
    if op in ("/", "%"):
        if bv == 0:
            return None
        q = abs(av) // abs(bv) * (1 if (av >= 0) == (bv >= 0) else -1)  # C truncates toward zero
        return q if op == "/" else av - q * bv
    if op in (">>", "<<") and not 0 <= bv < 64:
        return None
    return {"&": av & bv, "|": av | bv, "^": av ^ bv, ">>": av >> bv if op == ">>" else 0, "<<": av << bv if op == "<<" else 0,
            "min": min(av, bv), "max": max(av, bv)}[op]


def bind(facts: KernelFacts, binding: Binding) -> tuple[Pattern, ...]:
    """The pattern of every access of ``facts`` under ``binding``."""
    base = _base_env(facts, binding)
    lanes = [_lane_env(lane, binding.block) for lane in range(min(_WARP, binding.block[0] * binding.block[1] * binding.block[2]))]
    return tuple(_pattern(a, facts, base, lanes, binding) for a in facts.accesses)


def _pattern(a: Access, facts: KernelFacts, base: Mapping[str, int], lanes: list[dict[str, int]], binding: Binding) -> Pattern:
    elem = a.elem_bytes or binding.elem_bytes.get(a.array)
    loop_stride = None
    if a.loops:
        inner = facts.loops[a.loops[-1]]
        coeff = a.index.coefficient(inner.trip_symbol)
        loop_stride = coeff.evaluate(base) if coeff is not None else None
    deps = thread_dependence(a.index, facts.opaque)
    addresses = []
    for lane in lanes:
        value = evaluate(a.index, {**base, **lane}, facts.opaque)
        if value is None and _data_dependent(a.index, facts.opaque):
            reason = _data_term(a.index, facts.opaque)
            return Pattern(a, "gather", None, None, None, loop_stride, f"the index depends on `{reason}`, which varies by thread")
        if value is None:
            missing = sorted(s for s in a.index.symbols if s not in base and not s.startswith("tid."))
            computed = [s for s in missing if s in facts.opaque and facts.opaque[s].recipe is not None]
            if computed:
                return Pattern(a, "unknown", None, None, None, loop_stride,
                               f"`{facts.opaque[computed[0]].text}` has no value under this launch "
                               "(a shift by 64 bits or more, or a division by zero)")
            return Pattern(a, "unknown", None, None, None, loop_stride,
                           f"the index needs {', '.join(missing) or 'values'}, which the launch does not give")
        addresses.append(value)
    coeff_x = a.index.coefficient("tid.x")
    stride = evaluate(coeff_x, base, facts.opaque) if coeff_x is not None and not any(
        opaque_symbol in facts.opaque and facts.opaque[opaque_symbol].deps for opaque_symbol in a.index.symbols) else None
    if stride is None and len(addresses) > 1 and binding.block[0] > 1:
        steps = {addresses[i + 1] - addresses[i] for i in range(min(len(addresses), binding.block[0]) - 1)}
        stride = steps.pop() if len(steps) == 1 else None
    if not deps or len(set(addresses)) == 1:
        return Pattern(a, "broadcast", 0, 1, 1, loop_stride, "every thread of a warp uses the same element")
    if a.space == "constant":
        distinct = len(set(addresses))
        return Pattern(a, "serialized", stride, None, None, loop_stride,
                       f"{distinct} different elements across a warp, which the constant cache serves one after another")
    if elem is None:
        return Pattern(a, "unknown", stride, None, None, loop_stride, "the element size is not known (template type?)")
    offset, useful = (a.field_offset_bytes or 0), (a.field_bytes or elem)
    sectors = len({(addr * elem + offset + k) // _SECTOR_BYTES for addr in addresses for k in (0, useful - 1)})
    ideal = max(1, -(-len(set(addresses)) * useful // _SECTOR_BYTES))
    if a.space == "shared":
        banks = [((addr * elem) // 4) % 32 for addr in addresses]
        words = {}
        for addr, bank in zip(addresses, banks):
            words.setdefault(bank, set()).add((addr * elem) // 4)
        ways = max(len(w) for w in words.values())
        pattern = "coalesced" if ways <= 1 else "strided"
        return Pattern(a, pattern, stride, ways, 1, loop_stride,
                       "no bank conflicts" if ways <= 1 else f"{ways}-way bank conflicts")
    pattern = "coalesced" if sectors <= ideal + 1 else "strided"
    return Pattern(a, pattern, stride, sectors, ideal, loop_stride,
                   f"{sectors} sectors per request (ideal {ideal})")


def _data_dependent(poly: Poly, opaque: Mapping[str, Opaque], depth: int = 0) -> bool:
    """True when a thread-dependent term of ``poly`` has no recipe (a loaded value, an unknown call)."""
    if depth > 64:
        return True
    for s in poly.symbols:
        entry = opaque.get(s)
        if entry is None or not entry.deps:
            continue
        if entry.recipe is None:
            return True
        polys = [x for x in entry.recipe if isinstance(x, Poly)]
        if any(_data_dependent(x, opaque, depth + 1) for x in polys):
            return True
    return False


def _data_term(poly: Poly, opaque: Mapping[str, Opaque]) -> str:
    for s in sorted(poly.symbols):
        entry = opaque.get(s)
        if entry is not None and entry.deps:
            if entry.recipe is None:
                return entry.text
            inner = next((_data_term(x, opaque) for x in entry.recipe if isinstance(x, Poly) and _data_dependent(x, opaque)), "")
            if inner:
                return inner
    return ""


def describe(p: Pattern) -> str:
    """One line for hover: ``store to `out`: 4096 elements apart across a warp, 32 sectors per request — uncoalesced``."""
    a = p.access
    verb = {"read": "load of", "write": "store to", "update": "update of", "atomic": f"{a.op} on"}[a.kind]
    where = {"global": "", "unknown": " (memory not resolved)"}.get(a.space, f" ({a.space})")
    target = f"`{a.array}{'.' + a.field if a.field else ''}`{where}"
    if p.pattern == "broadcast":
        body = "the same element for every thread of a warp (broadcast)"
    elif p.pattern == "gather":
        body = f"gather: {p.why}"
    elif p.pattern == "unknown":
        body = f"pattern unknown: {p.why}"
    elif p.pattern == "serialized":
        body = p.why
    elif a.space == "shared":
        body = f"{p.why}" + (f", {p.warp_stride_elems} elements apart across a warp" if p.warp_stride_elems not in (None, 1) else "")
    else:
        apart = ("unit stride across a warp" if p.warp_stride_elems == 1
                 else f"{p.warp_stride_elems} elements apart across a warp" if p.warp_stride_elems is not None
                 else "lanes not evenly spaced")
        verdict = "coalesced" if p.pattern == "coalesced" else "uncoalesced"
        body = f"{apart}, {p.sectors_per_request} sectors per request — {verdict}"
    if p.loop_stride_elems not in (None, 0):
        body += f"; {p.loop_stride_elems} element{'s' if abs(p.loop_stride_elems) != 1 else ''} further each loop iteration"
    via = f" (in {' → '.join(a.via)})" if a.via else ""
    return f"{verb} {target}{via}: {body}"


def trip_count(facts: KernelFacts, loop: LoopFact, binding: Binding) -> int | None:
    """Iterations of ``loop`` for thread 0 of block 0 under ``binding`` (None: not known)."""
    env = _base_env(facts, binding)
    env.update({"tid.x": 0, "tid.y": 0, "tid.z": 0, "bid.x": 0, "bid.y": 0, "bid.z": 0})
    if loop.geometric is not None or loop.step is None or loop.start is None or loop.bound is None:
        return None
    start, step, bound = loop.start.evaluate(env), loop.step.evaluate(env), loop.bound.evaluate(env)
    if start is None or step is None or bound is None or step <= 0:
        return None
    return max(0, -(-(bound - start) // step))
