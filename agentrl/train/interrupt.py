"""Ctrl-C during training: finish the step, save, stop (a second Ctrl-C interrupts at once).

Why its own module: a run killed mid-step loses the step and leaves no checkpoint to resume from;
catching the first SIGINT as a flag lets the loop end at a step boundary with a checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[threading.Event]:
    """A first Ctrl-C asks the loop to stop after the current step (the event is set); a second one
    interrupts at once. Outside the main thread signals cannot be caught: the event stays unset."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # installed outside Python: fall back to the usual KeyboardInterrupt
        previous = signal.default_int_handler

    def handler(signum: int, frame: Any) -> None:
        stop.set()  # the loop says what happened, in one line, once the step is saved
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
