"""Review 13: the router's numbers from numpy (a float32 threshold or share was refused as "not a
number in [0, 1]"), and a NaN confidence floor that silently turned the cascade off."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from hybridllm._exceptions import RouterError
from hybridllm.router.router import Router, load_router

from .fakes import length_router


def test_a_numpy_float32_threshold_is_a_number(tmp_path) -> None:
    r = Router(scorer=length_router().scorer, threshold=np.float32(0.25), use_embedding=False)
    assert r.threshold == 0.25 and type(r.threshold) is float  # saved as a JSON number
    folder = r.save(tmp_path / "r")
    assert json.loads((folder / "router.json").read_text())["threshold"] == 0.25
    assert load_router(folder).threshold == 0.25


def test_calibrated_takes_a_numpy_share() -> None:
    r = length_router()
    prompts = ["a", "bb " * 20, "ccc " * 40, "dddd " * 80]
    assert r.calibrated(prompts, np.float32(0.5)).threshold == r.calibrated(prompts, 0.5).threshold


@pytest.mark.parametrize("bad", [math.nan, "-1", None, True])
def test_a_confidence_floor_that_is_not_a_number_is_refused(bad: object) -> None:
    # NaN: every mean_logprob < NaN is False, so a cascade never escalated, with no error; a string
    # raised a TypeError at the first cascade instead of at construction
    with pytest.raises(RouterError, match="logprob_threshold must be a number"):
        dataclasses.replace(length_router(), logprob_threshold=bad)


def test_a_numpy_confidence_floor_still_works() -> None:
    r = dataclasses.replace(length_router(), logprob_threshold=np.float32(-0.5))
    assert r.should_escalate(-1.0) and not r.should_escalate(-0.25)


def test_a_share_that_rounds_to_every_prompt_sends_prompts_scoring_one_too():
    """Before: with the lowest score exactly 1.0 the threshold came out 1.0, which keeps every
    prompt on the device, for a share that rounds to all of them (0.9 of 3)."""
    from hybridllm.router.router import calibrate_threshold, sends_to_cloud

    t = calibrate_threshold([1.0, 1.0, 1.0], 0.9)
    assert t < 1.0 and sends_to_cloud(1.0, t)
    assert calibrate_threshold([0.2, 0.4, 0.6], 0.9) == 0.2
