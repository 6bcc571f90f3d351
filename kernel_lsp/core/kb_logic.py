"""Pure logic of the knowledge base: state matching, technique selection, the update rule.

No IO, no clock: :mod:`kernel_lsp.services.kb` stores what these functions compute.
The design follows KernelBlaster (states x techniques with a predicted speedup and a
confidence) but matches states on the *numeric* signature of
:mod:`kernel_lsp.core.signature` instead of asking a model.

State matching
--------------
A state has, per signature key, a centre ``c_k``, a weight ``w_k``, a scale ``s_k``
and an optional bound (``min``: "at least c_k", values above cost nothing; ``max``:
"at most c_k").  For a kernel signature ``x``::

    z_k = (x_k - c_k) / s_k            (z_k = min(z_k, 0) for a min bound, max(z_k, 0) for a max bound)
    d(x, state) = sqrt( (sum_{k known} w_k z_k^2 + sum_{k missing} w_k MISSING_KEY_DISTANCE^2) / sum_k w_k )

i.e. a weighted RMS of scale-normalised differences over all the state's keys
(``d = 1`` means "one scale away on average"), where a key the profile lacks counts
as ``MISSING_KEY_DISTANCE`` scales away.  A state is *comparable* only when the known
keys carry at least ``MIN_COVERAGE`` of its total weight, so a state is never matched
on a single minor key of its definition.

The nearest comparable state wins (ties broken by higher coverage, then by name).
When it is farther than ``threshold`` (default ``MATCH_THRESHOLD``), a NEW state is
derived, named ``<nearest>~<8 hex digits of a hash of the signature>``: it keeps the
nearest state's keys, weights, scales and bounds, is centred on the signature's
values for those keys, and has the nearest state as parent.  Its entries are the
parent's current entries with confidence multiplied by ``INHERIT_DISCOUNT`` (0.8);
predicted speedup, attempts and successes are copied (the parent's evidence still
weighs as the prior).  Same signature and same states give the same result.
A signature with no comparable state matches ``FALLBACK_STATE`` (distance None).

Selection
---------
For every entry (state, technique) with predicted speedup ``p``, confidence ``c``,
``a`` attempts and ``s`` successes::

    weight = max(p - 1, 0) * c * (s + 1) / (a + 2)  +  EXPLORATION / sqrt(1 + a)

The first term is the predicted gain times the confidence, times the Laplace-smoothed
success rate, so a technique that failed in this state loses weight there even
before its mean speedup drops below 1.  The second is the exploration bonus: it is
largest for never-tried entries and fades as attempts accumulate.  The ``pool_size``
(default ``3 k``) entries of highest weight form the pool (ties by name); ``k`` of
them are drawn without replacement, each draw with probability proportional to its
weight, from ``random.Random(seed)``.

Update rule (after every verified attempt)
------------------------------------------
The measured value ``m`` is the attempt's speedup when the candidate was correct and
timed (accepted or not: a correct but slower candidate counts as, e.g., 0.93), and
``FAILURE_SPEEDUP`` (0.5) when it failed to compile, was wrong, crashed or timed out
(``speedup`` None).  With ``p`` the prediction before the update::

    p'  = p + (m - p) / (a + 1)          # running mean; seed attempts act as the prior's weight
    c'  = clamp(c + 0.1 if 0.8 <= m / p <= 1.2 else c - 0.1, 0.1, 1.0)
    a'  = a + 1 ;  s' = s + (1 if accepted else 0)

Replaying the attempt log in insertion order over the priors (the catalogue's seed
entries, or the inherited entries of a derived state) reproduces the entries exactly;
import relies on that.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kernel_lsp.core.signature import SIGNATURE_KEYS

MATCH_THRESHOLD = 1.0
"""Largest distance (in scale units, see module docstring) at which a state still matches."""
MIN_COVERAGE = 0.5
"""Share of a state's total key weight the signature must cover for the state to be comparable."""
MISSING_KEY_DISTANCE = 1.0
"""Distance, in scales, charged for a state key the signature does not have."""
INHERIT_DISCOUNT = 0.8
"""Confidence factor for entries a derived state inherits (KernelBlaster's 0.8x)."""
FALLBACK_STATE = "high-level-inefficiency"
"""State used when the signature shares no usable key with any state (e.g. no profile yet)."""
EXPLORATION = 0.1
"""Exploration bonus of a never-tried entry (weight units: predicted gain x confidence)."""
FAILURE_SPEEDUP = 0.5
"""Measured value recorded for an attempt that produced no correct, timed candidate."""
CONFIDENCE_STEP = 0.1
ACCURACY_BAND = (0.8, 1.2)
CONFIDENCE_MIN = 0.1
CONFIDENCE_MAX = 1.0
DEFAULT_PRIOR_SPEEDUP = 1.0
"""Prediction of an entry for a technique the state has no prior for (no gain expected)."""
DEFAULT_PRIOR_CONFIDENCE = 0.3

