"""How evenly a pipeline's devices are loaded: the busiest device sets the pace of the schedule's
steady state, so a device that holds more work than the others (the last rank's output layer
and loss, the first rank's embedding, an uneven split of the layers) slows every micro-batch.

A device's busy time is the sum of its ops' durations over the step (forward, backward and, with a
split backward, weight-gradient ops of every micro-batch through every stage it holds), as the
default model simulates them (:func:`.default.predict`'s ``device_busy_s``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import PipelinePlan

#: How far above the devices' mean the busiest one must be for a prediction to call the pipeline
#: uneven: 5 %, a reporting threshold (what is worth a line), not a physical constant.
UNEVEN_SHARE = 0.05


@dataclass(frozen=True)
class Balance:
    """The busiest pipeline device against the mean: its rank, busy seconds, the mean's, and what
    it holds (its transformer layers, and the embedding or the output layer and loss)."""

    device: int
    busy_s: float
    mean_s: float
    layers: int
    embedding: bool
    loss: bool

    @property
    def excess(self) -> float:
        """The busiest device's busy time over the mean, less 1."""
        return self.busy_s / self.mean_s - 1 if self.mean_s > 0 else 0.0

    @property
    def holds(self) -> str:
        """What the busiest device holds, in words."""
        extra = [x for x, on in (("the embedding", self.embedding), ("the output layer and loss", self.loss)) if on]
        return " and ".join([f"{self.layers} layer{'s' if self.layers != 1 else ''}"] + extra)

    def sentence(self) -> str:
        """One line: the busiest rank, its time against the mean, what it holds."""
        return (f"pipeline rank {self.device} works {self.busy_s:.3f} s of the step against {self.mean_s:.3f} s "
                f"on the average rank (+{self.excess:.0%}; it holds {self.holds}): the schedule runs at its pace")


def pipeline_balance(plan: PipelinePlan | None, busy: tuple[float, ...]) -> Balance | None:
    """The busiest of ``busy`` (one entry per pipeline device of ``plan``) against their mean, where
    it is more than :data:`UNEVEN_SHARE` above it; None with one device or an even load."""
    if plan is None or len(busy) < 2 or len(busy) != plan.p:
        return None
    mean = sum(busy) / len(busy)
    d = max(range(len(busy)), key=lambda i: busy[i])
    if mean <= 0 or busy[d] <= (1 + UNEVEN_SHARE) * mean:
        return None
    mine = plan.on_device(d)
    return Balance(d, busy[d], mean, sum(st.layers for st in mine), any(st.embedding for st in mine),
                   any(st.loss for st in mine))
