"""A client in a fork of the process that made it: the message, and the test for it.

A fork copies only the thread that forked, so none of a client's threads (its loop, the device
worker) run in the child: a call there waited for ever. The client records its process and checks it.
"""

from __future__ import annotations

import os

# (a client created in the child works, but where the parent answered on llama.cpp, on one thread:
# llama.cpp's thread pool is not in the child either; see llama_cpp._POOL_PID)
FORKED = ("This client was created in process {pid}, and this is process {here}, a fork of it: a fork "
          "copies only the thread that forked, not the client's threads (nor llama.cpp's). Start the "
          "processes with the 'spawn' method (multiprocessing.get_context('spawn')), or create a client "
          "in each child and use none in the parent before it forks.")


def forked_from(pid: int) -> bool:
    """Whether this process is a fork of process ``pid`` (where a client's threads ran)."""
    return os.getpid() != pid