#: Scale of each signature key when a state does not give one: roughly "a clearly
#: different value" for that metric.
DEFAULT_SCALES: dict[str, float] = {
    key: 20.0 for key in SIGNATURE_KEYS if key.endswith("_pct")
} | {
    "global_sectors_per_request": 4.0,
    "shared_bank_conflicts_per_request": 2.0,
    "registers_per_thread": 48.0,
    "shared_bytes_per_block": 16384.0,
    "waves_per_sm": 2.0,
    "grid_blocks": 512.0,
    "block_threads": 256.0,
    "duration_us": 1000.0,
    "ipc": 1.0,
}


@dataclass(frozen=True)
class KeySpec:
    """One key of a state's signature: the centre value, its weight and its scale (same units as the key)."""

    value: float
    weight: float = 1.0
    scale: float | None = None
    """None: :data:`DEFAULT_SCALES`."""
    bound: str | None = None
    """``min`` (the key should be at least ``value``), ``max`` (at most), None (close to ``value``)."""

    def scale_or_default(self, key: str) -> float:
        return self.scale if self.scale else DEFAULT_SCALES.get(key, 1.0)


@dataclass(frozen=True)
class State:
    name: str
    description: str
    signature: Mapping[str, KeySpec]
    parent: str | None = None
    """The state this one was derived from (None for catalogue states)."""


@dataclass(frozen=True)
class Entry:
    """What the knowledge base believes about one technique in one state."""

    state: str
    technique: str
    predicted_speedup: float
    confidence: float
    attempts: int
    successes: int


@dataclass(frozen=True)
class StateMatch:
    state: str
    distance: float | None
    """Distance to the state (module docstring); None for the fallback state."""
    is_new: bool
    """True when no state was within the threshold and ``state`` was derived for this signature."""
    parent: str | None = None
    """For a new state: the nearest existing state, whose entries it inherits."""
    derived: State | None = None
    """For a new state: its definition, to be stored."""


@dataclass(frozen=True)
class TechniqueChoice:
    technique: str
    description: str
    predicted_speedup: float
    confidence: float
    attempts: int
    successes: int
    weight: float
    """Selection weight (module docstring)."""


@dataclass(frozen=True)
class Attempt:
    """One verified attempt of a technique on a kernel, as the optimizer reports it."""

    kernel_hash: str
    file: str
    kernel: str
    state: str
    technique: str
    candidate_hash: str
    verdict: str
    """Short verdict kind from the harness (``accepted``, ``slower``, ``incorrect``, ``compile-error``…)."""
    accepted: bool
    """True when the candidate was correct and faster than the user's minimum speedup."""
    speedup: float | None
    """Measured speedup (baseline time / candidate time) of a *correct* candidate; None when it was not correct or not timed."""
    reason: str = ""
    metrics_before: Mapping[str, float] = field(default_factory=dict)
    metrics_after: Mapping[str, float] = field(default_factory=dict)
    features: Mapping[str, Any] = field(default_factory=dict)
    """Static features of the original kernel (for ``examples_for`` similarity)."""
    model: str | None = None
    generator: str = ""
    original_source: str | None = None
    """Kept (with ``candidate_source``) only for accepted attempts: the worked examples."""
    candidate_source: str | None = None
    created_at: str | None = None
    """ISO-8601 UTC time; the store fills it in when None."""

    def stable_id(self) -> str:
        """Identity used to de-duplicate attempts across exported/imported files."""
        key = json.dumps(
            [self.kernel_hash, self.kernel, self.state, self.technique, self.candidate_hash,
             self.generator, self.model, self.verdict, self.speedup, self.created_at],
            sort_keys=True,
        )
        return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Example:
    """A before/after pair for a prompt."""

    technique: str
    before: str
    after: str
    origin: str
    """``user`` (a verified success from the attempt log) or ``catalogue`` (the shipped seed example)."""
    state: str | None = None
    speedup: float | None = None
    distance: float | None = None
    """Feature distance to the requested kernel (0 = same features); None for catalogue examples."""
    truncated: bool = False

    @property
    def chars(self) -> int:
        return len(self.before) + len(self.after)


