"""A power-capped variant of an accelerator: its sustained matmul share is the measured share of
its die held to its cap (``kernels.power_capped_share``), its memory and bandwidth its own."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from modelcut import catalog
from modelcut.cli import app, main
from modelcut.core.costs.kernels import fused_tflops, hbm_bandwidth, power_capped_share, product_tflops
from modelcut.core.errors import ModelcutError

H100 = catalog.hardware("h100")
CAPPED = catalog.hardware("h100-96gb")


@settings(max_examples=80, deadline=None)
@given(share=st.floats(0.05, 1.0), measured=st.floats(100, 1500), cap=st.floats(50, 2000), more=st.floats(0, 500))
def test_a_cap_never_raises_the_share_and_a_higher_cap_never_lowers_it(share, measured, cap, more):
    s = power_capped_share(share, measured, cap)
    assert 0 < s <= share * (1 + 1e-12)
    assert power_capped_share(share, measured, cap + more) >= s * (1 - 1e-12)
    if cap >= measured:
        assert s == pytest.approx(share)


def test_the_share_goes_as_the_cube_root_of_the_power():
    """Half the power, 0.794 of the clock (2^(-1/3)); an eighth of the power, half the clock."""
    assert power_capped_share(0.9, 600, 300) == pytest.approx(0.9 * 0.5 ** (1 / 3))
    assert power_capped_share(0.9, 800, 100) == pytest.approx(0.45)


@pytest.mark.parametrize("args", [(0.0, 685, 500), (1.2, 685, 500), (0.9, 0, 500), (0.9, 685, -1)])
def test_impossible_inputs_are_refused(args):
    with pytest.raises(ModelcutError):
        power_capped_share(*args)


def test_the_500_w_h100_is_the_h100_sxm_held_to_500_w():
    """Its share is derived, not written: the H100 SXM's measured 0.888 at ~685 W, held to 500 W."""
    assert CAPPED.name == "h100-sxm5-96gb-500w"
    assert CAPPED.sustained_frac == pytest.approx(H100.sustained_frac * (500 / 685) ** (1 / 3))
    assert CAPPED.sustained_frac == pytest.approx(0.7995, abs=1e-4)
    assert CAPPED.peak_flops_16 == H100.peak_flops_16 and CAPPED.arch == H100.arch
    assert CAPPED.mem_bytes == 94 * 2**30 and CAPPED.mem_bw == 2.4e12
    for g in ("h100-96gb", "H100 96GB", "grand-teton-h100", "h100-96gb-500w"):
        assert catalog.hardware(g).name == CAPPED.name


def test_its_kernels_run_at_its_clock_and_its_memory_at_its_bandwidth():
    ratio = CAPPED.sustained_frac / H100.sustained_frac
    assert product_tflops(8192, 8192, 8192, CAPPED) == pytest.approx(ratio * product_tflops(8192, 8192, 8192, H100))
    capped, full = fused_tflops("flash2", CAPPED, True, 128, 8192), fused_tflops("flash2", H100, True, 128, 8192)
    assert capped[0] == pytest.approx(ratio * full[0]) and capped[1] == pytest.approx(ratio * full[1])
    assert hbm_bandwidth(CAPPED) / hbm_bandwidth(H100) == pytest.approx(2.4 / 3.35)


RUN = """[model]
name = "llama3-8b"
[hardware]
gpu = "{gpu}"
gpus = 8
[layout]
dp = 8
zero = 3
[training]
seq_len = 8192
micro_batch = 1
global_batch = 8
[settings]
framework = "fsdp-compile"
"""


