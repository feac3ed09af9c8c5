"""What one prediction costs, against a fixed yardstick in the same run.

Machines here are shared and noisy, so the figure is a ratio: the default model's time per
prediction (every published run of the catalog, caches cleared each round) over the time the
discrete-event engine takes to simulate one fixed schedule (1F1B, p = 8, m = 64, floats), each the
median of several rounds. The seed model's time is printed beside it the same way.

Run: ``python benchmarks/bench_predict.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from modelcut import catalog
from modelcut.analysis.measured import catalog_measured
from modelcut.analysis.validation import seed_eta
from modelcut.core.errors import ModelcutError
from modelcut.core.sim import registry
from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.costs import kernels
from modelcut.core.step import default, pipeline_time, seed
from modelcut.service.predict import efficiency_for


#: The sources of the 34 runs the catalog held when the baseline was measured (commit 0c39cd6):
#: ``--baseline-runs`` times the same runs, for a like-for-like ratio.
BASELINE_GROUPS = ("narayanan-table1", "narayanan-table2", "korthikanti", "zero3", "llama3")


def _clear() -> None:
    pipeline_time._simulated.cache_clear()
    kernels._measured_tflops.cache_clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-runs", action="store_true",
                    help="only the 34 runs of the baseline measurement (their sources: " + ", ".join(BASELINE_GROUPS) + ")")
    args = ap.parse_args(argv)
    eta = seed_eta()
    originals = {pr.id: pr.run for pr in catalog.published_runs()}
    cases = []
    for m in catalog_measured():
        if args.baseline_runs and m.family not in BASELINE_GROUPS:
            continue
        try:
            seed.predict(originals[m.id], m.hw, eta)
        except ModelcutError:
            continue
        cases.append((m, originals[m.id], efficiency_for(m.hw), catalog.framework(m.framework)))
    t_def, t_seed, t_ref = [], [], []
    ref = registry.build("1f1b", 8, 64)
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(20):
            simulate(ref, Timing(1.0, 2.0))
        t_ref.append((time.perf_counter() - t0) / 20)
        _clear()
        t0 = time.perf_counter()
        for m, _, eff, fw in cases:
            default.predict(m.run, m.hw, eff, fw.with_overlap(m.overlap))
        t_def.append(time.perf_counter() - t0)
        _clear()
        t0 = time.perf_counter()
        for m, run, _, _ in cases:
            seed.predict(run, m.hw, eta)
        t_seed.append(time.perf_counter() - t0)
    d, s, r = statistics.median(t_def) / len(cases), statistics.median(t_seed) / len(cases), statistics.median(t_ref)
    print(f"{len(cases)} runs, {args.rounds} rounds (caches cleared each round)")
    print(f"yardstick (engine, 1F1B p 8 m 64): {r * 1e3:.3f} ms")
    print(f"default model: {d * 1e3:.2f} ms a prediction = {d / r:.1f} yardsticks")
    print(f"seed model:    {s * 1e3:.2f} ms a prediction = {s / r:.1f} yardsticks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
