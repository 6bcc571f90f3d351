"""Background threads give way to the event loop while it handles messages.

A hover answered from the last index takes about a millisecond of Python on the
event loop. A re-index running on a worker thread at the same time (for a
``documentSymbol`` sent a few keystrokes earlier; with a ``for (`` typed and not
yet closed, tree-sitter's error recovery reparses half of a 10,000-line file
and the index re-analyses it, a few hundred ms) shares the GIL with it: the
interpreter takes the GIL from the worker for the loop after the switch
interval and gives it back a switch interval later, so the loop gets about
half of the time, and on a busy machine each hand-over also waits for a CPU.
Measured (a hover 10 ms after every keystroke while typing at 20 ms a keystroke
into the 10,000-line file of ``benchmarks/lsp_latency.py``, a documentSymbol
every 20 keystrokes), hovers that met a re-index took p50 7-8 ms and p90
17-20 ms; with the parse's progress callback as a yield point p50 5 ms, p90
9-10 ms; with the pauses too p50 3.8-4.1 ms, p90 6.4-8.5 ms.

So the thread that reads stdin marks the loop busy as soon as bytes arrive, and
long background work (the reparse, the analysis of changed functions, the
outline's encoding) calls :meth:`Foreground.give_way` at its yield points:
while the loop is busy it waits, off the GIL, until the loop has handled every
message that arrived. A pause lasts at most :data:`MAX_PAUSE_S`, and once one
has run out, yield points do not wait again until the loop has been idle: a
loop that stays busy (a long stream of edits) or waits for a lock the paused
work holds (the loop's own reparse after many deferred edits) costs background
work one pause, not one per yield point. On the loop's own thread ``give_way``
returns at once (a small document is indexed there).
"""

from __future__ import annotations

import threading

#: The longest a background step waits for a busy loop, in seconds.
MAX_PAUSE_S = 0.05


class Foreground:
    """Whether the event loop is handling messages, for background threads to give way to it."""

    def __init__(self) -> None:
        self._idle = threading.Event()
        self._idle.set()
        self._loop_thread: int | None = None
        self._period = 0
        """Counts the busy periods (from idle to busy)."""
        self._waited_out = -1
        """The busy period in which a pause ran out (no more pauses in it)."""

    def bind(self) -> None:
        """Record the calling thread as the loop's (its own ``give_way`` calls never wait)."""
        self._loop_thread = threading.get_ident()

    def busy(self) -> None:
        """Messages arrived (any thread): background work pauses at its next yield point."""
        if self._idle.is_set():
            self._period += 1
        self._idle.clear()

    def idle(self) -> None:
        """The loop handled what arrived: background work goes on."""
        self._idle.set()

    def off_loop(self) -> bool:
        """True on any thread but the loop's (where the preprocessor may run)."""
        return threading.get_ident() != self._loop_thread

    @property
    def is_busy(self) -> bool:
        return not self._idle.is_set()

    def give_way(self) -> None:
        """A background thread's yield point: wait while the loop is busy (at most :data:`MAX_PAUSE_S`,
        and not again in a busy period where a pause ran out)."""
        if self._idle.is_set() or threading.get_ident() == self._loop_thread:
            return
        period = self._period
        if period != self._waited_out and not self._idle.wait(MAX_PAUSE_S):
            self._waited_out = period