def _predict(tmp_path, gpu: str) -> dict:
    f = tmp_path / f"{gpu}.toml"
    f.write_text(RUN.format(gpu=gpu))
    r = CliRunner().invoke(app, ["predict", str(f), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_a_step_on_the_capped_part_is_slower_and_has_more_room(tmp_path):
    """The same run on the 500 W, 96 GB part: slower than on the 700 W H100 by no more than its
    products' clock and its memory's bandwidth allow, with 94 GiB to fit in."""
    full, capped = _predict(tmp_path, "h100"), _predict(tmp_path, "h100-96gb")
    slower = capped["step_time_s"] / full["step_time_s"]
    assert 1.0 < slower <= max(H100.sustained_frac / CAPPED.sustained_frac, 3.35 / 2.4) + 1e-9
    assert capped["memory"]["capacity_bytes"] > full["memory"]["capacity_bytes"]
    assert math.isclose(capped["mfu"] * slower, full["mfu"], rel_tol=1e-6)


def test_any_gpu_with_a_measured_draw_can_be_held_to_a_lower_limit():
    """``<gpu>@<watts>w``: the catalog GPU with its sustained share held to that limit, nothing
    else changed; at or above the draw its share was measured at, the share is unchanged."""
    for name, base in (("h100@500w", H100), ("H100 @ 600 W", H100), ("b200@800w", catalog.hardware("b200")),
                       ("h100-96gb@400w", CAPPED)):
        hw = catalog.hardware(name)
        assert hw.sustained_frac == pytest.approx(
            power_capped_share(base.sustained_frac, base.sustained_power_w, hw.power_w))
        assert (hw.mem_bytes, hw.mem_bw, hw.peak_flops_16, hw.link_bw) == (
            base.mem_bytes, base.mem_bw, base.peak_flops_16, base.link_bw)
        assert catalog.hardware(hw.name) == hw          # its name resolves again (a run keeps it)
    assert catalog.hardware("h100@500w").sustained_frac == pytest.approx(CAPPED.sustained_frac)
    assert catalog.hardware("h100@690w").sustained_frac == H100.sustained_frac


@pytest.mark.parametrize("name, says", [
    ("h100@900w", "above its 700 W limit"),
    ("h100@150w", "below its 200 W minimum"),
    ("b200@100w", "below its 200 W minimum"),
    ("a100@300w", "no power draw is known"),          # the A100 PCIe's 300 W rate contradicts the cube law
    ("gh200@500w", "no power draw is known"),
    ("gb200@1000w", "lowest power limit it takes is not in the catalog"),   # its draw is the B200's, its minimum unpublished
    ("h100@0w", "positive number of watts"),
    ("a200@300w", "unknown GPU 'a200'"),
])
def test_a_cap_that_cannot_be_derived_is_one_line(tmp_path, capsys, name, says):
    with pytest.raises(ModelcutError, match=says):
        catalog.hardware(name)
    f = tmp_path / "run.toml"
    f.write_text(RUN.format(gpu=name))
    for argv in (["predict", str(f)], ["explore", "--model", "llama3-8b", "--gpu", name, "--gpus", "8",
                                       "--seq", "4096", "--global-batch-tokens", "1M"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("modelcut: error: ")
        assert says in err


def test_the_api_takes_a_capped_gpu_and_refuses_a_bad_cap():
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    c = TestClient(create_app())
    body = {"model": "llama3-8b", "gpus": 8, "seq": 4096, "global_batch_tokens": 1048576}
    ok = c.post("/api/explore", json={**body, "gpu": "h100@500w"})
    assert ok.status_code == 200, ok.text
    bad = c.post("/api/explore", json={**body, "gpu": "h100@900w"})
    assert bad.status_code == 422 and "above its 700 W limit" in bad.text


def test_the_emitted_launch_settings_say_the_cap_the_search_assumed(capsys):
    """--emit on a capped GPU starts with the nvidia-smi command that holds the GPUs to the cap; the
    torchtitan fragment stays valid TOML; an uncapped GPU gets no such line."""
    import tomllib
    argv = ["explore", "--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--global-batch-tokens", "1M"]
    for emit in ("megatron", "torchtitan", "nemo"):
        assert main([*argv, "--gpu", "h100@500w", "--emit", emit]) == 0
        out = capsys.readouterr().out
        assert "nvidia-smi -pl 500" in out
        if emit == "torchtitan":
            tomllib.loads(out[out.index("# the search held"):])
    assert main([*argv, "--gpu", "h100", "--emit", "megatron"]) == 0
    assert "nvidia-smi" not in capsys.readouterr().out
