"""Layout-explorer speed: layouts per second of the explorer as shipped against the exhaustive
path, measured in the same run, and a check that both find the same best layouts.

The problem is the issue's: Llama 3 405B on 16,384 H100s, 8,192-token sequences, 16M tokens a
step, ranked by the default model on the default stack (megatron-core; ``--framework`` another).
A layout is one point of the space the stack runs (t, c and its form, e, p, d, micro-batch,
schedule, v, recomputation, ZeRO stage).

* **explorer**: ``modelcut.service.explore.run_explore`` as ``modelcut explore`` runs it: each
  structure's recomputation × ZeRO variants share one memory pass, candidates are timed in the
  order of a valid lower bound on their step time (``modelcut.core.step.bounds``) until no
  remaining bound can reach the kept layouts (the table's five and every layout within the
  Pareto reach, 5 % of the best), kernels are computed once per setup and pipeline simulations
  are shared by layouts of the same schedule shape.
* **exhaustive**: the same search with ``exhaustive=True``: every cheapest variant that fits is
  timed, none left out by a bound (the path the explorer took before it had one).

Both start from cold caches. The script prints both rates (layouts of the space over seconds),
their ratio, and checks that both rank the same layouts first, with the same step times, down to
the ``--top``-th (exit status 1 if not). ``--no-rules`` searches every layout, whatever a stack
can run. Run: ``python benchmarks/bench_explore.py`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from modelcut import catalog
from modelcut.core import plan
from modelcut.core.sim import inflight
from modelcut.core.step import pipeline_time, stage_costs
from modelcut.service.explore import ExploreRequest, run_explore


def clear_caches() -> None:
    for fn in (inflight._profile, inflight._orders, plan._coefficients, plan._build, pipeline_time._simulated,
               pipeline_time._trace, stage_costs._kernels):
        fn.cache_clear()


def timed(req: ExploreRequest):
    clear_caches()
    t0 = time.perf_counter()
    res = run_explore(req)
    return res, time.perf_counter() - t0


def key(e) -> tuple:
    return (e.structure, e.recompute, e.zero)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--framework", default=None, help="the stack (default: the catalog's default preset)")
    ap.add_argument("--top", type=int, default=5, help="how many of the best layouts must agree")
    ap.add_argument("--no-rules", action="store_true", help="search every layout, not only those the stack runs")
    args = ap.parse_args(argv)
    model, hw = catalog.model("llama3-405b"), catalog.hardware("h100")
    req = ExploreRequest(model, hw, args.gpus, 8192, 16 * 2**20, framework=args.framework, top=args.top)
    if args.no_rules:
        import modelcut.service.explore as svc
        svc.catalog = _NoRules(catalog)

    fast, t_fast = timed(req)
    slow, t_slow = timed(replace(req, exhaustive=True))
    ex_f, ex_s = fast.exploration, slow.exploration
    print(f"Llama 3 405B on {args.gpus:,} H100, sequence 8,192, 16M tokens, stack "
          f"{fast.framework.name if fast.framework else 'none'}{' (no rules)' if args.no_rules else ''}: "
          f"{ex_f.space:,} layouts ({ex_f.structures:,} structures)")
    print(f"explorer:   {t_fast:6.2f} s = {ex_f.space / t_fast:8,.0f} layouts/s; {ex_f.memory_evaluations:,} memory "
          f"checks, {ex_f.predictions:,} timed, {ex_f.pruned_by_bound:,} pruned by the bound")
    print(f"exhaustive: {t_slow:6.2f} s = {ex_s.space / t_slow:8,.0f} layouts/s; {ex_s.memory_evaluations:,} memory "
          f"checks, {ex_s.predictions:,} timed")
    print(f"ratio: {(ex_f.space / t_fast) / (ex_s.space / t_slow):.1f}x layouts per second")
    a, b = ex_f.layouts[:args.top], ex_s.layouts[:args.top]
    same = [key(x) for x in a] == [key(y) for y in b] and all(
        abs(x.step_time_s - y.step_time_s) <= 1e-9 * y.step_time_s for x, y in zip(a, b))
    if not same or len(a) < min(args.top, len(ex_s.layouts)):
        print("MISMATCH: the explorer's best layouts differ from the exhaustive search's")
        for x, y in zip(a, b):
            print(f"  {x.structure} {x.recompute} {x.zero} {x.step_time_s:.6f}  |  {y.structure} {y.recompute} "
                  f"{y.zero} {y.step_time_s:.6f}")
        return 1
    best = a[0].structure
    print(f"agreement: the same {len(a)} best layouts in the same order, the best tp {best.tp}, cp {best.cp}, "
          f"pp {best.pp}, dp {best.dp}, {best.schedule} v {best.vpp}, {a[0].step_time_s:.3f} s")
    return 0


class _NoRules:
    """The catalog with no stack rules (``--no-rules``): every layout is searched."""

    def __init__(self, cat):
        self._cat = cat

    def __getattr__(self, name):
        return getattr(self._cat, name)

    def capabilities(self, name):
        return None


if __name__ == "__main__":
    sys.exit(main())
