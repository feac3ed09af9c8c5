"""PyTorch's context-parallel merges, counted in PyTorch's own code: the bytes each aten op of
``_SDPAMerger`` and of the backward's accumulation reads and writes (torch 2.13, CPU tensors, a
dispatch mode that sums each op's inputs and fresh outputs) against the per-element constants the
step model charges (:mod:`modelcut.core.costs.context`, ``torch_merge_bytes``)."""

from __future__ import annotations

import pytest

from modelcut.core.costs import context

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from torch.distributed.tensor.experimental._context_parallel._attention import (  # noqa: E402
    _partial_update, _SDPAMerger)

pytestmark = pytest.mark.torch

B, H, S, D = 1, 4, 256, 128
E = B * H * S * D            # output elements
ROWS = B * H * S             # log-sum-exp elements


class Traffic(TorchDispatchMode):
    """Bytes moved by the aten ops run under it: every tensor input read once, every output that
    is not a view of an input written once, an in-place op's target written as well."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        storages = {i.untyped_storage().data_ptr() for i in ins}
        fresh = [o for o in outs if o.untyped_storage().data_ptr() not in storages]
        inplace = func._schema.name.endswith("_") and not func._schema.name.startswith("aten::_")
        if fresh or inplace:
            self.bytes += sum(t.numel() * t.element_size() for t in ins + fresh)
            if inplace:
                self.bytes += args[0].numel() * args[0].element_size()
        return out


def test_an_eager_merge_moves_38_bytes_an_output_element():
    """A step after the first: the cast of the step's bf16 output to FP32 and the three elementwise
    ops of ``out - sigmoid(block_lse - lse) * (out - block_out)``, 38 bytes an element, plus the
    log-sum-exp's own ops, under 64/d bytes an element."""
    merger = _SDPAMerger(True, seq_dim=2)
    merger.step(torch.randn(B, H, S, D, dtype=torch.bfloat16), torch.randn(B, H, S), False)
    out, lse = torch.randn(B, H, S, D, dtype=torch.bfloat16), torch.randn(B, H, S)
    with Traffic() as t:
        merger.step(out, lse, False)
    assert context.TORCH_EAGER_MERGE_BYTES == 38
    assert 38 * E <= t.bytes <= 38 * E + 64 * ROWS


def test_the_casts_and_accumulations_move_what_the_model_charges():
    """The first step's and the result's casts (6 bytes an element), an FP32 gradient accumulating
    a bf16 one (10), the backward's partial update of dK (half an accumulation and a whole FP32
    copy: 13) and the concatenation of K and V before a rotation (4)."""
    merger = _SDPAMerger(True, seq_dim=2)
    first = torch.randn(B, H, S, D, dtype=torch.bfloat16)
    with Traffic() as t:
        merger.step(first, torch.randn(B, H, S), False)
    assert context.TORCH_CAST_BYTES * E <= t.bytes <= context.TORCH_CAST_BYTES * E + 16 * ROWS
    with Traffic() as t:
        merger.results()
    assert context.TORCH_CAST_BYTES * E <= t.bytes <= context.TORCH_CAST_BYTES * E + 16 * ROWS

    acc, grad = torch.zeros(B, H, S, D), torch.randn(B, H, S, D, dtype=torch.bfloat16)
    with Traffic() as t:
        acc += grad
    assert t.bytes == context.TORCH_ACCUM_BYTES * E

    half = torch.randn(B, H, S // 2, D, dtype=torch.bfloat16)
    with Traffic() as t:
        _partial_update(acc, half, dim=2, n_chunks=2, idx=0, add=True)
    assert t.bytes == (context.TORCH_ACCUM_BYTES / 2 + context.TORCH_COPY32_BYTES) * E

    k, v = (torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(2))
    with Traffic() as t:
        torch.cat([k.flatten(), v.flatten()])
    assert t.bytes == context.TORCH_COPY16_BYTES * 2 * E
