"""The pipeline plan: how a run is laid over the pipeline, resolved once and read by every model.

A :class:`PipelinePlan` holds the schedule (its registry entry), p devices, v chunks per
device, m micro-batches per step, the interleaved schedule's micro-batch group N, and each
virtual stage with its device, its transformer layers (MoE layers counted apart), and whether
it holds the embedding or the output layer and loss. The step-time models, the memory model,
the explorer and the web app all read it, so time and memory describe the same pipeline.

**Splits** of l layers over S virtual stages (per model copy; DualPipe holds two):

* ``"even"`` (:func:`even_split`): whole layers, as even as possible, the stages with one layer
  fewer at the two ends of the pipeline, where the embedding and the loss sit. Llama 3 405B (126
  layers) on 16 stages: 7, 8, …, 8, 7, "one Transformer layer removed from the first and the last
  stages" (Grattafiori et al. 2024 §3.3.2); with v = 8 the first chunk holds only the embedding
  and the last only the output and the loss. It is also what Megatron-LM's
  ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`` and
  torchtitan's ``generate_llm_fqn_per_model_part`` (input and output weight 1) give whenever l + 2
  divides evenly.
* ``"slots"`` (:func:`slot_split`, the deck's seed model): when S divides l + 2 but not l, the
  embedding and the output layer take one layer's slot each on the first and the last stage;
  otherwise as even.
* ``first``/``last`` layers on the first and last pipeline ranks (Megatron-LM's
  ``--decoder-first/last-pipeline-num-layers``), each shared evenly by that rank's v chunks, the
  rest evenly over the middle ranks (:func:`first_last_split`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np

from .costs import flops
from .errors import ModelcutError
from .sim import registry
from .sim.inflight import inflight_profile, profile_uncached
from .sim.ops import Schedule
from .sim.registry import ScheduleSpec
from .specs import Layout, ModelSpec, Training


def _per_replica(layout: Layout, training: Training, name: str) -> int:
    """global_batch / (dp · ``name``), refused in one line where it does not divide."""
    size = getattr(training, name)
    per = layout.dp * size
    if training.global_batch % per:
        raise ModelcutError(f"global_batch ({training.global_batch}) must be divisible by dp × {name} "
                            f"({layout.dp} × {size})")
    return training.global_batch // per


def microbatches(layout: Layout, training: Training) -> int:
    """m = global batch / (dp · micro-batch): micro-batches per pipeline per step."""
    return _per_replica(layout, training, "micro_batch")


def flushes(layout: Layout, training: Training) -> int:
    """Pipeline schedule runs (flushes) per optimizer step: global_batch / (dp · local_batch)
    with a pipeline and a ``local_batch``, else 1. torch.distributed.pipelining runs its schedule
    over the micro-batches of one local batch (``PipelineSchedule.step``) and a stack built on it
    accumulates gradients over several such runs: NeMo AutoModel calls ``schedule.step`` once per
    gradient-accumulation step (``nemo_automodel/recipes/llm/train_ft.py``
    ``_forward_backward_step``, NVIDIA-NeMo/Automodel @89e3a9fdd), torchtitan once per
    ``training.local_batch_size`` (``torchtitan/train.py`` ``train_step``). Each run fills and
    drains the pipeline and reduces its stages' gradients after its last backward (the
    schedule's ``REDUCE_GRAD``, torch/distributed/pipelining/schedules.py ``_add_reduce_grad``),
    so the step is that many runs of :func:`flush_training`'s batch. Megatron-LM runs all
    global_batch/(dp · micro_batch) micro-batches in one schedule (no ``local_batch``)."""
    if training.local_batch is None or layout.pp == 1:
        return 1
    return _per_replica(layout, training, "local_batch")


def flush_training(layout: Layout, training: Training) -> Training:
    """The batch of one pipeline schedule run (:func:`flushes`): global_batch / flushes
    sequences, dp · local_batch of them; the training itself with one flush."""
    f = flushes(layout, training)
    if f == 1:
        return training
    return replace(training, global_batch=training.global_batch // f, local_batch=None)


def flushes_note(f: int, m: int, local_batch: int | None) -> str:
    """What a step of ``f`` schedule runs of ``m`` micro-batches each does (:func:`flushes`), as
    both step models note it."""
    return (f"{f} pipeline schedule runs a step, each of {m} micro-batches (local batch {local_batch}): each "
            "fills and drains the pipeline and reduces its gradients")


# ---------------------------------------------------------------- splits

def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Whole layers per virtual stage, forward order (module doc, ``"even"``)."""
    if stages < 1:
        raise ModelcutError(f"stages must be at least 1, got {stages}")
    q, r = divmod(layers, stages)
    light = stages - r if r else 0
    out = [q + 1 if r else q] * stages
    lo, hi = 0, stages - 1
    for k in range(light):
        if k % 2 == 0:
            out[lo] = q
            lo += 1
        else:
            out[hi] = q
            hi -= 1
    return tuple(out)


