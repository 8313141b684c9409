"""How long a test waits for a child process: `patient(seconds)`.

A test's time limit on a subprocess (``timeout=``, or a deadline it polls against) is there to stop a
hung child from stalling the suite, never to judge speed: a CI machine is shared, and a check that
takes 21 s alone took over 120 s on a loaded 2-core machine (issue 57). So every such limit is
`patient(s)`: `s`, the time the child takes on an idle machine with some room, times
`BLOCKLAB_TEST_TIMEOUT_SCALE` (default 10), so that a green suite does not depend on the load. A
slower machine, or one that wants a hang caught sooner, sets the variable.
"""

from __future__ import annotations

import os

DEFAULT_SCALE = 10.0


def scale() -> float:
    """BLOCKLAB_TEST_TIMEOUT_SCALE when set to a positive number, else DEFAULT_SCALE."""
    try:
        value = float(os.environ.get("BLOCKLAB_TEST_TIMEOUT_SCALE", DEFAULT_SCALE))
    except ValueError:
        return DEFAULT_SCALE
    return value if value > 0 else DEFAULT_SCALE


def patient(seconds: float) -> float:
    """The limit for a wait that takes up to `seconds` on an idle machine (see the module docstring)."""
    return seconds * scale()
