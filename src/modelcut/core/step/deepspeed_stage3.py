"""DeepSpeed's ZeRO-3 runtime as released in spring 2021 (v0.3.13), hook by hook.

DeepSpeed's stage 3 of that release (``deepspeed/runtime/zero/stage3.py`` and
``partition_parameters.py`` at tag v0.3.13, the release of the ZeRO-3 runs of Narayanan et
al. 2021, Table 2) fetches weights per *sub-module* (every module with parameters of its
own: for a GPT layer the QKV, output-projection, MLP-up and MLP-down linears; norms and
biases below ``stage3_param_persistence_threshold``, 1e5 elements, stay whole on every rank),
from forward and backward pre-hooks, and it synchronizes the whole device at almost every
step. What this module replays, with the source of each rule:

* **fetch** (``PartitionedParameterCoordinator.fetch_sub_module``): the sub-module's weights
  that are not resident are all-gathered; if any had to be gathered or were in flight, the
  hook waits for every collective in flight and then calls ``torch.cuda.synchronize()``
  (``_synchronize_communication``), so the device is idle when it returns;
* **one all-gather per weight, each after a device-wide synchronize**
  (``Init._allgather_param``: ``torch.cuda.synchronize()`` before
  ``torch.distributed.all_gather``);
* **prefetch** (``prefetch_next_sub_modules``, ``PrefetchCoordinator.get_params_to_prefetch``):
  only when no prefetch is in flight, the weights next used along the recorded trace that
  are not resident, until at least ``stage3_prefetch_bucket_size`` (5e7) elements; issued in
  the pre-hook, before the sub-module's own kernels, so it runs under them;
* **release** (``release_sub_module``, ``_keep_for_later``): after a sub-module's forward its
  weights are freed unless the elements of the weights used before their next use along the
  trace are fewer than ``stage3_max_reuse_distance`` (1e9); after the backward they are freed;
* **gradients** (``reduce_independent_p_g_buckets_and_remove_grads``, ``reduce_ipg_grads``):
  each weight's gradient joins a bucket of ``reduce_bucket_size`` (5e8) elements; a gradient
  that would overflow it first flushes it: the host waits for the previous reduction
  (``reduction_stream.synchronize()``), then reduce-scatters the bucket in fp16
  (``_reduce_scatter_gradients``, one collective per weight) on the reduction stream; the
  next fetch's synchronize waits for it, so a reduction overlaps no later compute. The
  epilogue flushes the rest and waits.

All collectives of the data-parallel group run on one NCCL communicator, so they run one at
a time in the order issued. Pure: durations in, step time out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelcutError

#: DeepSpeed v0.3.13 defaults (``deepspeed/runtime/zero/constants.py``).
PREFETCH_BUCKET_NUMEL = 5e7           # stage3_prefetch_bucket_size
MAX_REUSE_DISTANCE_NUMEL = 1e9        # stage3_max_reuse_distance
REDUCE_BUCKET_NUMEL = 5e8             # reduce_bucket_size
PERSISTENCE_THRESHOLD_NUMEL = 1e5     # stage3_param_persistence_threshold


@dataclass(frozen=True)
class Weight:
    """One gathered weight: its elements and the seconds its all-gather and its gradient's
    reduce-scatter take over the data-parallel group."""

    name: str
    numel: float
    gather_s: float
    reduce_s: float


@dataclass(frozen=True)
class Step:
    """One sub-module call along the trace: the weights it uses (``weights``: names), its
    kernels' seconds, and whether it is a backward call (its weights' gradients are then
    produced at its end)."""

    module: str
    weights: tuple[str, ...]
    compute_s: float
    backward: bool = False
    grads: tuple[str, ...] | None = None   # weights whose gradients it produces (default: all, if backward)

    def produced(self) -> tuple[str, ...]:
        if not self.backward:
            return ()
        return self.weights if self.grads is None else self.grads


@dataclass(frozen=True)
class Stage3Result:
    step_s: float          # from the first hook to the end of the epilogue
    compute_s: float       # sum of the kernels' seconds
    gathers: int           # all-gathers issued
    gathered_numel: float  # elements all-gathered
    peak_resident_numel: float = 0.0  # most elements gathered (resident or in flight) while a sub-module runs


def replay(trace: list[Step], weights: dict[str, Weight], *,
           prefetch_numel: float = PREFETCH_BUCKET_NUMEL,
           max_reuse_numel: float = MAX_REUSE_DISTANCE_NUMEL,
           bucket_numel: float = REDUCE_BUCKET_NUMEL) -> Stage3Result:
    """Replay one training step's trace (every micro-batch's forward, recomputed forward and
    backward calls, in execution order) under the rules of the module docstring."""
    for st in trace:
        if st.compute_s < 0:
            raise ModelcutError(f"{st.module}: compute time must be non-negative, got {st.compute_s}")
        for w in st.weights:
            if w not in weights:
                raise ModelcutError(f"{st.module}: unknown weight {w!r}")
    n = len(trace)
    # Positions of each weight's uses along the trace, and the elements each step touches.
    uses: dict[str, list[int]] = {w: [] for w in weights}
    for i, st in enumerate(trace):
        for w in st.weights:
            uses[w].append(i)
    step_numel = [sum(weights[w].numel for w in st.weights) for st in trace]
    prefix = [0.0]
    for x in step_numel:
        prefix.append(prefix[-1] + x)

    status = {w: "out" for w in weights}        # out / flight / here
    now = c_free = n_free = 0.0                 # host clock, compute stream, the communicator
    in_flight: list[str] = []
    gathers = 0
    gathered = peak = live = 0.0                # live: elements gathered or in flight
    bucket: list[str] = []
    bucket_numel_now = 0.0
    last_reduce_done = 0.0

    def device_sync() -> None:
        nonlocal now
        now = max(now, c_free, n_free)

    def gather(w: str) -> None:
        nonlocal n_free, gathers, gathered, live
        device_sync()                              # Init._allgather_param: torch.cuda.synchronize()
        n_free = max(n_free, now) + weights[w].gather_s
        status[w] = "flight"
        live += weights[w].numel
        in_flight.append(w)
        gathers += 1
        gathered += weights[w].numel

    def flush() -> None:
        nonlocal now, n_free, bucket_numel_now, last_reduce_done
        if not bucket:
            return
        now = max(now, last_reduce_done)           # reduction_stream.synchronize()
        start = max(n_free, c_free)                # the gradients must exist
        n_free = start + sum(weights[w].reduce_s for w in bucket)
        last_reduce_done = n_free
        bucket.clear()
        bucket_numel_now = 0.0

    for i, st in enumerate(trace):
        # fetch
        missing = [w for w in st.weights if status[w] != "here"]
        for w in missing:
            if status[w] == "out":
                gather(w)
        if missing:
            device_sync()                          # _synchronize_communication
            for w in in_flight:
                status[w] = "here"
            in_flight.clear()
        # prefetch, only with nothing in flight
        if not in_flight:
            total = 0.0
            for j in range(i + 1, n):
                for w in trace[j].weights:
                    if status[w] == "out" and total < prefetch_numel:
                        gather(w)
                        total += weights[w].numel
                if total >= prefetch_numel:
                    break
        # the sub-module's kernels, with what is gathered at that moment
        peak = max(peak, live)
        c_free = max(c_free, now) + st.compute_s
        if st.backward:
            for w in st.produced():
                if bucket_numel_now + weights[w].numel > bucket_numel and bucket:
                    flush()
                bucket.append(w)
                bucket_numel_now += weights[w].numel
        # release: after a backward always; after a forward unless reused soon
        for w in st.weights:
            later = [u for u in uses[w] if u > i]
            if st.backward or not later:
                keep = False
            else:
                keep = prefix[later[0]] - prefix[i + 1] < max_reuse_numel
            if not keep and status[w] == "here":
                status[w] = "out"
                live -= weights[w].numel
    flush()
    device_sync()
    return Stage3Result(step_s=now, compute_s=sum(st.compute_s for st in trace), gathers=gathers,
                        gathered_numel=gathered, peak_resident_numel=peak)
