"""A run that does not fit says which single change of its settings makes it fit, each change
checked by predicting the changed run (service/predict.py fit_changes)."""

from __future__ import annotations

import json
import re

import pytest

from modelcut.cli import main

RUN = """[model]
name = "{model}"
[hardware]
gpu = "{gpu}"
gpus = {gpus}
[layout]
{layout}
[training]
seq_len = {seq}
global_batch = {gbs}
micro_batch = {mb}
recompute = "{rc}"
[settings]
framework = "{fw}"
"""


def _predict(capsys, path) -> dict:
    assert main(["predict", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _note(ans) -> str | None:
    return next((n for n in ans["notes"] if n.startswith(("to fit", "no single change"))), None)


@pytest.mark.parametrize("fields, offered", [
    (dict(model="llama3-8b", gpu="h100", gpus=8, layout="dp = 8", seq=8192, gbs=8, mb=1, rc="none", fw="nemo"),
     {"recompute full", "ZeRO-2"}),
    (dict(model="mpt-7b", gpu="a100-80gb", gpus=8, layout="dp = 8", seq=8192, gbs=16, mb=2, rc="none",
          fw="llm-foundry"), {"recompute full", "micro-batch 1"}),
])
def test_each_change_offered_fits_when_predicted(tmp_path, capsys, fields, offered):
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(**fields))
    ans = _predict(capsys, path)
    assert ans["memory"]["fits"] is False
    note = _note(ans)
    assert note and note.startswith("to fit, one change (the rest as given): "), ans["notes"]
    changes = re.findall(r"(recompute \w+|micro-batch \d+|ZeRO-\d) \(([\d.]+) GB, step ([\d.]+) s", note)
    assert {c[0] for c in changes} == offered
    for label, gb, step in changes:
        f = dict(fields)
        if label.startswith("recompute"):
            f["rc"] = label.split()[1]
        elif label.startswith("micro-batch"):
            f["mb"] = int(label.split()[1])
        else:
            f["layout"] += f"\nzero = {label[-1]}"
        path.write_text(RUN.format(**f))
        got = _predict(capsys, path)
        assert got["memory"]["fits"] is True and _note(got) is None
        assert got["memory"]["peak_bytes"] / 1e9 == pytest.approx(float(gb), abs=0.05)
        assert got["step_time_s"] == pytest.approx(float(step), rel=1e-3)


def test_when_no_single_change_fits_it_says_so(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(model="llama3-405b", gpu="h100", gpus=8, layout="tp = 8", seq=8192, gbs=8, mb=1,
                               rc="none", fw="megatron-core"))
    ans = _predict(capsys, path)
    assert _note(ans).startswith("no single change of recomputation, micro-batch or ZeRO stage makes it fit")


def test_a_run_that_fits_gets_no_such_note(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(model="llama3-8b", gpu="h100", gpus=8, layout="dp = 8", seq=4096, gbs=8, mb=1,
                               rc="none", fw="nemo"))
    ans = _predict(capsys, path)
    assert ans["memory"]["fits"] is True and _note(ans) is None


def test_a_change_whose_prediction_is_over_the_limits_is_not_offered(tmp_path, capsys):
    """A smaller micro-batch simulates more of them: over --max-ops (the web's caps are lower), it is
    left out rather than predicted past the limit the run itself was held to."""
    path = tmp_path / "run.toml"
    path.write_text(RUN.format(model="mpt-7b", gpu="a100-80gb", gpus=8, layout="dp = 8", seq=8192, gbs=16, mb=2,
                               rc="none", fw="llm-foundry"))
    assert main(["predict", str(path), "--json", "--max-ops", "5"]) == 0     # its one micro-batch: 3 ops
    note = _note(json.loads(capsys.readouterr().out))
    assert "recompute full" in note and "micro-batch" not in note