# ---------------------------------------------------------------- state matching


def state_distance(signature: Mapping[str, float], state: State) -> tuple[float, float] | None:
    """(distance, coverage) of ``signature`` to ``state``; None when they share no key."""
    total_weight = sum(spec.weight for spec in state.signature.values() if spec.weight > 0)
    num = 0.0
    known_weight = 0.0
    for key, spec in state.signature.items():
        if spec.weight <= 0:
            continue
        value = signature.get(key)
        if value is None or not math.isfinite(value):
            num += spec.weight * MISSING_KEY_DISTANCE**2
            continue
        z = (value - spec.value) / spec.scale_or_default(key)
        if spec.bound == "min":
            z = min(z, 0.0)
        elif spec.bound == "max":
            z = max(z, 0.0)
        num += spec.weight * z * z
        known_weight += spec.weight
    if known_weight == 0:
        return None
    return math.sqrt(num / total_weight), known_weight / total_weight


def state_from_json(name: str, description: str, signature: Mapping[str, Any], parent: str | None) -> State:
    """A state from its JSON signature (``data/states.json``, the store's ``signature_json``)."""
    return State(
        name=name,
        description=description,
        signature={
            key: KeySpec(value=float(spec["value"]), weight=float(spec.get("weight", 1.0)),
                         scale=float(spec["scale"]) if spec.get("scale") else None, bound=_bound(spec.get("bound")))
            for key, spec in signature.items()
        },
        parent=parent,
    )


def _bound(value: Any) -> str | None:
    if value in (None, "min", "max"):
        return value
    raise ValueError(f"signature bound must be 'min' or 'max', not {value!r}")


def catalogue_states(states_text: str) -> tuple[tuple[State, ...], tuple[Entry, ...]]:
    """The seed states of ``data/states.json`` and their prior entries, as a fresh knowledge base has them."""
    states, priors = [], []
    for s in json.loads(states_text)["states"]:
        states.append(state_from_json(s["name"], s["description"], s["signature"], None))
        priors += [Entry(s["name"], e["technique"], float(e["predicted_speedup"]), float(e["confidence"]),
                         int(e["attempts"]), int(e["successes"])) for e in s["entries"]]
    return tuple(states), tuple(priors)


def signature_hash(signature: Mapping[str, float]) -> str:
    canonical = json.dumps({k: round(float(v), 3) for k, v in sorted(signature.items())}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:8]


def match_state(
    signature: Mapping[str, float],
    states: Iterable[State],
    threshold: float = MATCH_THRESHOLD,
) -> StateMatch:
    """Nearest comparable state within ``threshold``, else a derived new state (see module docstring)."""
    usable = {k: float(v) for k, v in signature.items() if k in SIGNATURE_KEYS and v is not None and math.isfinite(v)}
    ranked: list[tuple[float, float, str, State]] = []
    for state in states:
        if not state.signature:
            continue
        measured = state_distance(usable, state)
        if measured is None or measured[1] < MIN_COVERAGE:
            continue
        ranked.append((measured[0], -measured[1], state.name, state))
    if not ranked:
        return StateMatch(state=FALLBACK_STATE, distance=None, is_new=False)
    ranked.sort(key=lambda item: item[:3])
    distance, _, name, nearest = ranked[0]
    if distance <= threshold:
        return StateMatch(state=name, distance=distance, is_new=False)
    # The derived state keeps the parent's keys (and their weights and scales) and
    # moves the centre to this signature: a variant of the parent, not a
    # kernel-specific fingerprint over every key the profile happened to have.
    centre = {key: usable[key] for key in sorted(nearest.signature) if key in usable}
    derived = State(
        name=f"{nearest.name.split('~')[0]}~{signature_hash(centre)}",
        description=f"Derived from '{nearest.name}' for a kernel {distance:.2f} scale units away from it.",
        signature={
            key: replace(nearest.signature[key], value=value)
            for key, value in centre.items()
        },
        parent=nearest.name,
    )
    return StateMatch(state=derived.name, distance=0.0, is_new=True, parent=nearest.name, derived=derived)


def inherit_entries(parent_entries: Iterable[Entry], new_state: str, discount: float = INHERIT_DISCOUNT) -> list[Entry]:
    """The priors of a derived state: the parent's entries with confidence x ``discount``."""
    return [
        replace(
            entry,
            state=new_state,
            confidence=clamp_confidence(entry.confidence * discount),
        )
        for entry in parent_entries
    ]