def slot_split(layers: int, stages: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(transformer layers, slots) per virtual stage (module doc, ``"slots"``): every stage the
    same slots, the end ones one transformer layer fewer, where S divides l + 2 but not l."""
    if stages > 1 and layers % stages and (layers + 2) % stages == 0:
        k = (layers + 2) // stages
        return (k - 1,) + (k,) * (stages - 2) + (k - 1,), (k,) * stages
    lay = even_split(layers, stages)
    return lay, lay


def first_last_split(layers: int, p: int, v: int, first: int | None, last: int | None) -> tuple[int, ...]:
    """Layers per virtual stage with ``first``/``last`` layers on the end ranks (module doc); the
    end not given takes the same share as each middle rank."""
    if p < 2:
        raise ModelcutError("first/last pipeline-stage layers need at least two pipeline stages")
    mid_ranks = p - 2
    ends = (first or 0) + (last or 0)
    if ends > layers:
        raise ModelcutError(f"first/last pipeline-stage layers ({ends}) exceed the model's {layers} layers")
    if first is None or last is None:
        given = first if first is not None else last
        rest, share = layers - given, mid_ranks + 1
        if rest % share:
            raise ModelcutError(f"the {rest} layers besides the {'first' if first is not None else 'last'} rank's "
                                f"{given} do not divide evenly over the other {share} pipeline ranks")
        first = rest // share if first is None else first
        last = rest // share if last is None else last
    rest = layers - first - last
    if rest < 0 or (mid_ranks and rest % mid_ranks) or (not mid_ranks and rest):
        raise ModelcutError(f"{layers} layers cannot be split as first {first}, last {last} "
                            f"and {mid_ranks} even middle ranks")
    mid = rest // mid_ranks if mid_ranks else 0
    per_rank = [first] + [mid] * mid_ranks + [last]
    for r, n in enumerate(per_rank):
        if n % v:
            raise ModelcutError(f"pipeline rank {r}'s {n} layers do not divide into {v} chunks")
    return tuple(per_rank[s % p] // v for s in range(p * v))   # stage c·p + r is chunk c of rank r


def end_ranks(split: tuple[int, ...], p: int) -> dict[str, int] | None:
    """A split (layers per virtual stage, stage c·p + r being chunk c of rank r) as a layout gives
    it: {} where it is :func:`even_split`'s; ``first_layers``/``last_layers`` where only the end
    ranks differ from the middle ones and each rank's chunks are equal (:func:`first_last_split`
    gives it back); None for any other split."""
    if split == even_split(sum(split), len(split)):
        return {}
    if p < 2 or len(split) % p:
        return None
    ranks = [split[r::p] for r in range(p)]
    middle = {sum(c) for c in ranks[1:-1]}
    if any(len(set(c)) > 1 for c in ranks) or len(middle) > 1:
        return None
    share = middle.pop() if middle else None
    ends = {f"{end}_layers": sum(c) for end, c in (("first", ranks[0]), ("last", ranks[-1]))
            if share is None or sum(c) != share}
    if ends and first_last_split(sum(split), p, len(split) // p, ends.get("first_layers"),
                                 ends.get("last_layers")) == split:
        return ends
    return None


@lru_cache(maxsize=4096)
def lighter_last(model: ModelSpec, p: int, v: int, seq: int) -> int | None:
    """The layers a lighter last pipeline rank holds (Megatron-core's
    ``num_layers_in_last_pipeline_stage``, :func:`first_last_split` with ``last`` alone) to carry the
    output layer beside its layers, balanced by forward FLOPs a token
    (:func:`..costs.flops.layer_and_output_flops_per_token`: a layer's L, the logits' O): the N, a
    multiple of v, with the other p − 1 ranks' (l − N)/(p − 1) layers whole and a multiple of v,
    that makes the busiest rank's max(N·L + O, (l − N)/(p − 1)·L) least, ties to the larger N. None
    where that is no lighter than the even split (:func:`even_split`, the last rank with the logits)
    or p < 2. The loss's memory-bound work, not counted, makes the last rank heavier still: this N
    errs on the even side."""
    if p < 2:
        return None
    L, O = flops.layer_and_output_flops_per_token(model, seq)
    l = model.layers
    split = even_split(l, p * v)
    ranks = [sum(split[r::p]) for r in range(p)]
    even = max(max(ranks[:-1]) * L, ranks[-1] * L + O)
    best: tuple[float, int] | None = None
    for n in range(v, l, v):
        rest = l - n
        if rest % (p - 1) or (rest // (p - 1)) % v or rest // (p - 1) < v:
            continue
        load = max(n * L + O, rest // (p - 1) * L)
        if best is None or load < best[0] or (load == best[0] and n > best[1]):
            best = (load, n)
    if best is None or best[0] >= even * (1 - 1e-9) or best[1] == ranks[-1]:
        return None
    return best[1]


# ---------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Stage:
    """One virtual stage: where it runs and what it holds."""

    index: int
    device: int
    layers: int          # transformer layers
    slots: int           # layer slots (the seed model's: an embedding or loss may take one)
    first_layer: int     # the model index of its first transformer layer
    moe_layers: int
    embedding: bool
    loss: bool
    rank_first: int = 0  # the layers its device holds in the stages before it (its first layer's rank-local index)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def recomputed(self, model: ModelSpec, training: Training) -> tuple[int, int]:
        """(dense, MoE) layers of this stage a micro-batch recomputes in full: all of them under
        full recomputation, the first ``recompute_layers`` with Megatron-core's block method
        (:class:`.specs.Training`; Megatron-LM core_r0.11.0 transformer_block.py
        ``_checkpointed_forward``: ``layer_idx < recompute_num_layers``), every ``recompute_every``-th
        of its device's layers with torchtitan's per-layer rule (the device's layers counted from 1
        across its stages in order: ``rank_first``), none otherwise. The one rule the step time,
        the memory and the FLOP count read."""
        if training.recompute_every is None:
            n = self._recomputed_count(training)
            moe = flops.moe_layers_in(model, self.first_layer, n)
            return n - moe, moe
        mine = [i for i in range(self.first_layer, self.first_layer + self.layers) if self.recomputes(training, i)]
        moe = sum(flops.is_moe_layer(model, i) for i in mine)
        return len(mine) - moe, moe

    def recomputes(self, training: Training, layer: int) -> bool:
        """Whether this stage recomputes the model's layer ``layer`` in full: the rule of
        :meth:`recomputed`, layer by layer (ZeRO-3's units)."""
        if training.recompute == "full" and training.recompute_every is not None:
            return (self.rank_first + layer - self.first_layer + 1) % training.recompute_every == 0
        return layer - self.first_layer < self._recomputed_count(training)

    def _recomputed_count(self, training: Training) -> int:
        """How many of the stage's first layers are recomputed in full (:meth:`recomputed`)."""
        if training.recompute != "full":
            return 0
        return self.layers if training.recompute_layers is None else min(training.recompute_layers, self.layers)


@dataclass(frozen=True)
class PipelinePlan:
    """A run laid over the pipeline (module doc)."""

    spec: ScheduleSpec
    p: int
    v: int
    m: int
    group: int | None
    stages: tuple[Stage, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def copies(self) -> int:
        return self.spec.copies

    @property
    def weight_apart(self) -> bool:
        """The step models time the weight gradient W apart from B (zero-bubble schedules)."""
        return self.spec.weight_apart

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(s.layers for s in self.stages)

    @property
    def moe(self) -> tuple[int, ...]:
        return tuple(s.moe_layers for s in self.stages)

    @property
    def passes(self) -> float:
        """Micro-batches through each stage per step: m, or m/2 with two copies (each micro-batch
        runs through one)."""
        return self.m / self.copies

    def on_device(self, device: int) -> tuple[Stage, ...]:
        """The stages a device holds, in ascending order."""
        return tuple(s for s in self.stages if s.device == device)

    @cached_property
    def schedule(self) -> Schedule:
        """The op lists (built once per plan shape and cached)."""
        return _build(self.name, self.p, self.m, self.v, self.group)

    def recomputed_layers(self, model: ModelSpec, training: Training) -> tuple[float, float]:
        """(dense, MoE) layers one micro-batch recomputes on its way through the pipeline (one
        model copy's stages: :meth:`Stage.recomputed`)."""
        per = [st.recomputed(model, training) for st in self.stages]
        return sum(d for d, _ in per) / self.copies, sum(e for _, e in per) / self.copies

    def in_flight(self, cached: bool = True, basis: tuple[tuple[float, ...], ...] | None = None
                  ) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
        """Per device: its stages and, per in-flight candidate (:mod:`.sim.inflight`), the held
        micro-batches weighted into counts of (dense layers, MoE layers, embeddings, losses), or
        of ``basis``'s columns (one row a stage), so that a device's activation peak is one matrix
        product. ``cached=False`` rebuilds the full schedule (a benchmark's baseline)."""
        key = self._basis_key if basis is None else tuple(tuple(row) for row in basis)
        if cached:
            m = self.spec.equivalent_microbatches(self.p, self.m, self.group)
            return _coefficients(self.name, self.p, m, self.v, self.group, key)
        return _coefficients_of(profile_uncached(self.name, self.p, self.m, self.v, self.group), key)

    @property
    def _basis_key(self) -> tuple[tuple[int, int, bool, bool], ...]:
        return tuple((s.dense_layers, s.moe_layers, s.embedding, s.loss) for s in self.stages)


@lru_cache(maxsize=256)
def _build(name: str, p: int, m: int, v: int, group: int | None) -> Schedule:
    return registry.build(name, p, m, v, group)


def _coefficients_of(prof, basis_key) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
    out = []
    for stages, cands in prof:
        basis = np.array([basis_key[s] for s in stages], dtype=float)
        coef = cands @ basis if len(stages) else np.zeros((0, len(basis_key[0]) if basis_key else 4))
        out.append((stages, np.unique(coef, axis=0)))
    return tuple(out)


@lru_cache(maxsize=8192)
def _coefficients(name: str, p: int, m: int, v: int, group: int | None, basis_key):
    return _coefficients_of(inflight_profile(name, p, m, v, group), basis_key)


def _copy_split(model: ModelSpec, spec: ScheduleSpec, p: int, v: int, balance: str,
                stage_layers: tuple[int, ...] | None, first: int | None, last: int | None):
    """(layers, slots) of one model copy's stages."""
    per_copy = p * v // spec.copies
    if stage_layers is not None:
        base = tuple(stage_layers)
        if spec.copies == 2 and len(base) == 2 * per_copy and base[:per_copy] == base[per_copy:]:
            base = base[:per_copy]
        if len(base) != per_copy or sum(base) != model.layers or min(base) < 0:
            raise ModelcutError(f"stage_layers must give {per_copy} stages summing to {model.layers} layers"
                                + (" (each device holds one stage of each direction's copy)" if spec.copies == 2
                                   else ""))
        return base, base
    if first is not None or last is not None:
        if spec.placement == "v" and spec.copies == 1:
            raise ModelcutError(f"first/last pipeline-stage layers assume Megatron-LM's placement, not "
                                f"{spec.name}'s V")
        lay = first_last_split(model.layers, per_copy // v if spec.copies == 1 else per_copy,
                               v if spec.copies == 1 else 1, first, last)
        return lay, lay
    if per_copy > model.layers + 2:
        raise ModelcutError(f"pp × vpp = {p * v} pipeline stages for {model.layers} layers: at most layers + 2 "
                            "(the embedding and the output layer may take a stage each)"
                            + (f" per copy ({spec.name} holds {spec.copies})" if spec.copies > 1 else ""))
    if balance == "slots":
        return slot_split(model.layers, per_copy)
    lay = even_split(model.layers, per_copy)
    return lay, lay


def resolve(model: ModelSpec, layout: Layout, training: Training, *, v: int, schedule: str | None = None,
            balance: str = "even", stage_layers: tuple[int, ...] | None = None, first_layers: int | None = None,
            last_layers: int | None = None, group: int | None = None) -> PipelinePlan:
    """The plan of a run with v chunks per device under ``schedule`` (default: the registry's
    default for v, :func:`.sim.registry.default_schedule`). ``balance``: "even" or "slots"
    (module doc); ``stage_layers`` gives the split outright; ``group`` is the interleaved
    schedule's micro-batch group size N (default p). The schedule's own size rules apply."""
    p = layout.pp
    if training.seq_len % layout.cp:
        raise ModelcutError(f"cp ({layout.cp}) must divide seq_len ({training.seq_len})")
    spec = registry.get(schedule) if schedule is not None else registry.default_schedule(v)
    m = microbatches(layout, training)
    spec.validate(p, m, v, group)
    lay, slots = _copy_split(model, spec, p, v, balance, stage_layers, first_layers, last_layers)
    stages, per_copy, held = [], len(lay), {}
    for s in range(p * v):
        c = s % per_copy
        start, device = sum(lay[:c]), spec.device_of(s, p)
        stages.append(Stage(index=s, device=device, layers=lay[c], slots=slots[c], first_layer=start,
                            moe_layers=flops.moe_layers_in(model, start, lay[c]),
                            embedding=c == 0, loss=c == per_copy - 1, rank_first=held.get(device, 0)))
        held[device] = held.get(device, 0) + lay[c]
    return PipelinePlan(spec, p, v, m, group if spec.grouped else None, tuple(stages))
