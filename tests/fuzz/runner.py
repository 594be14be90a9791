"""A bounded schemathesis run against a live server's OpenAPI document.

For every operation in the document, hypothesis draws requests from the schema, schema-valid
(positive) and schema-violating (negative) ones, sends them over HTTP and checks each response:
no 5xx, a status and content type the document declares, a body that matches the declared schema
(each SSE event included), and every negative request refused with a 4xx.

Not checked: that every schema-valid request is accepted. Some are refused for reasons JSON Schema
cannot express (a prompt plus ``max_tokens`` over the context window, an engine without
``min_p``); those are 400s with a message, and the tests count them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks

EXCLUDED = [checks.positive_data_acceptance]


@dataclass
class Report:
    statuses: Counter = field(default_factory=Counter)  # (operation, mode, status) -> count
    failures: list[str] = field(default_factory=list)
    num_requests: int = 0
    seconds: float = 0.0

    def count(self, operation: str, status: int, mode: str | None = None) -> int:
        return sum(n for (op, m, s), n in self.statuses.items()
                   if op == operation and s == status and (mode is None or m == mode))

    def server_errors(self) -> int:
        return sum(n for (_, _, s), n in self.statuses.items() if s >= 500)


def fuzz(
    base_url: str,
    *,
    max_examples: int,
    prepare: Callable[[Any], None] | None = None,
    headers: dict[str, str] | None = None,
    operations: set[str] | None = None,
) -> Report:
    """Fuzz every operation of ``base_url``'s document (or those named in ``operations``)."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    schema.config.update(base_url=base_url)
    report = Report()
    start = time.monotonic()
    for result in schema.get_all_operations():
        op = result.ok()
        if operations is not None and op.label not in operations:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _run(op, mode, report, max_examples, prepare, headers)
    report.seconds = time.monotonic() - start
    return report


def _run(op: Any, mode: Any, report: Report, max_examples: int, prepare: Any, headers: Any) -> None:
    try:
        strategy = op.as_strategy(generation_mode=mode)
    except Exception:  # an operation with nothing to make negative (no parameters, no body)
        return

    @given(case=strategy)
    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        if prepare is not None:
            prepare(case)
        try:
            response = case.call(headers=headers, timeout=30)
        except Exception as exc:  # a reset connection is a failure too
            report.failures.append(f"{op.label} [{mode.value}] transport: {type(exc).__name__}: {exc}"
                                   f"\nbody: {str(case.body)[:1500]}")
            return
        report.num_requests += 1
        report.statuses[(op.label, mode.value, response.status_code)] += 1
        try:
            case.validate_response(response, excluded_checks=EXCLUDED, headers=headers)
        except Exception as exc:
            report.failures.append(f"{op.label} [{mode.value}] {str(exc)[:2000]}")

    try:
        run()
    except Unsatisfiable:  # nothing to make negative in an operation without inputs
        assert mode == GenerationMode.NEGATIVE, op.label
