"""Layout-explorer speed: layouts evaluated per second, pruned and cached against a
straightforward search, in the same run.

The problem is the issue's: Llama 3 405B on 16,384 H100s, 8,192-token sequences, 16M
tokens a step. A layout is one point of the search space (t, c, p, d, micro-batch,
schedule, v, recomputation, ZeRO stage).

* **explorer**: ``modelcut.core.explore.explore`` as shipped: each structure's
  recomputation × ZeRO variants share one memory pass, in-flight profiles are cached on an
  equivalent micro-batch count, only the cheapest variants that fit are predicted. It
  covers the whole space.
* **baseline**: what one would write first, on every k-th structure (all caches cleared
  first): for each variant, the full per-stage memory from the full schedule
  (``stage_memory(..., cached=False)``), and a step-time prediction for every variant that
  fits.

The script prints both rates, their ratio, and checks that on the structures the baseline
saw, the explorer's best step time per structure equals the baseline's (exit status 1 if
not). ``--acceptance`` also runs the issue's acceptance check: Llama 3 405B on 8,192 H100s,
where the published layout (tp 8, cp 1, pp 16, dp 64) must fit and come within 15 % of the
best predicted step time.

Run: ``python benchmarks/bench_explore.py`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import sys
import time

from modelcut import catalog
from modelcut.core import memory, plan
from modelcut.core.explore import RECOMPUTE_ORDER, ZERO_ORDER, Space, explore as core_explore, find, make_run, structures
from modelcut.core.sim import inflight
from modelcut.core.step import pipeline_time
from modelcut.service.explore import predictor


def clear_caches() -> None:
    for fn in (inflight._profile, inflight._orders, plan._coefficients, plan._build, pipeline_time._simulated):
        fn.cache_clear()


def explore(model, hw, **kw):
    return core_explore(model, hw, predictor("seed", hw), **kw)


def baseline(model, hw, gpus, seq, tokens, every: int):
    """The straightforward search over every ``every``-th structure."""
    gb = tokens // seq
    predict = predictor("seed", hw)
    limit = hw.mem_bytes * 0.98
    structs = list(structures(model, gpus, seq, gb, hw.per_node, Space()))[::every]
    best: dict = {}
    layouts = 0
    for s in structs:
        for r in RECOMPUTE_ORDER:
            for z in ZERO_ORDER:
                run = make_run(model, hw.name, s, seq, gb, r, z)
                layouts += 1
                peak = memory.peak_bytes(memory.stage_memory(run, vpp=s.vpp, schedule=s.schedule, cached=False))
                if peak <= limit:
                    t = predict(run, hw).step_time_s
                    best[s] = min(best.get(s, t), t)
    return layouts, best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--every", type=int, default=25, help="baseline: every k-th structure")
    ap.add_argument("--acceptance", action="store_true", help="also run the 8,192-GPU acceptance check")
    args = ap.parse_args(argv)
    model, hw = catalog.model("llama3-405b"), catalog.hardware("h100-sxm5-80gb")
    seq, tokens = 8192, 16 * 2**20

    clear_caches()
    t0 = time.perf_counter()
    ex = explore(model, hw, gpus=args.gpus, seq=seq, global_batch_tokens=tokens)
    t_fast = time.perf_counter() - t0
    rate_fast = ex.space / t_fast
    print(f"explorer: {ex.space:,} layouts ({ex.structures:,} structures) in {t_fast:.2f} s = "
          f"{rate_fast:,.0f} layouts/s; {ex.memory_evaluations:,} memory checks, {ex.predictions:,} predictions; "
          f"best {ex.layouts[0].step_time_s:.3f} s")

    clear_caches()
    t0 = time.perf_counter()
    n_base, best_base = baseline(model, hw, args.gpus, seq, tokens, args.every)
    t_base = time.perf_counter() - t0
    rate_base = n_base / t_base
    print(f"baseline: {n_base:,} layouts (every {args.every}th structure) in {t_base:.2f} s = "
          f"{rate_base:,.0f} layouts/s")
    print(f"ratio: {rate_fast / rate_base:.1f}x layouts per second")

    best_fast: dict = {}
    for e in ex.layouts:
        best_fast.setdefault(e.structure, e.step_time_s)
    bad = [s for s, t in best_base.items() if abs(best_fast.get(s, float("inf")) - t) > 1e-9 * t]
    if bad:
        print(f"MISMATCH: {len(bad)} structures where the explorer's best differs from the baseline's")
        return 1
    print(f"agreement: best step time equal on all {len(best_base)} structures the baseline saw")

    if args.acceptance:
        t0 = time.perf_counter()
        ex8 = explore(model, hw, gpus=8192, seq=seq, global_batch_tokens=tokens)
        pub = find(ex8, tp=8, cp=1, pp=16, dp=64)
        best = ex8.layouts[0]
        print(f"acceptance (8,192 GPUs, {time.perf_counter() - t0:.1f} s): best "
              f"{best.as_dict()['tp']}/{best.as_dict()['cp']}/{best.as_dict()['pp']}/{best.as_dict()['dp']} "
              f"{best.structure.schedule} v{best.structure.vpp} {best.step_time_s:.3f} s")
        if not pub:
            print("published layout tp 8, cp 1, pp 16, dp 64: does not fit")
            return 1
        p = pub[0]
        ratio = p.step_time_s / best.step_time_s
        print(f"published layout tp 8, cp 1, pp 16, dp 64: fits ({p.structure.schedule} v{p.structure.vpp}, "
              f"recompute {p.recompute}, ZeRO-{p.zero}, peak {p.peak_bytes / 1e9:.1f} GB), "
              f"{p.step_time_s:.3f} s = {(ratio - 1) * 100:+.1f} % vs the best "
              f"({'within' if ratio <= 1.15 else 'outside'} 15 %)")
        if ratio > 1.15:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
