"""Only the catalog's sizes and counts must not be below 0 (review 31).

Review 30's check refused a negative number in any field of an entry. Every number the schema
has today is a size or a count (``files[*].size``, ``context_length``, ``dimensions``, a parts
source's ``count``), so the check now names those fields and leaves the sign of any other
number alone: a future signed field (a score, an offset, a bias) loads. A number that is not
finite is still refused anywhere (JSON has no NaN or Infinity).
"""

from __future__ import annotations

import json
import re

import pytest

from hybridllm import HybridLLMError
from hybridllm.models import catalog

from .test_catalog_numbers_review30 import _catalog_text, _entry, shipped  # noqa: F401 - fixture


def test_a_negative_number_in_a_field_that_is_no_size_or_count_loads(shipped):  # noqa: F811
    signed = _entry("signed-one", score=-0.5, bias=-3,
                    source={"type": "file", "path": "p/a.gguf", "offset": -128},
                    tuning={"temperature_shift": [-0.25, 0.5]})
    shipped.write_text(json.dumps({"version": 1, "models": [_entry("good-one"), signed]}))
    spec = catalog.get_spec("signed-one")
    assert spec.extra["score"] == -0.5 and spec.extra["bias"] == -3
    assert spec.source["offset"] == -128 and spec.extra["tuning"]["temperature_shift"] == [-0.25, 0.5]


@pytest.mark.parametrize("field, where", [("size", "files['a.gguf'].size"),
                                          ("context_length", "context_length"),
                                          ("dimensions", "dimensions"), ("count", "source.count")])
def test_the_named_sizes_and_counts_still_refuse_a_negative(shipped, field, where):  # noqa: F811
    if field == "size":
        entry = _entry("bad-one", files={"a.gguf": {"sha256": "00", "size": "@@"}})
    elif field == "count":
        entry = _entry("bad-one", source={"type": "parts", "package": "p{i}",
                                          "path": "p{i}/part{i:02d}.bin", "count": "@@"})
    else:
        entry = _entry("bad-one", **{field: "@@"})
    shipped.write_text(_catalog_text(entry, field, "-5"), encoding="utf-8")
    with pytest.raises(HybridLLMError, match=re.escape(f"'bad-one' has {where} = -5")):
        catalog.load_catalog()


@pytest.mark.parametrize("literal", ["NaN", "-1e999"])
def test_a_signed_field_must_still_be_finite(shipped, literal):  # noqa: F811
    shipped.write_text(_catalog_text(_entry("bad-one", score="@@"), "score", literal), encoding="utf-8")
    with pytest.raises(HybridLLMError, match="'bad-one' has score = .*must be a finite number"):
        catalog.load_catalog()
