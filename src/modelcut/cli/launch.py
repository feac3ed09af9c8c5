"""``modelcut from-megatron``: Megatron-LM launch arguments as a RUN.toml (the reverse of
``explore --emit megatron``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..core.errors import ModelcutError
from ..service.megatron_args import run_file_text
from .app import app
from .common import limit_option, limits, write_file


@app.command("from-megatron")
def from_megatron(
    args: str = typer.Argument(..., metavar="ARGS", help="a file of Megatron-LM launch arguments (a launch script "
                                                          "or its pasted line), or - for standard input"),
    gpu: str = typer.Option(..., "--gpu", help="the accelerator (a catalog name or alias)"),
    gpus: int = typer.Option(..., "--gpus", help="the world size: the GPUs the arguments are launched on"),
    model: Optional[str] = typer.Option(None, "--model", help="a catalog model instead of the arguments' shape flags"),
    vocab: Optional[int] = typer.Option(None, "--vocab", help="the tokenizer's vocabulary (where the arguments have "
                                                              "no --vocab-size), padded as Megatron-LM pads it"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="accelerators per node (default: "
                                                                              "the hardware's)"),
    framework: str = typer.Option("megatron-core", "--framework", help="the preset to time it on (a Megatron stack: "
                                                                       "megatron-core, nemo, megatron-bridge, ...)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the RUN.toml here (default: print it)"),
    max_gpus: Optional[int] = limit_option("max_gpus"),
) -> None:
    """Megatron-LM launch arguments as a RUN.toml for modelcut predict: the model's shape, the layout,
    the batch, recomputation, precision and the overlaps the flags set (Megatron-LM's defaults where
    a flag is absent); the flags it does not read are listed at the top."""
    if args == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(args).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelcutError(f"{args}: cannot read it ({exc.__class__.__name__})") from None
    toml = run_file_text(text, args, gpu=gpu, gpus=gpus, model=model, vocab=vocab, gpus_per_node=gpus_per_node,
                         framework=framework, limits=limits(max_gpus=max_gpus))
    if out is None:
        print(toml, end="")
    else:
        write_file(out, toml)
