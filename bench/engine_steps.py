"""One engine step by rows, with CUDA graphs and eagerly, side by side in one process.

    python -m bench.engine_steps [--json] [--model ID_OR_GGUF] [--context 512]

Loads the engine once (CUDA when present) and times ``ModelRunner.execute`` (inputs, forward,
head, sampler) on synthetic decode steps at a ``--context``-token context: one sequence with
1 + K rows (a speculative verify step) and B sequences of one row (batched decode), medians of 40
steps after 5 warm-up ones; then ``LLMEngine.generate``: one stream and 16 concurrent requests of
128 greedy tokens. On CUDA this runs twice, with the runner's decode graphs and with them detached
(``graphs_over_eager`` ratios; the 16 outputs of both are compared); elsewhere eagerly only.
``first_step_ms`` is each shape's first step (on CUDA it includes capturing a new bucket).
Pair it with ``bench.gguf_twin`` to time a model whose weights cannot be copied to the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from hybridllm._cli_options import positive_int

MAX_MODEL_LEN = 2048  # the engine's window here
MAX_ROWS = 8  # the largest verify step timed: context + 8 rows must fit the window


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="catalog id or .gguf")
    ap.add_argument("--context", type=positive_int, default=512,
                    help=f"context of the timed steps (1 to {MAX_MODEL_LEN - MAX_ROWS}, default 512)")
    args = ap.parse_args(argv)
    if args.context > MAX_MODEL_LEN - MAX_ROWS:  # refused now, not by the engine after the load
        ap.error(f"--context takes at most {MAX_MODEL_LEN - MAX_ROWS} (a {MAX_MODEL_LEN}-token window "
                 f"less {MAX_ROWS} verify rows), got {args.context}")

    import torch

    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import ScheduledSeq
    from cloud_server.engine.sequence import Sequence
    from cloud_server.exceptions import ServerError

    t0 = time.perf_counter()
    try:
        eng = LLMEngine(EngineConfig(args.model, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=2 << 30))
    except ServerError as exc:  # an unknown model, a bad file: one line, no traceback
        ap.error(str(exc))
    load_s = time.perf_counter() - t0
    runner, bs, dev = eng.runner, eng.config.block_size, eng.device
    graphs = runner.graphs
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)

    def steps(batch: int, rows: int) -> list[ScheduledSeq]:
        ctx, out = args.context, []
        nb = -(-(ctx + rows) // bs)
        for b in range(batch):
            ids = torch.randint(0, 1000, (ctx + rows,), generator=gen).tolist()
            seq = Sequence(f"s{b}", ids[:ctx], SamplingParams(temperature=0.0, max_tokens=64))
            seq.token_ids = ids
            seq.block_table = list(range(b * nb, (b + 1) * nb))
            seq.num_computed_tokens = ctx
            out.append(ScheduledSeq(seq, num_new_tokens=rows, num_lookahead=rows - 1))
        return out

    first_ms: dict[str, float] = {}

    def timed(batch: int, rows: int, n: int = 40) -> float:
        sched = steps(batch, rows)
        sync()
        t = time.perf_counter()
        runner.execute(sched)
        sync()
        # the first time a shape is seen (1x1 comes up twice: a 1-row verify, a batch of one)
        first_ms.setdefault(f"{batch}x{rows}", round((time.perf_counter() - t) * 1e3, 1))
        for _ in range(4):
            runner.execute(sched)
        sync()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            runner.execute(sched)
            sync()
            ts.append(time.perf_counter() - t)
        return round(statistics.median(ts) * 1e3, 3)

    def generate() -> tuple[float, float, list[list[int]]]:
        p = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
        eng.generate(["Write a haiku about GPUs."], p)
        t = time.perf_counter()
        one = eng.generate(["Explain paged attention in two paragraphs."], p)[0]
        one_tps = len(one.token_ids) / (time.perf_counter() - t)
        t = time.perf_counter()
        outs = eng.generate([f"Question {i}: explain KV caches." for i in range(16)], p)
        c16_tps = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
        return round(one_tps, 1), round(c16_tps, 1), [o.token_ids for o in outs]

    report: dict = {"model": eng.model_name, "device": str(dev), "load_s": round(load_s, 1),
                    "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                    "context": args.context}
    outputs = {}
    for mode in ("graphs", "eager") if graphs is not None else ("eager",):
        runner.graphs = graphs if mode == "graphs" else None
        r: dict = {"verify_ms": {k: timed(1, k) for k in (1, 2, 3, 5, MAX_ROWS)},
                   "batch_ms": {b: timed(b, 1) for b in (1, 4, 16)}}
        r["single_stream_tok_s"], r["c16_tok_s"], outputs[mode] = generate()
        r["first_step_ms"] = dict(first_ms)
        first_ms.clear()
        report[mode] = r
    runner.graphs = graphs
    if graphs is not None:
        report["num_graphs"] = graphs.num_graphs
        pairs = zip(outputs["graphs"], outputs["eager"], strict=True)
        report["c16_outputs_equal"] = sum(a == b for a, b in pairs)
        report["graphs_over_eager"] = {k: round(report["graphs"][k] / report["eager"][k], 2)
                                       for k in ("single_stream_tok_s", "c16_tok_s")}
    if dev.type == "cuda":
        report["max_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    if args.json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
