"""What each training framework overlaps with compute, and what the step then pays.

Each overlap is a named option (:data:`OPTIONS`); a framework preset (:data:`FRAMEWORKS`)
gives the defaults of one stack and era, so a user can say what their run did
(``--framework``, ``--overlap grad_reduce=off``).

* ``grad_reduce``: the data-parallel gradient all-reduce (or reduce-scatter) runs in buckets
  while the backward is still going: a bucket starts when the last backward touching it ends.
  PyTorch DDP does this by default (Li et al. 2020, "PyTorch Distributed", §3.2.3, 25 MB
  buckets); Megatron-LM's own ``LocalDDP`` of 2021-2022 did not (``--DDP-impl local``: one
  all-reduce after the pipeline flush, ``megatron/model/distributed.py``); Megatron-core added
  ``--overlap-grad-reduce`` in 2023 (off by default; NeMo turns it on); FSDP and DeepSpeed
  ZeRO-2/3 (``overlap_comm``) reduce-scatter behind the backward.
* ``param_gather``: sharded weights are all-gathered ahead of use (ZeRO-3 prefetch; FSDP
  ``forward_prefetch``/``backward_prefetch``; Megatron-core ``--overlap-param-gather`` with the
  distributed optimizer); off, each gather waits for the layer that needs it.
* ``p2p_async``: pipeline sends and receives run on their own stream and do not hold the
  device (Llama 3, Grattafiori et al. 2024 §3.3.2; Megatron-core ``--overlap-p2p-comm``);
  off, as in Megatron-LM 2021-2022 (``batch_isend_irecv`` then a device synchronize in
  ``megatron/p2p_communication.py``), each transfer holds both devices.
* ``tp_comm``: tensor-parallel collectives hidden behind the neighbouring products
  (Transformer Engine userbuffers, NeMo's ``tp_comm_overlap``; Wang et al. 2023 "Overlap
  communication with dependent computation"); off, every one is on the critical path.

The functions below turn a communication schedule into the time it exposes: a single
communication stream that serves requests in order, each no earlier than it is ready.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from .errors import ModelcutError

#: Option name -> what it means (shown by the CLI).
OPTIONS: dict[str, str] = {
    "grad_reduce": "data-parallel gradient reduction in buckets behind the backward",
    "param_gather": "ZeRO-3/FSDP/distributed-optimizer weight all-gather ahead of use",
    "p2p_async": "pipeline sends on their own stream, not holding the device",
    "tp_comm": "tensor-parallel collectives hidden behind the neighbouring matrix products",
}


@dataclass(frozen=True)
class Overlap:
    """Which communication a framework overlaps with compute (module doc)."""

    grad_reduce: bool = True
    param_gather: bool = True
    p2p_async: bool = True
    tp_comm: bool = False

    def with_options(self, **kw: bool) -> "Overlap":
        for k, val in kw.items():
            if k not in OPTIONS:
                raise ModelcutError(f"unknown overlap option {k!r}; choose one of {', '.join(OPTIONS)}")
            if not isinstance(val, bool):
                raise ModelcutError(f"overlap option {k} must be on or off, got {val!r}")
        return replace(self, **kw)

    def as_dict(self) -> dict[str, bool]:
        return {k: getattr(self, k) for k in OPTIONS}


def parse_overlap(text: str) -> dict[str, bool]:
    """``"grad_reduce=off,tp_comm=on"`` -> {"grad_reduce": False, "tp_comm": True}."""
    out: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            raise ModelcutError(f"overlap option {part!r}: write name=on or name=off")
        k, val = (x.strip() for x in part.split("=", 1))
        if k not in OPTIONS:
            raise ModelcutError(f"unknown overlap option {k!r}; choose one of {', '.join(OPTIONS)}")
        if val.lower() not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
            raise ModelcutError(f"overlap option {k}: {val!r} is not on or off")
        out[k] = val.lower() in ("on", "true", "1", "yes")
    return out


@dataclass(frozen=True)
class Framework:
    """One training stack's defaults: what it overlaps, which kernels it runs, how it keeps
    and moves gradients.

    ``attention``: the attention kernel (:data:`.kernels.ATTENTION_KINDS`), or "auto":
    Transformer Engine's choice, cuDNN fused attention on Hopper, FlashAttention-2 before it;
    ``grad_accum_fusion``: weight gradients accumulated inside the product;
    ``fused_cross_entropy``: one fused loss kernel; ``grad_bytes``: bytes per gradient element
    on the data-parallel wire (2: fp16/bf16, 4: fp32); ``dist_optimizer``: optimizer states
    sharded over data parallelism even at zero = 0 (Megatron's distributed optimizer);
    ``reshard_after_forward``: ZeRO-3/FSDP frees gathered weights after the forward, so the
    backward gathers them again (once: the recomputed forward and the backward share it);
    ``prefetch_backward``: the ``param_gather`` overlap also prefetches in the backward;
    ``tp_async_backward``: tensor-parallel backward collectives of the column-parallel products
    run behind their gradient products (Megatron-LM's async all-reduce, from late 2021);
    ``multi_nic_rings``: data-parallel collectives of a group with several members per node
    use all those members' network ports (NCCL's rings, :func:`.comm.collective_bandwidth`);
    off, each member moves its bytes through its own port only (see the deepspeed-zero3 preset);
    ``cp_kind``: the stack's context-parallel form when the layout names none: "ring" for
    Megatron-core and NeMo (``--cp-comm-type`` defaults to ``p2p``, Transformer Engine's ring
    attention with the K/V exchange overlapped with the attention blocks), "allgather" for
    Llama 3 (Grattafiori et al. 2024 §3.3.2) and PyTorch's context parallelism (its default
    rotation, ``set_rotate_method("allgather")``);
    ``zero3_runtime``: how ZeRO-3 without a pipeline fetches weights: "unit", FSDP's wrapped
    units (one transformer layer each) prefetched one ahead on a communication stream;
    "deepspeed-0.3", DeepSpeed's 2021 hooks replayed weight by weight
    (:mod:`.deepspeed_stage3`); ``fused_elementwise``: norms, activations, rotary embedding and
    residual adds as fused kernels (Megatron-LM, Transformer Engine); off, PyTorch's eager ops,
    one kernel each (:data:`.layer_time.EAGER_RMSNORM_FWD`)."""

    name: str
    overlap: Overlap
    attention: str
    grad_accum_fusion: bool
    fused_cross_entropy: bool
    grad_bytes: int
    dist_optimizer: bool = False
    reshard_after_forward: bool = True
    prefetch_backward: bool = True
    tp_async_backward: bool = True
    multi_nic_rings: bool = True
    cp_kind: str = "allgather"
    zero3_runtime: str = "unit"
    fused_elementwise: bool = True
    source: str = ""


FRAMEWORKS: dict[str, Framework] = {
    "megatron-2021": Framework(
        "megatron-2021", Overlap(grad_reduce=False, param_gather=False, p2p_async=False, tp_comm=False),
        attention="unfused", grad_accum_fusion=False, fused_cross_entropy=False, grad_bytes=2,
        tp_async_backward=False,
        source="Megatron-LM as run for Narayanan et al. 2021 (examples/sc21: --DDP-impl local, --fp16; "
               "megatron/model/distributed.py all-reduces after the flush; p2p_communication.py "
               "batch_isend_irecv + synchronize; unfused softmax attention)"),
    "megatron-2021-torch-ddp": Framework(
        "megatron-2021-torch-ddp", Overlap(grad_reduce=True, param_gather=False, p2p_async=False, tp_comm=False),
        attention="unfused", grad_accum_fusion=False, fused_cross_entropy=False, grad_bytes=2,
        tp_async_backward=False,
        source="Megatron-LM 2021 with --DDP-impl torch (examples/sc21/run_table_1.sh for its 1.7B-18B rows): "
               "PyTorch DDP buckets all-reduce behind the last micro-batch's backward"),
    "megatron-2022": Framework(
        "megatron-2022", Overlap(grad_reduce=False, param_gather=False, p2p_async=False, tp_comm=False),
        attention="unfused", grad_accum_fusion=True, fused_cross_entropy=False, grad_bytes=4,
        source="Megatron-LM as run for Korthikanti et al. 2022 (sequence parallelism, selective "
               "recomputation; --gradient-accumulation-fusion into fp32 main_grad; local DDP)"),
    "megatron-core": Framework(
        "megatron-core", Overlap(grad_reduce=True, param_gather=True, p2p_async=True, tp_comm=False),
        attention="auto", grad_accum_fusion=True, fused_cross_entropy=False, grad_bytes=4,
        dist_optimizer=True, cp_kind="ring",
        source="Megatron-LM/Megatron-core 2023-2024 as its performance recipes run it: distributed "
               "optimizer, --overlap-grad-reduce, --overlap-param-gather, overlapped p2p, "
               "FlashAttention, gradient-accumulation fusion"),
    "nemo": Framework(
        "nemo", Overlap(grad_reduce=True, param_gather=True, p2p_async=True, tp_comm=True),
        attention="auto", grad_accum_fusion=True, fused_cross_entropy=False, grad_bytes=4,
        dist_optimizer=True, cp_kind="ring",
        source="NeMo 2.0 pretraining recipes (overlap_grad_reduce, overlap_param_gather, tp_comm_overlap "
               "with sequence parallelism, distributed optimizer; Transformer Engine fused attention)"),
    "deepspeed-zero3": Framework(
        "deepspeed-zero3", Overlap(grad_reduce=True, param_gather=True, p2p_async=False, tp_comm=False),
        attention="unfused", grad_accum_fusion=False, fused_cross_entropy=False, grad_bytes=2,
        reshard_after_forward=True, tp_async_backward=False, multi_nic_rings=False, zero3_runtime="deepspeed-0.3",
        source="DeepSpeed ZeRO-3 as released in 2021 (v0.3.13, the release of Narayanan et al. 2021's "
               "Table 2 ZeRO-3 rows), its hooks replayed weight by weight (deepspeed_stage3.py: a "
               "device synchronize at every fetch, one weight prefetched, weights freed beyond "
               "stage3_max_reuse_distance, fp16 reduce-scatters in 5e8-element buckets that no later "
               "compute runs under). Its per-parameter gathers over the whole "
               "job moved bytes at about one 200 Gb/s port per GPU (16-21 GB/s: Narayanan et al. "
               "2021, Table 2, throughput halving with each doubling of GPUs at a fixed batch), an "
               "eighth of what NCCL rings reach over the same nodes' eight ports; the mechanism is "
               "not documented, so this preset keeps the observed one-port-per-GPU limit"),
    "fsdp": Framework(
        "fsdp", Overlap(grad_reduce=True, param_gather=True, p2p_async=True, tp_comm=False),
        attention="flash2", grad_accum_fusion=False, fused_cross_entropy=False, grad_bytes=4,
        reshard_after_forward=True, fused_elementwise=False,
        source="PyTorch FSDP (Zhao et al. 2023, VLDB, §3.3-3.4): backward and forward prefetch, "
               "reshard after forward, reduce-scatter behind the backward; the wrapped model in eager "
               "PyTorch (no torch.compile): its elementwise ops one kernel each"),
    "llama3": Framework(
        "llama3", Overlap(grad_reduce=True, param_gather=True, p2p_async=True, tp_comm=False),
        attention="flash2", grad_accum_fusion=True, fused_cross_entropy=False, grad_bytes=4,
        reshard_after_forward=False,
        source="Grattafiori et al. 2024 §3.3.2: FSDP sharding optimizer states and gradients, weights "
               "not resharded after the forward, gradients reduce-scattered in FP32, asynchronous p2p"),
}

FRAMEWORKS["fsdp-compile"] = replace(
    FRAMEWORKS["fsdp"], name="fsdp-compile", fused_elementwise=True,
    source="PyTorch FSDP as the fsdp preset, the model under torch.compile (TorchInductor fuses the "
           "elementwise ops around the products: norms, activations, rotary embedding)")

#: Framework assumed when a run names none: a current Megatron-core-style stack.
DEFAULT_FRAMEWORK = "megatron-core"


def framework(name: str | Framework | None) -> Framework:
    if isinstance(name, Framework):
        return name
    key = DEFAULT_FRAMEWORK if name is None else str(name).lower()
    fw = FRAMEWORKS.get(key)
    if fw is None:
        raise ModelcutError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)}")
    return fw


# ---------------------------------------------------------------- exposure

def serve_in_order(requests: Iterable[tuple[float, float]], start: float = 0.0) -> float:
    """One communication stream serving (ready time, duration) requests in ready order, each
    starting when it is ready and the stream is free. Returns when the last one ends."""
    free = start
    for ready, dur in sorted(requests):
        if dur < 0:
            raise ModelcutError(f"communication time must be non-negative, got {dur}")
        free = max(free, ready) + dur
    return free


def exposed_after(compute_end: float, requests: Sequence[tuple[float, float]], overlapped: bool) -> float:
    """Communication time the step pays beyond ``compute_end``.

    Overlapped: the requests are served as they become ready (:func:`serve_in_order`) and
    only what runs past the end of compute is exposed. Not overlapped: all of them run after
    compute, back to back."""
    total = sum(d for _, d in requests)
    if not overlapped:
        return total
    return max(serve_in_order(requests) - compute_end, 0.0)


def exposed_tp(tp: float, gemm: float, overlapped: bool) -> float:
    """Tensor-parallel communication on the critical path of a pass: all of it, or, with
    ``tp_comm`` overlap, what the pass's matrix products cannot hide, max(tp − gemm, 0)."""
    return max(tp - gemm, 0.0) if overlapped else tp


