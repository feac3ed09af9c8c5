"""Engine speed against a straightforward SimPy simulation of the same pipeline.

Both simulate the same schedule (by default Megatron-LM's interleaved 1F1B with
p = 64 devices, m = 1024 micro-batches, v = 4 chunks: 524,288 ops; ``-s`` takes any
schedule of the registry, DualPipe's overlapped pairs and two directions included) with
the same timing (F = 1, B = 2 for a device's whole share of layers, floats), in the same
run. The script prints each one's ops per second and the ratio, and checks that both give
the same makespan (exit status 1 if they do not; 2 for sizes the schedule refuses).

The SimPy version is what one would write first: one process per device that walks
its op list, waits on an event for each input, holds the device for the op's
duration, then fires the op's own event. Inputs that cross devices arrive ``p2p``
later through a second event.

Run: ``python benchmarks/bench_engine.py`` (add ``--help`` for the sizes).
"""

from __future__ import annotations

import argparse
import sys
import time

import simpy

from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.errors import ModelcutError
from modelcut.core.sim.registry import build, get


def simpy_makespan(schedule, timing: Timing) -> float:
    """Simulate ``schedule`` with SimPy: a process per device waiting on input events.

    It follows the engine's rules, written the plain way: a micro-batch runs through its own
    stages only (``Schedule.span``: DualPipe's two directions), and the ops a schedule marks as
    one overlapped unit (``Schedule.units``: DualPipe's F&B pairs) wait for all their inputs
    from outside the unit, then hold the device together for the unit's duration
    (``Timing.unit_duration``)."""
    S = schedule.stages
    durs = timing.per_stage(S, schedule.chunks, schedule.split_backward)
    p2p = timing.p2p
    where = schedule.stage_device()
    env = simpy.Environment()
    done: dict[tuple[str, int, int], simpy.Event] = {}     # fires when the op ends
    arrived: dict[tuple[str, int, int], simpy.Event] = {}  # fires p2p later (remote consumers)
    kind_index = {"F": 0, "B": 1, "W": 2}

    def event(table, key):
        ev = table.get(key)
        if ev is None:
            ev = table[key] = env.event()
        return ev

    def inputs(op, d):
        """(table, key) of each input the op waits for."""
        k, s, mb = op.kind, op.stage, op.microbatch
        first, last = schedule.span(mb)
        if k == "F":
            if s > first:
                yield (done if where[s - 1] == d or not p2p else arrived), ("F", s - 1, mb)
        elif k == "B":
            yield done, ("F", s, mb)
            if s < last:
                yield (done if where[s + 1] == d or not p2p else arrived), ("B", s + 1, mb)
        else:
            yield done, ("B", s, mb)

    last_end = [0.0]

    def groups(d, order):
        """The device's list as runs of ops that start together: each unit, and every other op alone."""
        starts = dict(schedule.units[d]) if schedule.units else {}
        i = 0
        while i < len(order):
            n = starts.get(i, 1)
            yield order[i:i + n]
            i += n

    def device(d, order):
        for group in groups(d, order):
            inside = {(op.kind, op.stage, op.microbatch) for op in group}
            for op in group:
                for table, key in inputs(op, d):
                    if key not in inside:   # a unit's W needs its B, which runs in the same unit
                        yield event(table, key)
            each = [durs[op.stage][kind_index[op.kind]] for op in group]
            yield env.timeout(each[0] if len(group) == 1 else timing.unit_duration(each, schedule.chunks))
            if env.now > last_end[0]:
                last_end[0] = env.now
            for op in group:
                key = (op.kind, op.stage, op.microbatch)
                event(done, key).succeed()
                if p2p:
                    arrival = event(arrived, key)
                    env.timeout(p2p).callbacks.append(lambda _e, a=arrival: a.succeed())

    for d, order in enumerate(schedule.orders):
        env.process(device(d, order))
    env.run()
    return last_end[0]  # not env.now: the last sends' arrivals may run past the last op


def best_of(repeat: int, fn):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-s", "--schedule", default="interleaved")
    ap.add_argument("-p", "--devices", type=int, default=64)
    ap.add_argument("-m", "--microbatches", type=int, default=1024)
    ap.add_argument("-v", "--chunks", type=int, default=None,
                    help="chunks per device (default 4 where the schedule takes several, else its own)")
    ap.add_argument("--p2p", type=float, default=0.0, help="point-to-point time (default 0)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs of each (default 3)")
    args = ap.parse_args(argv)

    try:
        spec = get(args.schedule)
        chunks = args.chunks if args.chunks is not None else (spec.default_chunks if spec.fixed_chunks else 4)
        schedule = build(args.schedule, args.devices, args.microbatches, chunks)
    except ModelcutError as exc:
        print(f"bench_engine: error: {exc}", file=sys.stderr)
        return 2
    timing = Timing(1.0, 2.0, None, args.p2p)
    n = schedule.num_ops
    print(f"{schedule.name}: p = {schedule.devices}, m = {schedule.microbatches}, v = {schedule.chunks}, "
          f"{n:,} ops, F = 1, B = 2, p2p = {args.p2p:g}")

    t_engine, trace = best_of(args.repeat, lambda: simulate(schedule, timing))
    t_simpy, simpy_T = best_of(args.repeat, lambda: simpy_makespan(schedule, timing))

    print(f"modelcut engine  {t_engine:8.3f} s  {n / t_engine:12,.0f} ops/s  makespan {trace.makespan:g}")
    print(f"SimPy baseline   {t_simpy:8.3f} s  {n / t_simpy:12,.0f} ops/s  makespan {simpy_T:g}")
    print(f"ratio (engine ops/s over SimPy ops/s): {t_simpy / t_engine:.1f}x")
    if abs(trace.makespan - simpy_T) > 1e-9 * max(1.0, abs(simpy_T)):
        print("MISMATCH: the two simulations disagree on the makespan", file=sys.stderr)
        return 1
    print("makespans agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
