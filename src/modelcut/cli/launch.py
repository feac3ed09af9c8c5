"""``modelcut from-megatron`` and ``modelcut from-torchtitan``: Megatron-LM launch arguments and a
torchtitan job configuration as a RUN.toml (the reverses of ``explore --emit megatron`` and
``--emit torchtitan``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..core.errors import ModelcutError
from ..service.megatron_args import run_file_text
from ..service.torchtitan_config import run_file_text as titan_text
from .app import app
from .common import limit_option, limits, write_file


def _read(source: str) -> str:
    """A file's text, or standard input's for "-"; one line where it cannot be read."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelcutError(f"{source}: cannot read it ({exc.__class__.__name__})") from None


def _give(toml: str, out: Path | None) -> None:
    """The RUN.toml printed, or written to ``out``."""
    if out is None:
        print(toml, end="")
    else:
        write_file(out, toml)


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
    text = _read(args)
    _give(run_file_text(text, args, gpu=gpu, gpus=gpus, model=model, vocab=vocab, gpus_per_node=gpus_per_node,
                        framework=framework, limits=limits(max_gpus=max_gpus)), out)


@app.command("from-torchtitan")
def from_torchtitan(
    config: str = typer.Argument(..., metavar="CONFIG", help="a torchtitan job configuration (TOML), or - for "
                                                              "standard input"),
    gpu: str = typer.Option(..., "--gpu", help="the accelerator (a catalog name or alias)"),
    gpus: int = typer.Option(..., "--gpus", help="the world size: the GPUs the job runs on"),
    model: Optional[str] = typer.Option(None, "--model", help="a catalog model instead of [model] name and flavor"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="accelerators per node (default: "
                                                                              "the hardware's)"),
    framework: Optional[str] = typer.Option(None, "--framework", help="the preset to time it on (default: "
                                                                      "fsdp-compile with [compile] enable, else fsdp)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the RUN.toml here (default: print it)"),
    max_gpus: Optional[int] = limit_option("max_gpus"),
) -> None:
    """A torchtitan job configuration as a RUN.toml for modelcut predict: the model, the layout, the
    batch, activation checkpointing, float8 and compilation as torchtitan v0.2.2 reads them (its
    defaults where a key is absent); the keys it does not read are listed at the top."""
    text = _read(config)
    _give(titan_text(text, config, gpu=gpu, gpus=gpus, model=model, gpus_per_node=gpus_per_node,
                     framework=framework, limits=limits(max_gpus=max_gpus)), out)
