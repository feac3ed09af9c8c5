"""Real pipeline runs with torch.distributed.pipelining: P processes, gloo on loopback.

Each process is one pipeline rank holding one :class:`PipelineStage` per stage it owns
(torch places them; :func:`modelcut.analysis.torchcheck.orders.torch_order` reads where). A stage's
module does no arithmetic worth the name: its forward *waits* ``forward_s`` and its
autograd backward waits the backward time, so stage times are controlled even when four
processes share two cores. With a split backward (I and W actions) the autograd backward
waits ``backward_s − weight_s`` and the stage's ``dw_builder`` runner waits ``weight_s``
(torch's ``PipelineStage(dw_builder=...)`` hook for the W action).

Setup follows what is known to keep such runs quiet on a small CPU machine: one thread per
process (``torch.set_num_threads(1)``), a ``file://`` rendezvous in a temporary directory
(no port to pick), a process-group timeout, ``GLOO_SOCKET_IFNAME=lo`` unless set, a
discarded warm-up step, then ``gc.collect(); gc.freeze()`` and no collection during the
measured steps. Every compute action is timed by wrapping the stage's
``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk``: its
start and end on ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, one clock for all
processes of the machine). The parent waits with a deadline: a rank that hangs or fails
ends the run with a one-line error and every rank is stopped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import ModelcutError
from . import require_torch
from .orders import TorchOrder, is_multi, schedule_class, torch_order

#: Width of the activations passed between stages (floats per micro-batch): small, so a
#: send costs gloo's latency and nothing more.
WIDTH = 16

#: Row of a measured or simulated timeline: (device, kind, microbatch, stage, start_s, end_s).
Row = tuple[int, str, int, int, float, float]


@dataclass
class Measured:
    """One schedule's real run: per measured step, each rank's actions in execution order as
    (stage, kind, microbatch, start_s, end_s), times from the step's first action start."""

    name: str
    order: TorchOrder
    steps: list[list[list[tuple[int, str, int, float, float]]]] = field(default_factory=list)
    cpu_s: list[list[float]] = field(default_factory=list)  # per step, each rank's CPU time

    def makespans(self) -> list[float]:
        return [max(a[4] for rank in step for a in rank) for step in self.steps]

    @property
    def makespan(self) -> float:
        ms = self.makespans()
        return sum(ms) / len(ms)

    def executed_as_predicted(self) -> bool:
        """Each rank ran exactly the order read from torch without a cluster."""
        want = [[(a.stage, a.kind, a.microbatch) for a in rank] for rank in self.order.executed]
        return all([[(s, k, mb) for s, k, mb, *_ in rank] for rank in step] == want for step in self.steps)

    def mean_times(self) -> list[list[tuple[float, float]]]:
        """(start, end) of every action averaged over the measured steps."""
        n = len(self.steps)
        out = []
        for r in range(len(self.steps[0])):
            out.append([(sum(step[r][i][3] for step in self.steps) / n,
                         sum(step[r][i][4] for step in self.steps) / n) for i in range(len(self.steps[0][r]))])
        return out

    def busy(self) -> list[float]:
        """Mean busy time per rank (sum of its actions' durations)."""
        n = len(self.steps)
        return [sum(a[4] - a[3] for step in self.steps for a in step[r]) / n for r in range(len(self.steps[0]))]

    def bubble(self) -> float:
        """modelcut's bubble, (p·T − Σ busy)/Σ busy, on the measured timeline."""
        busy = sum(self.busy())
        return (len(self.steps[0]) * self.makespan - busy) / busy

    def rows(self, step: int | None = None) -> list[Row]:
        """The timeline of one measured step (default: the one with the median makespan);
        torch's input-gradient action I is written B, as modelcut writes it."""
        if step is None:
            ms = self.makespans()
            step = sorted(range(len(ms)), key=ms.__getitem__)[len(ms) // 2]
        return [(r, "B" if k == "I" else k, mb, s, t0, t1)
                for r, rank in enumerate(self.steps[step]) for s, k, mb, t0, t1 in rank]


# --------------------------------------------------------------------------- worker side

def _wait(seconds: float) -> None:
    """Sleep until ``seconds`` have passed (a controlled wait, not arithmetic)."""
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        time.sleep(left)


def _make_module(forward_s: float, backward_s: float):
    import torch

    class _Timed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            _wait(forward_s)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            _wait(backward_s)
            return grad

    class TimedStage(torch.nn.Module):
        """y = wait_F(x · w); its backward waits the backward time."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(WIDTH))

        def forward(self, x):
            return _Timed.apply(x * self.w)

    return TimedStage()


def _loss(out, target):
    return (out - target).square().mean()


def _instrument(stage, log: list) -> None:
    clock = time.perf_counter
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    s = stage.stage_index

    def forward_one_chunk(mb, *args, **kwargs):
        t0 = clock()
        out = fwd(mb, *args, **kwargs)
        log.append((s, "F", mb, t0, clock()))
        return out

    def backward_one_chunk(mb, *args, **kwargs):
        t0 = clock()
        out = bwd(mb, *args, **kwargs)
        log.append((s, "B" if kwargs.get("full_backward", True) else "I", mb, t0, clock()))
        return out

    def backward_weight_one_chunk(mb, *args, **kwargs):
        t0 = clock()
        out = wgt(mb, *args, **kwargs)
        log.append((s, "W", mb, t0, clock()))
        return out

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _run_schedule(spec: dict, cfg: dict, rank: int) -> list[list[tuple]]:
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    p, m, v = cfg["devices"], cfg["microbatches"], spec["chunks"]
    n_stages = p * v
    cls = schedule_class(spec["class_name"])
    split = spec["split"]
    f_s, b_s, w_s = cfg["forward_s"], cfg["backward_s"], cfg["weight_s"]
    b_autograd = b_s - w_s if split else b_s
    mine = sorted(int(s) for s, r in spec["stage_rank"].items() if r == rank)
    log: list[tuple] = []
    stages = []
    for s in mine:
        # Static shapes (no metadata inference); a received activation needs a gradient.
        example_in = torch.zeros(1, WIDTH, requires_grad=s > 0)
        example_out = torch.zeros(1, WIDTH, requires_grad=True)
        dw = (lambda: (lambda: _wait(w_s))) if split else None
        st = PipelineStage(_make_module(f_s, b_autograd), s, n_stages, torch.device("cpu"),
                           input_args=(example_in,), output_args=(example_out,), dw_builder=dw)
        _instrument(st, log)
        stages.append(st)
    sched = cls(stages, m, loss_fn=_loss) if is_multi(cls) else cls(stages[0], m, loss_fn=_loss)
    has_first = any(st.is_first for st in stages)
    has_last = any(st.is_last for st in stages)
    x = torch.randn(m, WIDTH)
    target = torch.zeros(m, WIDTH)
    measured = []
    for step in range(cfg["warmup"] + cfg["steps"]):
        if step == cfg["warmup"]:
            gc.collect()
            gc.freeze()
            gc.disable()
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        dist.barrier()
        log.clear()
        cpu0 = time.process_time()
        sched.step(*((x,) if has_first else ()), target=target if has_last else None)
        if step >= cfg["warmup"]:
            measured.append({"actions": list(log), "cpu_s": time.process_time() - cpu0})
    gc.enable()
    return measured


def worker(cfg_path: str, rank: int) -> None:
    """One rank: join the group, run every schedule of the config, write the timings."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cfg = json.loads(Path(cfg_path).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{cfg['dir']}/rendezvous", rank=rank,
                            world_size=cfg["devices"], timeout=timedelta(seconds=cfg["pg_timeout_s"]))
    try:
        out = [_run_schedule(spec, cfg, rank) for spec in cfg["schedules"]]
        Path(cfg["dir"], f"rank{rank}.json").write_text(json.dumps(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- parent side

def _stop(procs: list[subprocess.Popen]) -> None:
    for pr in procs:
        if pr.poll() is None:
            pr.kill()
    for pr in procs:
        try:
            pr.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - kill is not refused
            pass


def _last_line(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # torch prefixes a failing rank's traceback with "[rankN]:"; keep the message itself.
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [i for i, ln in enumerate(lines) if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    text = " ".join(lines[errors[-1]:]) if errors else (lines or [""])[-1]
    return text if len(text) <= 300 else text[:297] + "..."


def run(schedules: list[str], devices: int, microbatches: int, chunks: int | None = None, *,
        forward_s: float = 0.020, backward_s: float = 0.040, weight_s: float | None = None,
        steps: int = 3, warmup: int = 1, timeout_s: float = 300.0) -> list[Measured]:
    """Run each torch schedule (modelcut or torch names) for real, all in one process group.

    ``forward_s`` and ``backward_s`` are the times of *one action* (one micro-batch through
    one stage); with a split backward, ``weight_s`` (default half of ``backward_s``, as
    modelcut's Timing splits it) is the W share. Returns one :class:`Measured` per schedule.
    """
    require_torch()
    for label, val in (("devices", devices), ("micro-batches", microbatches), ("steps", steps)):
        if not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{label} must be a positive integer, got {val!r}")
    if devices < 2:
        raise ModelcutError(f"a real pipeline run needs at least 2 devices, got {devices}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ModelcutError(f"warm-up steps must be a non-negative integer, got {warmup!r}")
    for label, val in (("forward time", forward_s), ("backward time", backward_s)):
        if not val > 0:
            raise ModelcutError(f"{label} must be positive, got {val}")
    if weight_s is None:
        weight_s = backward_s / 2
    if not 0 <= weight_s <= backward_s:
        raise ModelcutError(f"weight time must lie between 0 and the backward time {backward_s}, got {weight_s}")
    if not timeout_s > 0:
        raise ModelcutError(f"timeout must be positive, got {timeout_s}")
    orders = []
    for name in schedules:
        cls = schedule_class(name)
        v = chunks if (chunks is not None and is_multi(cls)) else None
        orders.append((name, torch_order(name, devices, microbatches, v)))
    with tempfile.TemporaryDirectory(prefix="modelcut-crosscheck-") as tmp:
        cfg = {
            "dir": tmp, "devices": devices, "microbatches": microbatches, "forward_s": forward_s,
            "backward_s": backward_s, "weight_s": weight_s, "steps": steps, "warmup": warmup,
            "pg_timeout_s": max(30.0, timeout_s),
            "schedules": [{"class_name": o.class_name, "chunks": o.chunks, "split": o.split_backward,
                           "stage_rank": {str(s): r for s, r in o.stage_rank.items()}} for _, o in orders],
        }
        cfg_path = Path(tmp, "config.json")
        cfg_path.write_text(json.dumps(cfg))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs: list[subprocess.Popen] = []
        try:
            for r in range(devices):
                with open(Path(tmp, f"rank{r}.log"), "wb") as logf:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "modelcut.analysis.torchcheck.runner", str(cfg_path), str(r)],
                        stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
            deadline = time.monotonic() + timeout_s
            while any(pr.poll() is None for pr in procs):
                failed = [r for r, pr in enumerate(procs) if pr.returncode not in (None, 0)]
                if failed:
                    r = failed[0]
                    raise ModelcutError(f"crosscheck: rank {r} failed (exit {procs[r].returncode}): "
                                        f"{_last_line(Path(tmp, f'rank{r}.log'))}")
                if time.monotonic() > deadline:
                    hung = [r for r, pr in enumerate(procs) if pr.poll() is None]
                    raise ModelcutError(f"crosscheck: the pipeline run did not finish within {timeout_s:g} s "
                                        f"(rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} "
                                        "still running); stopped every rank")
                time.sleep(0.05)
            for r, pr in enumerate(procs):
                if pr.returncode != 0:
                    raise ModelcutError(f"crosscheck: rank {r} failed (exit {pr.returncode}): "
                                        f"{_last_line(Path(tmp, f'rank{r}.log'))}")
        finally:
            _stop(procs)
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(devices)]
    results = []
    for i, (name, order) in enumerate(orders):
        meas = Measured(name, order)
        for k in range(steps):
            ranks = [[tuple(a) for a in per_rank[r][i][k]["actions"]] for r in range(devices)]
            meas.cpu_s.append([per_rank[r][i][k]["cpu_s"] for r in range(devices)])
            t0 = min(a[3] for rank in ranks for a in rank)
            meas.steps.append([[(s, kd, mb, a - t0, b - t0) for s, kd, mb, a, b in rank] for rank in ranks])
        results.append(meas)
    return results


if __name__ == "__main__":  # a rank, started by run()
    worker(sys.argv[1], int(sys.argv[2]))
