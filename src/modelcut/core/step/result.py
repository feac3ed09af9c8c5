"""What a step-time model returns: the step time, throughput, MFU, and where the time goes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..plan import PipelinePlan


@dataclass
class Breakdown:
    """Where the step goes, in seconds, on the pipeline's busiest device; sums to the step."""

    compute_s: float
    tp_s: float
    cp_s: float
    p2p_s: float
    bubble_s: float
    dp_s: float
    a2a_s: float = 0.0

    def __post_init__(self) -> None:     # plain floats (the engine's arrays yield numpy scalars)
        for name in self.__dataclass_fields__:
            setattr(self, name, float(getattr(self, name)))

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_s + self.cp_s + self.p2p_s + self.bubble_s + self.dp_s
                + self.a2a_s)


@dataclass
class DefaultBreakdown(Breakdown):
    """The seed's breakdown plus the optimizer step; sums to the step time."""

    optimizer_s: float = 0.0

    @property
    def total_s(self) -> float:
        return super().total_s + self.optimizer_s


@dataclass
class Prediction:
    """One run's predicted step. ``plan`` is the pipeline the model timed (memory reads the same
    one); ``stage_layers`` its layers per virtual stage. ``tflops_per_gpu``: ``flops_per_step``
    (eq. 3 of Narayanan et al. 2021 with full recomputation, PaLM's 6N + 12·l·s·d otherwise, the
    deck's count) over n·T. ``mfu``: the seed's, that count over n·T·peak; the default model's, the
    work it times, :func:`..costs.flops.causal_model_flops` (causal attention, no recomputation),
    over n·T·peak, never above 1. ``device_busy_s``: each pipeline device's op time over the step
    (the default model: one entry a pipeline device, one without a pipeline; empty in the seed mode and for ZeRO-3 without a pipeline): the busiest sets the schedule's pace
    (:func:`.balance.pipeline_balance`)."""

    step_time_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown: Breakdown
    flops_per_step: float
    microbatches: int
    vpp: int
    schedule: str
    notes: list[str] = field(default_factory=list)
    mode: str = "seed"
    eta: float = 0.0
    stage_layers: tuple[int, ...] = ()
    pipeline_method: str = ""   # "simulation" or "closed form (equal to the simulation)"
    plan: PipelinePlan | None = field(default=None, repr=False, compare=False)
    flushes: int = 1            # pipeline schedule runs per step, each of ``microbatches``
    timeline: tuple = field(default=(), repr=False, compare=False)   # :class:`.timeline.Segment` s, when asked
    device_busy_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in ("step_time_s", "tflops_per_gpu", "mfu", "flops_per_step", "eta"):
            setattr(self, name, float(getattr(self, name)))
        self.microbatches, self.vpp, self.flushes = int(self.microbatches), int(self.vpp), int(self.flushes)
        self.device_busy_s = tuple(float(b) for b in self.device_busy_s)

    def as_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
                "breakdown": self.breakdown.as_dict(), "flops_per_step": self.flops_per_step,
                "microbatches": self.microbatches, "flushes": self.flushes, "vpp": self.vpp,
                "schedule": self.schedule,
                "mode": self.mode, "eta": self.eta, "stage_layers": list(self.stage_layers),
                "pipeline_method": self.pipeline_method, "device_busy_s": list(self.device_busy_s),
                "notes": list(self.notes)}
