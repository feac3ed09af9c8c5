"""Golden outputs: what the command line prints as JSON for a fixed set of requests.

``python tests/golden/capture.py`` writes them to ``tests/golden/*.json``;
``tests/test_golden.py`` runs the same commands and compares every number to 1e-9 relative.
A change that means to move a figure (a bug fixed, a better model) rewrites these files in
a commit of its own that says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"

#: name -> the command's arguments (each prints one JSON object).
COMMANDS: dict[str, list[str]] = {
    "validate_seed": ["validate", "--json"],
    "validate_default": ["validate", "--mode", "default", "--json"],
    "bubble_table": ["bubble-table", "--json"],
    "explore_llama3_70b_64": ["explore", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                              "--global-batch-tokens", "1M", "--top", "20", "--json"],
}
for _f in ("gpt3-175b.toml", "gpt3-175b-nemo-h100.toml", "llama3-405b-128k.toml", "deepseek-v3-2048.toml"):
    COMMANDS[f"predict_default_{_f.removesuffix('.toml')}"] = ["predict", str(DATA / _f), "--json"]
    COMMANDS[f"predict_seed_{_f.removesuffix('.toml')}"] = ["predict", str(DATA / _f), "--mode", "seed", "--json"]


def output(args: list[str]) -> dict:
    """The JSON object ``modelcut ARGS`` prints."""
    from modelcut.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(args))
    if rc != 0:
        raise RuntimeError(f"modelcut {' '.join(args)} exited {rc}")
    return json.loads(buf.getvalue())


def main() -> None:
    names = sys.argv[1:] or list(COMMANDS)
    for name in names:
        path = HERE / f"{name}.json"
        path.write_text(json.dumps(output(COMMANDS[name]), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    main()