# ---------------------------------------------------------------- update rule


def clamp_confidence(value: float) -> float:
    return min(CONFIDENCE_MAX, max(CONFIDENCE_MIN, value))


def measured_value(speedup: float | None) -> float:
    """The value an attempt contributes to the running mean (module docstring)."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return FAILURE_SPEEDUP
    return float(speedup)


def update_entry(entry: Entry, speedup: float | None, accepted: bool) -> Entry:
    """The entry after one verified attempt (module docstring, "Update rule")."""
    measured = measured_value(speedup)
    ratio = measured / entry.predicted_speedup if entry.predicted_speedup > 0 else math.inf
    low, high = ACCURACY_BAND
    step = CONFIDENCE_STEP if low <= ratio <= high else -CONFIDENCE_STEP
    return replace(
        entry,
        predicted_speedup=entry.predicted_speedup + (measured - entry.predicted_speedup) / (entry.attempts + 1),
        confidence=clamp_confidence(entry.confidence + step),
        attempts=entry.attempts + 1,
        successes=entry.successes + (1 if accepted else 0),
    )


def default_entry(state: str, technique: str) -> Entry:
    return Entry(state, technique, DEFAULT_PRIOR_SPEEDUP, DEFAULT_PRIOR_CONFIDENCE, 0, 0)


def replay(priors: Iterable[Entry], attempts: Iterable[tuple[str, str, float | None, bool]]) -> dict[tuple[str, str], Entry]:
    """Entries from priors and ``(state, technique, speedup, accepted)`` attempts in log order."""
    entries = {(e.state, e.technique): e for e in priors}
    for state, technique, speedup, accepted in attempts:
        key = (state, technique)
        entries[key] = update_entry(entries.get(key) or default_entry(state, technique), speedup, accepted)
    return entries


# ---------------------------------------------------------------- selection


def selection_weight(entry: Entry, exploration: float = EXPLORATION) -> float:
    gain = max(entry.predicted_speedup - 1.0, 0.0)
    success_rate = (entry.successes + 1) / (entry.attempts + 2)
    return gain * entry.confidence * success_rate + exploration / math.sqrt(1 + entry.attempts)


def select(
    entries: Sequence[Entry],
    k: int,
    seed: int | None = None,
    descriptions: Mapping[str, str] | None = None,
    pool_size: int | None = None,
    exploration: float = EXPLORATION,
) -> list[TechniqueChoice]:
    """Weighted random top-k without replacement (module docstring, "Selection")."""
    if k <= 0 or not entries:
        return []
    weighted = sorted(
        ((selection_weight(e, exploration), e) for e in entries),
        key=lambda item: (-item[0], item[1].technique),
    )
    pool = weighted[: max(k, pool_size if pool_size is not None else 3 * k)]
    rng = random.Random(seed)
    chosen: list[TechniqueChoice] = []
    while pool and len(chosen) < k:
        total = sum(w for w, _ in pool)
        pick = rng.random() * total
        index = len(pool) - 1
        for i, (w, _) in enumerate(pool):
            pick -= w
            if pick < 0:
                index = i
                break
        w, entry = pool.pop(index)
        chosen.append(
            TechniqueChoice(
                technique=entry.technique,
                description=(descriptions or {}).get(entry.technique, ""),
                predicted_speedup=entry.predicted_speedup,
                confidence=entry.confidence,
                attempts=entry.attempts,
                successes=entry.successes,
                weight=w,
            )
        )
    return chosen


# ---------------------------------------------------------------- examples


def feature_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """0 (same) .. 1 (nothing in common) over the union of keys; a key on one side only counts 1."""
    keys = set(a) | set(b)
    if not keys:
        return 1.0
    total = 0.0
    for key in keys:
        if key not in a or key not in b:
            total += 1.0
            continue
        x, y = a[key], b[key]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool) and not isinstance(y, bool):
            total += abs(x - y) / (abs(x) + abs(y) + 1.0)
        else:
            total += 0.0 if x == y else 1.0
    return total / len(keys)




def kernel_excerpt(source: str, kernel: str) -> str:
    """The definition of ``__global__ kernel`` (with its template line), or ``source`` when not found.

    Braces are matched after blanking comments and string literals, so a brace in
    either does not end the kernel early.
    """
    match = re.search(r"__global__\b[^;{}]*?\b" + re.escape(kernel) + r"\s*\(", source)
    if not match:
        return source
    blank = re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'",
                   lambda m: re.sub(r"[^\n]", " ", m.group(0)), source, flags=re.S)
    open_at = blank.find("{", match.end())
    if open_at < 0:
        return source
    depth = 0
    for i in range(open_at, len(blank)):
        if blank[i] == "{":
            depth += 1
        elif blank[i] == "}":
            depth -= 1
            if depth == 0:
                start = source.rfind("\n", 0, match.start()) + 1
                previous = source.rfind("\n", 0, max(start - 1, 0)) + 1
                if source[previous:start].lstrip().startswith("template"):
                    start = previous
                return source[start : i + 1]
    return source


def _cut(text: str, max_chars: int) -> str:
    marker = "\n// ... (truncated)"
    if len(text) <= max_chars:
        return text
    head = text[: max(max_chars - len(marker), 0)]
    head = head[: head.rfind("\n")] if "\n" in head else head
    return head + marker


def fit_examples(candidates: Sequence[Example], k: int, max_chars: int) -> list[Example]:
    """The first ``k`` examples (in the given order) whose total size stays within ``max_chars``.

    Examples are kept whole; only when not even the first one fits is it cut, at line
    boundaries, to half the budget per side (marked ``truncated``).
    """
    chosen: list[Example] = []
    used = 0
    for example in candidates:
        if len(chosen) >= k:
            break
        if used + example.chars <= max_chars:
            chosen.append(example)
            used += example.chars
    if not chosen and candidates and k > 0:
        first = candidates[0]
        half = max_chars // 2
        chosen.append(replace(first, before=_cut(first.before, half), after=_cut(first.after, half), truncated=True))
    return chosen


# ---------------------------------------------------------------- export records

#: The JSON-lines export: field -> allowed JSON kinds per record type. Kinds: "str", "int" (not bool),
#: "bool", "number" (finite int or float, not bool), "null", "object", "list". No coercion: "false" is a string.
EXPORT_SCHEMA: dict[str, dict[str, tuple[str, ...]]] = {
    "header": {"type": ("str",), "format": ("str",), "format_version": ("int",), "schema_version": ("int",)},
    "state": {"type": ("str",), "name": ("str",), "description": ("str",), "signature": ("object",),
              "parent": ("str", "null"), "origin": ("str",), "created_at": ("str",), "priors": ("list",)},
    "attempt": {"type": ("str",), "id": ("str",), "kernel_hash": ("str",), "file": ("str",), "kernel": ("str",),
                "state": ("str",), "technique": ("str",), "candidate_hash": ("str",), "verdict": ("str",),
                "accepted": ("bool",), "speedup": ("number", "null"), "reason": ("str",),
                "metrics_before": ("object",), "metrics_after": ("object",), "features": ("object",),
                "model": ("str", "null"), "generator": ("str",), "original_source": ("str", "null"),
                "candidate_source": ("str", "null"), "created_at": ("str",)},
}
#: Fields a record may leave out (the rest are required).
EXPORT_OPTIONAL: dict[str, frozenset[str]] = {
    "header": frozenset(("schema_version",)),
    "state": frozenset(("parent", "priors")),
    "attempt": frozenset(("id", "reason", "metrics_before", "metrics_after", "features", "model", "generator",
                          "original_source", "candidate_source")),
}
_PRIOR_SCHEMA: dict[str, tuple[str, ...]] = {"technique": ("str",), "predicted_speedup": ("number",),
                                             "confidence": ("number",), "attempts": ("int",), "successes": ("int",)}
_KEY_SCHEMA: dict[str, tuple[str, ...]] = {"value": ("number",), "weight": ("number",), "scale": ("number", "null"),
                                           "bound": ("str", "null")}


#: Largest attempt count a prior may hold: each attempt is one verification on a GPU (seconds), so a billion
#: is decades of one GPU's time. (An imported ``2**64`` did not fit SQLite's 64-bit integer at all.)
MAX_COUNT = 10**9
#: Largest speedup an attempt or a prior may hold. A speedup is the ratio of two medians of CUDA-event times
#: of the same kernel on the same inputs: events resolve about 0.5 µs and a launch costs a few µs by itself,
#: so a ratio of 10^6 means a launch of over a second redone within a launch's own cost, which no rewrite of
#: the same work does (the largest this project's runs recorded is 40x). Above it a record is corrupt or
#: hostile, and it would rule the knowledge base's means: one 1e308 made it predict 1e307x for a technique.
MAX_SPEEDUP = 1e6
#: Integers SQLite stores (64-bit signed).
_INT64 = 2**63


def _kind_ok(value: Any, kinds: tuple[str, ...]) -> bool:
    for kind in kinds:
        if kind == "str" and isinstance(value, str):
            return True
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "bool" and isinstance(value, bool):
            return True
        if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return math.isfinite(float(value))
            except OverflowError:
                return False
        if kind == "null" and value is None:
            return True
        if kind == "object" and isinstance(value, dict):
            return True
        if kind == "list" and isinstance(value, list):
            return True
    return False


def _fields(record: Mapping[str, Any], schema: Mapping[str, tuple[str, ...]], optional: frozenset[str],
            where: str) -> list[str]:
    problems = [f"{where}unknown field '{key}'" for key in record if key not in schema]
    for key, kinds in schema.items():
        if key not in record:
            if key not in optional:
                problems.append(f"{where}missing field '{key}'")
        elif not _kind_ok(record[key], kinds):
            shown = type(record[key]).__name__ if not isinstance(record[key], float) else repr(record[key])
            problems.append(f"{where}'{key}' must be {' or '.join(kinds)}, got {shown}")
        elif isinstance(record[key], int) and not isinstance(record[key], bool) and abs(record[key]) >= _INT64:
            problems.append(f"{where}'{key}' is out of range (a 64-bit integer at most)")
    return problems


def validate_export_record(record: Any) -> list[str]:
    """Every way ``record`` (one parsed line of an export) breaks the export schema; empty when it is valid.

    Types are checked exactly (no coercion: ``"accepted": "false"`` is a string, not a boolean), numbers
    must be finite, priors must be consistent (``0 <= successes <= attempts``, confidence in [0, 1], no
    technique twice). Whether an attempt's state exists is the store's question, not the schema's.
    """
    if not isinstance(record, dict):
        return [f"a record is a JSON object, got {type(record).__name__}"]
    kind = record.get("type")
    if kind not in EXPORT_SCHEMA:
        return [f"unknown record type {kind!r}" if isinstance(kind, str) or kind is None else "'type' must be a string"]
    problems = _fields(record, EXPORT_SCHEMA[kind], EXPORT_OPTIONAL[kind], "")
    if kind == "state" and not problems:
        if not record["name"]:
            problems.append("'name' is empty")
        for key, spec in record["signature"].items():
            if not isinstance(spec, dict):
                problems.append(f"signature.{key} must be an object")
                continue
            problems += _fields(spec, _KEY_SCHEMA, frozenset(("weight", "scale", "bound")), f"signature.{key}: ")
            if spec.get("bound") not in (None, "min", "max"):
                problems.append(f"signature.{key}: 'bound' must be 'min', 'max' or null")
            if isinstance(spec.get("scale"), (int, float)) and not isinstance(spec.get("scale"), bool) and spec["scale"] <= 0:
                problems.append(f"signature.{key}: 'scale' must be > 0")
        seen: set[str] = set()
        for i, prior in enumerate(record.get("priors", [])):
            where = f"priors[{i}]: "
            if not isinstance(prior, dict):
                problems.append(f"{where}must be an object")
                continue
            found = _fields(prior, _PRIOR_SCHEMA, frozenset(), where)
            problems += found
            if found:
                continue
            if prior["technique"] in seen:
                problems.append(f"{where}technique '{prior['technique']}' appears twice")
            seen.add(prior["technique"])
            if not 0 <= prior["successes"] <= prior["attempts"]:
                problems.append(f"{where}needs 0 <= successes <= attempts")
            if prior["attempts"] > MAX_COUNT:
                problems.append(f"{where}attempts must be at most {MAX_COUNT:,}")
            if not 0.0 <= prior["confidence"] <= 1.0:
                problems.append(f"{where}confidence must lie in [0, 1]")
            if not 0 < prior["predicted_speedup"] <= MAX_SPEEDUP:
                problems.append(f"{where}predicted_speedup must lie in (0, {MAX_SPEEDUP:g}]")
    if kind == "attempt" and not problems:
        for key in ("metrics_before", "metrics_after"):
            bad = [k for k, v in record.get(key, {}).items() if not _kind_ok(v, ("number", "null"))]
            if bad:
                problems.append(f"{key}.{bad[0]} must be a finite number")
        if record.get("speedup") is not None and not 0 < record["speedup"] <= MAX_SPEEDUP:
            problems.append(f"'speedup' must lie in (0, {MAX_SPEEDUP:g}] or be null (a measured ratio of GPU times)")
    return problems
