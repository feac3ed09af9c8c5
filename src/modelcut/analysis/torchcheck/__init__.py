"""Checks of modelcut against PyTorch's own pipeline runtime (``torch.distributed.pipelining``).

Needs the optional extra ``modelcut[torch]``; every module here imports torch lazily, inside
its functions, so ``import modelcut.analysis.torchcheck`` works without torch.

* :mod:`.orders`: torch's schedules built without a cluster, their executed action order
  read back as modelcut :class:`~modelcut.core.sim.ops.Schedule` objects and compared with
  modelcut's own op lists;
* :mod:`.runner`: real multi-process runs (gloo on loopback) with controlled stage times;
* :mod:`.fit`: per-action overhead and point-to-point latency fitted on a measured run.
"""

from __future__ import annotations

from ...core.errors import ModelcutError

INSTALL_HINT = "torch is not installed; install the extra: pip install 'modelcut[torch]'"


def require_torch():
    """Import torch or raise the one-line user error naming the extra to install."""
    try:
        import torch  # noqa: F401
        import torch.distributed.pipelining.schedules  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ModelcutError(INSTALL_HINT) from exc
    return torch
