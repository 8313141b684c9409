"""Commands that blocklab prints for the user to paste into a shell, each word quoted (`shlex`).

A path goes into such a command as the user named it, and a name may hold anything a shell reads:
a space splits it, ``$HOME`` expands, ``;`` ends the command and runs what follows. Every printed
command is built here, so that each word reaches the program as it was meant; placeholders the user
fills in (``RUN``, ``max_steps=...``) hold no such character and print as they are.
"""

from __future__ import annotations

import os
import shlex


def pasteable(*words: str | os.PathLike[str]) -> str:
    """The command of `words`, each quoted for a POSIX shell where it needs it."""
    return shlex.join(os.fspath(w) for w in words)
