"""Every exception of both trees (hybridllm's and the cloud server's) survives pickle, copy and
deepcopy whole: type, args, message and every attribute, as one raised in a worker process
(multiprocessing, Ray) must reach the parent (helper-h4, review 18)."""

from __future__ import annotations

import copy
import inspect
import pickle
from pathlib import Path

import pytest

import cloud_server.exceptions as server_exc
import hybridllm._exceptions as sdk_exc
from cloud_server.config import SettingError
from hybridllm._paths import BrokenInstallError
from hybridllm.models.remove import RemoveIncompleteError

# the classes whose constructor takes more than a message, with their real arguments
_SPECIAL = {
    sdk_exc.ContextWindowExceededError: lambda c: c("too long", prompt_tokens=5000, context_length=4096),
    sdk_exc.CloudError: lambda c: c("down", status_code=503, prompt_tokens=9, context_length=8,
                                     retry_after_s=2.5),
    sdk_exc.CloudBudgetSpentError: lambda c: c("spent", reason="room at 10:00", prompt_tokens=1,
                                               context_length=2, retry_after_s=60.0),
    server_exc.InvalidRequestError: lambda c: c("bad", param="temperature"),
    server_exc.QueueFullError: lambda c: c("full", retry_after_s=3.0),
    server_exc.EngineError: lambda c: c("failed", request_ids=["a", "b"]),
}


def _tree(module):
    return [c for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == module.__name__]


def _make(cls):
    for base in cls.__mro__:
        if base in _SPECIAL:
            return _SPECIAL[base](cls)
    return cls(f"{cls.__name__} message")


_CASES = [_make(c) for c in _tree(sdk_exc) + _tree(server_exc)] + [
    BrokenInstallError("This hybridllm install is incomplete: catalog.json is missing."),
    # a FileNotFoundError as the OS raises it: errno, strerror and the file's name
    BrokenInstallError(2, "No such file or directory", "/site-packages/hybridllm/_data/catalog.json"),
    RemoveIncompleteError("some left", [Path("/a")], [(Path("/b"), "permission denied")], 123),
    SettingError("{0} must be at least 1", "max_num_seqs", got=0),
]
_WAYS = {"pickle": lambda e: pickle.loads(pickle.dumps(e)), "copy": copy.copy, "deepcopy": copy.deepcopy}


def test_every_class_of_both_trees_is_covered():
    assert len(_tree(sdk_exc)) >= 22 and len(_tree(server_exc)) >= 12


@pytest.mark.parametrize("way", sorted(_WAYS))
@pytest.mark.parametrize("err", _CASES, ids=lambda e: type(e).__name__)
def test_round_trips_whole(err, way):
    back = _WAYS[way](err)
    assert type(back) is type(err)
    assert back.args == err.args and str(back) == str(err)
    assert vars(back) == vars(err)


@pytest.mark.parametrize("way", sorted(_WAYS))
def test_broken_install_error_keeps_its_file_name(way):
    """Before: pickle and copy rebuilt it from args alone, and OSError keeps the file's name out
    of args: the copy said "[Errno 2] No such file or directory" with filename None."""
    err = BrokenInstallError(2, "No such file or directory", "/x/_data/catalog.json")
    back = _WAYS[way](err)
    assert (back.errno, back.strerror, back.filename) == (2, "No such file or directory",
                                                          "/x/_data/catalog.json")
    assert str(back) == str(err) == "[Errno 2] No such file or directory: '/x/_data/catalog.json'"
    assert isinstance(back, FileNotFoundError) and isinstance(back, sdk_exc.HybridLLMError)


def test_a_note_added_to_an_error_survives():
    err = sdk_exc.CloudBudgetSpentError("spent", reason="r")
    err.add_note("while answering request 7")
    assert pickle.loads(pickle.dumps(err)).__notes__ == ["while answering request 7"]