def prefetch_timeline(tasks: Sequence[tuple[float, float, bool]],
                      after: Sequence[tuple[int, float]] = ()) -> tuple[float, float]:
    """A compute stream running ``tasks`` in order, each (gather, compute, prefetched): its
    weights must first be all-gathered (``gather`` seconds, 0 if none) on one communication
    stream.

    A prefetched task's gather is issued when the task before it starts (one module ahead, as
    ZeRO-3 and FSDP prefetch); otherwise when the task is reached. ``after`` lists (task index,
    seconds) collectives issued on the same stream when that task ends (gradient
    reduce-scatters). Requests are served in the order issued. Returns (compute end,
    communication end)."""
    n = len(tasks)
    comm_free = 0.0
    t = 0.0
    gather_done: list[float | None] = [None] * n
    pending_after: dict[int, list[float]] = {}
    for i, dur in after:
        pending_after.setdefault(i, []).append(dur)

    def issue(i: int, when: float) -> None:
        nonlocal comm_free
        if i < n and gather_done[i] is None:
            comm_free = max(comm_free, when) + tasks[i][0]
            gather_done[i] = comm_free

    for i in range(n):
        issue(i, t)
        start = max(t, gather_done[i])
        if i + 1 < n and tasks[i + 1][2]:
            issue(i + 1, start)
        t = start + tasks[i][1]
        for dur in pending_after.get(i, ()):
            comm_free = max(comm_free, t) + dur
    return t, comm_free
