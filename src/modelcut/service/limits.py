"""The caps every face enforces, in one place: ops one simulation may hold, layouts one search may
cover, GPUs, sizes, times. Work over a cap is refused in one line (:class:`LimitError`) before it
starts, by the service, for the command line, the web API and the Python entry points alike.

The command line raises a cap with a flag named after it (``--max-ops``, ``--max-layouts``,
``--max-gpus``, ``--max-seq``); the web app runs with :data:`WEB`, whose work caps are lower so
that one request answers in seconds and a few hundred megabytes. The size caps are the same for
every face, and the web API's schema states them (:mod:`.requests`).

The defaults are far beyond any published run (Llama 3 405B: 126 layers, hidden 16,384,
16,384 GPUs, 131,072-token context) and keep every figure inside a float and every loop short.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..core.errors import ModelcutError


class LimitError(ModelcutError):
    """Work over one of the caps of :class:`Limits`, refused before it starts."""

    def __init__(self, message: str, cap: str = ""):
        super().__init__(message)
        self.cap = cap


#: Each cap: (what it counts, the command-line flag that raises it).
CAPS: dict[str, tuple[str, str]] = {
    "max_ops": ("ops per simulation", "--max-ops"),
    "max_layouts": ("layouts per search", "--max-layouts"),
    "max_search_ops": ("simulated ops per search", "--max-search-ops"),
    "max_gpus": ("GPUs", "--max-gpus"),
    "max_seq": ("tokens per sequence", "--max-seq"),
    "max_tokens": ("tokens per step", "--max-tokens"),
    "max_layers": ("layers", "--max-layers"),
    "max_width": ("", "--max-width"),
    "max_time": ("time units per op", "--max-time"),
}


@dataclass(frozen=True)
class Limits:
    """Caps on one request's work and sizes. ``flags``: name the command-line flag that raises a
    cap in the refusal (off for the web, whose caps are the server's)."""

    #: Ops one simulation may hold (p·v·m·kinds; a prediction's pipeline counts too): about
    #: 200 bytes and 4 µs each (``simulate -p 128 -m 2048 -v 4`` holds 2,097,152).
    max_ops: int = 4_194_304
    #: Candidate layouts (structures × recomputation × ZeRO stage) one explorer search may cover,
    #: counted as the search counts them, after the stack's rules: Qwen3-235B-A22B on 256 H100 under
    #: megatron-bridge (4K sequences, 8M tokens) covers 88,545 (``--max-layouts 50000`` refuses it).
    max_layouts: int = 200_000
    #: Pipeline ops one explorer search may simulate, counted before it starts as each shape's
    #: p·v·m·3 over the shapes the stack runs (a worst case: the search times the few shapes its
    #: bound cannot rule out, once or a few times each): Llama 3 70B on 512 H100 (8K sequences, 4M
    #: tokens) counts about 15 million.
    max_search_ops: int = 1_000_000_000
    #: Accelerators a layout, a mesh or a search may use (2^20).
    max_gpus: int = 1 << 20
    #: Tokens per sequence (2^24, 16,777,216).
    max_seq: int = 1 << 24
    #: Tokens per optimizer step (2^40, about a trillion).
    max_tokens: int = 1 << 40
    #: Transformer layers of a model.
    max_layers: int = 100_000
    #: Hidden and MLP widths, heads, vocabulary, experts of a model.
    max_width: int = 10_000_000
    #: Largest op time, send time or F:B:W share (arbitrary units): beyond it simulated times
    #: lose their resolution; no pipeline needs a ratio this wide.
    max_time: float = 1e9
    flags: bool = True

    def raised(self, **caps: Any) -> "Limits":
        """These limits with the caps given (None keeps a cap); each must be a positive number."""
        given = {k: v for k, v in caps.items() if v is not None}
        for k, v in given.items():
            if k not in CAPS:
                raise ModelcutError(f"unknown limit {k!r}; the limits are {', '.join(CAPS)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
                raise ModelcutError(f"{CAPS[k][1]} must be a positive number, got {v!r}")
            if isinstance(getattr(self, k), int) and (not float(v).is_integer()):
                raise ModelcutError(f"{CAPS[k][1]} must be a whole number, got {v!r}")
        return replace(self, **{k: type(getattr(self, k))(v) for k, v in given.items()})

    def _tail(self, cap: str) -> str:
        return f" ({CAPS[cap][1]} raises it)" if self.flags else ""

    def _cap(self, cap: str) -> str:
        val = getattr(self, cap)
        return " ".join(x for x in (f"{val:,}" if isinstance(val, int) else f"{val:g}", CAPS[cap][0]) if x)

    def refuse(self, cap: str, message: str) -> LimitError:
        """The one-line refusal: ``message``, the cap, and how to raise it."""
        return LimitError(f"{message}; the limit is {self._cap(cap)}{self._tail(cap)}", cap)

    def check(self, cap: str, value: int | float, what: str) -> None:
        """Refuse ``value`` above the cap, naming ``what`` it is."""
        if value > getattr(self, cap):
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
            raise LimitError(f"{what} = {shown} is beyond the limit of {self._cap(cap)}{self._tail(cap)}", cap)

    def check_ops(self, ops: int, what: str) -> None:
        """Refuse a simulation of more than :attr:`max_ops` ops; ``what`` names the work."""
        if ops > self.max_ops:
            raise self.refuse("max_ops", f"{what} needs {ops:,} ops")

    def check_layouts(self, layouts: int, more: bool = False) -> None:
        """Refuse a search over more than :attr:`max_layouts` layouts; ``more``: the count stopped
        past the cap (the space holds more than it)."""
        if more or layouts > self.max_layouts:
            held = f"more than {self.max_layouts:,}" if more else f"{layouts:,}"
            raise self.refuse("max_layouts", f"the explorer space holds {held} layouts the stack runs (structures × "
                                             "recomputation × ZeRO stage): fix schedules or micro-batch sizes")

    def check_model(self, spec: Any) -> None:
        """A model's layers and widths within the caps, before any arithmetic on them."""
        self.check("max_layers", spec.layers, "model layers")
        for name in ("hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "head_dim", "experts",
                     "expert_ffn_hidden", "top_k", "shared_experts", "max_seq"):
            val = getattr(spec, name, None)
            if isinstance(val, int) and not isinstance(val, bool):
                self.check("max_seq" if name == "max_seq" else "max_width", val, f"model {name}")

    def check_pipeline(self, layers: int, microbatches: int, stages: int | None = None) -> None:
        """A prediction simulates at most (layers + 2) stages × m micro-batches × 3 op kinds."""
        s = layers + 2 if stages is None else stages
        ops = s * microbatches * 3
        if ops > self.max_ops:
            raise self.refuse("max_ops", f"{microbatches:,} micro-batches through {s:,} pipeline stages may "
                                         f"need {ops:,} simulated ops")


#: The command line's limits (and the Python entry points' default).
DEFAULT = Limits()
#: The web app's: one request answers in seconds, within a few hundred megabytes.
WEB = Limits(max_ops=1_000_000, max_layouts=100_000, max_search_ops=200_000_000, flags=False)
