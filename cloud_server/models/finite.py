"""Load-time check that a model's weights are finite numbers.

One NaN or inf weight makes every answer garbage (or NaN logits, a sampling failure deep in a
step), so a checkpoint that holds one is refused at start, naming the tensor and its file.
"""

from __future__ import annotations

import torch

from ..exceptions import ModelLoadError

_REDOWNLOAD = ("the file is damaged (or was saved from a diverged run): download it again (a "
               "catalog model: `hybridllm models pull ID --force`) or pick another checkpoint")


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite (an integer tensor always is).

    One reduction instead of an ``isfinite`` mask (a pass that allocates, several times slower on
    a CPU): a sum is finite only when every term is (NaN and inf carry through every addition).
    A finite tensor whose sum overflows is then checked value by value."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def not_finite_error(name: str, where: str, t: torch.Tensor, *, row_offset: int = 0,
                     what: str = "weights") -> ModelLoadError:
    """The error for tensor ``name`` of file ``where`` whose ``t`` (all of it, or a band of its
    rows starting at ``row_offset``) holds a NaN or inf: where the first one is, and what to do."""
    bad = ~torch.isfinite(t)
    first = [int(i) for i in bad.nonzero()[0].tolist()] if t.dim() else []
    kind = "NaN" if bool(torch.isnan(t[tuple(first)] if first else t)) else "inf"
    if first:
        first[0] += row_offset  # its row in the whole matrix
    count = int(bad.sum())
    more = f" and {count - 1} more" if count > 1 else ""
    prefix = f"{where}: " if where else ""
    return ModelLoadError(f"{prefix}tensor {name}: {what} not finite ({kind} at {first}{more}); "
                          f"{_REDOWNLOAD}")


def out_of_range_error(name: str, where: str, src: torch.Tensor, dtype: torch.dtype) -> ModelLoadError:
    """The error for finite weights that a narrower ``dtype`` (float16) cannot hold."""
    prefix = f"{where}: " if where else ""
    dtype_name = str(dtype).removeprefix("torch.")
    return ModelLoadError(
        f"{prefix}tensor {name}: weights up to {float(src.abs().max()):g} do not fit {dtype_name} "
        "(they become inf); load the model with dtype bfloat16 or float32 (--dtype bfloat16)")


def check_converted(name: str, where: str, src: torch.Tensor, out: torch.Tensor,
                    row_offset: int = 0) -> None:
    """Refuse tensor ``name`` if its converted ``out`` (of ``src``) holds a NaN or inf: checked
    in what the model will use (on the GPU where loading to one), which also catches a cast to
    float16 that overflows."""
    if all_finite(out):
        return
    if all_finite(src):
        raise out_of_range_error(name, where, src, out.dtype)
    raise not_finite_error(name, where, src, row_offset=row_offset)
