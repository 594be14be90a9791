"""The engine's CPU matmul kernels against torch's, on a real model's weights, by rows.

    python -m bench.cpu_kernels [--json] [--model ID_OR_GGUF] [--threads 1] [--rows 1,2,3,4,5,8,16]

Loads the model's weights twice in one process, as the engine does on a CPU (int4 default: the
GGUF's 4-bit matrices as int4 groups, the rest as int8 groups of 32, bf16 activations): once in
the engine's own kernel formats (``cloud_server/layers/cpu_kernels.cpp``) and once with
``HYBRIDLLM_CPU_KERNELS=0`` (torch's ``_weight_int4pack_mm_for_cpu``, and ``_weight_int8pack_mm``
with one scale per row, 1 byte a weight against the groups' 1.125).
Then it times one pass through every quantized matrix of the model (all layers and the output
head: what one decode step reads) at each row count, alternating the two sides, median of
``--repeats`` passes. ``torch_over_ours`` > 1 means ours is faster; ``*_rows_over_one`` is a row
count's time over one row's (what a speculative verify row costs). Needs x86-64 AVX-512 VNNI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from hybridllm._cli_options import positive_int


def _layers(model_path: str, kernels: bool):
    import torch

    from cloud_server.layers import cpu_kernels
    from cloud_server.layers.linear import Linear
    from cloud_server.models import loader

    os.environ["HYBRIDLLM_CPU_KERNELS"] = "1" if kernels else "0"
    cpu_kernels.reset()
    model = loader.load_model(model_path, device=torch.device("cpu"), dtype=torch.bfloat16,
                              max_position=256, quantization="int4").model
    mats = [m for m in model.modules() if isinstance(m, Linear) and m.weight is not None
            and (m.int4 or m.scale is not None or m.blocks)]
    return model, mats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="catalog id or .gguf")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    ap.add_argument("--rows", default="1,2,3,4,5,8,16", help="row counts, comma-separated")
    ap.add_argument("--repeats", type=positive_int, default=7, help="timed passes per side and row count")
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
        if not rows or min(rows) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--rows takes positive integers separated by commas, got {args.rows!r}")

    import torch

    from cloud_server.exceptions import ServerError
    from cloud_server.layers import cpu_kernels
    from hybridllm.models import pull

    torch.set_num_threads(args.threads)
    if cpu_kernels.int4_mm() is None:
        ap.error("the engine's CPU kernels are not available here (x86-64 AVX-512 VNNI and g++ needed)")
    try:
        path = args.model if args.model.endswith(".gguf") else str(pull(args.model))
        print("loading the model in both formats ...", file=sys.stderr)
        ours_model, ours = _layers(path, kernels=True)
        torch_model, theirs = _layers(path, kernels=False)
    except (ServerError, OSError, ValueError, KeyError) as exc:  # a bad model: one line, no traceback
        ap.error(str(exc))
    finally:
        os.environ.pop("HYBRIDLLM_CPU_KERNELS", None)
        cpu_kernels.reset()
    weight_mb = sum(t.numel() * t.element_size() for m in ours for t in (m.weight, m.scale)
                    if t is not None) / 1e6  # what a pass reads: codes and the groups' scales

    def one_pass(mats, xs):
        for m in mats:
            m(xs[m.in_features])

    result = {"model": os.path.basename(path), "threads": args.threads, "matrices": len(ours),
              "weights_mb": round(weight_mb, 1), "rows": {}}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for r in rows:
            widths = {m.in_features for m in ours}
            xs = {k: torch.randn(r, k, generator=gen).to(torch.bfloat16) for k in widths}
            times: dict[str, list[float]] = {"ours": [], "torch": []}
            for mats in (ours, theirs):
                one_pass(mats, xs)  # warm-up
            for _ in range(args.repeats):  # alternate the sides: drifting load hits both alike
                for side, mats in (("ours", ours), ("torch", theirs)):
                    t = time.perf_counter()
                    one_pass(mats, xs)
                    times[side].append(time.perf_counter() - t)
            ours_ms = statistics.median(times["ours"]) * 1e3
            torch_ms = statistics.median(times["torch"]) * 1e3
            result["rows"][str(r)] = {"ours_ms": round(ours_ms, 2), "torch_ms": round(torch_ms, 2),
                                      "torch_over_ours": round(torch_ms / ours_ms, 2)}
            print(f"{r:>3} rows: ours {ours_ms:7.2f} ms, torch {torch_ms:7.2f} ms", file=sys.stderr)
    one = result["rows"].get("1")
    if one:
        for v in result["rows"].values():
            v["ours_rows_over_one"] = round(v["ours_ms"] / one["ours_ms"], 2)
            v["torch_rows_over_one"] = round(v["torch_ms"] / one["torch_ms"], 2)
    del ours_model, torch_model
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
