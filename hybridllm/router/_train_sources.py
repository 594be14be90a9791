"""Several labelled files pooled into one training set: which source each row came from, and its weight."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._exceptions import DataError
from .dataset import RoutingData
from .fit import share_fractions


@dataclass(frozen=True)
class Sources:
    """Which source each row of a pooled :class:`RoutingData` came from, and its weight."""

    names: list[str]  # one per source
    ids: np.ndarray  # [n] int index into names
    weights: list[float]  # relative total weight of each source
    given: bool = True  # False: the default (equal shares pooled, row counts in a mixture's gate)

    def gate_shares(self) -> list[float] | None:
        """The source gate's class shares: the given weights, or None (by row count)."""
        return list(self.weights) if self.given else None

    def sample_weight(self) -> np.ndarray | None:
        """``[n]`` per-row weights (mean 1) giving each source its share; None for one source."""
        if len(self.names) < 2:
            return None
        counts = np.bincount(self.ids, minlength=len(self.names)).astype(np.float64)
        share = share_fractions(self.weights)
        per_row = share / np.maximum(counts, 1) * len(self.ids)
        return per_row[self.ids]


def pool(
    parts: list[tuple[str, RoutingData]],
    weights: list[float] | None = None,
) -> tuple[RoutingData, Sources]:
    """Stack labelled files into one :class:`RoutingData` (``weak``/``strong`` mean the edge and the
    cloud side of each file's own pair) and record where each row came from."""
    if not parts:
        raise DataError("Pass at least one --data file.")
    given = weights is not None
    if weights is None:  # equal shares: a big public file does not drown a small one of your pair
        weights = [1.0] * len(parts)
    if len(weights) != len(parts) or not all(0 < w < float("inf") for w in weights):
        raise DataError(
            f"Give one positive, finite --weight per --data file ({len(parts)} files, "
            f"{len(weights)} weights)."
        )
    if len(parts) > 1 and not np.all(share_fractions(weights) > 0):
        raise DataError(
            f"The --weight values ({', '.join(f'{w:g}' for w in weights)}) are too far apart: the "
            "smallest is no share at all beside the largest. Give shares in a smaller range."
        )
    if len(parts) == 1:
        name, data = parts[0]
        return data, Sources([name], np.zeros(len(data.prompts), np.int64), list(weights), given)
    lps = [
        d.edge_logprob if d.edge_logprob is not None else np.full(len(d.prompts), np.nan) for _, d in parts
    ]
    any_lp = any(d.edge_logprob is not None for _, d in parts)
    pooled = RoutingData(
        prompts=[p for _, d in parts for p in d.prompts],
        weak=np.concatenate([d.weak for _, d in parts]),
        strong=np.concatenate([d.strong for _, d in parts]),
        weak_col=" + ".join(d.weak_col for _, d in parts),
        strong_col=" + ".join(d.strong_col for _, d in parts),
        edge_logprob=np.concatenate(lps) if any_lp else None,
    )
    ids = np.concatenate([np.full(len(d.prompts), i, np.int64) for i, (_, d) in enumerate(parts)])
    return pooled, Sources([n for n, _ in parts], ids, list(weights), given)
