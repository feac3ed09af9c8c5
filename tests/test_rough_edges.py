"""Issue 16's cases, one named test each: what a new user hit, and what each gets now.

The command-line cases run in processes of their own under the fuzz test's limits (10 s, 1 GB,
:mod:`fuzzbox`): each exits 0 or 2, never with a traceback, an exit 2 in one line."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import fuzzbox
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.service.limits import DEFAULT, WEB, LimitError

ROOT = Path(__file__).resolve().parent.parent

RUN_TOML = """[model]
layers = {layers}
hidden = 512
heads = 8
vocab = 32000
[hardware]
gpu = "a100"
[layout]
tp = 1
pp = 2
dp = 1
[training]
seq_len = {seq_len}
global_batch = {global_batch}
micro_batch = 1
"""


def toml(layers=4, seq_len=1024, global_batch=8) -> str:
    return RUN_TOML.format(layers=layers, seq_len=seq_len, global_batch=global_batch)


def refused(argv, files=None, words=()):
    """The case exits 2 in one line, in time and memory, naming ``words``; returns the line."""
    (res,) = fuzzbox.run([{"argv": argv, "files": files or {}}])
    assert not res["killed"] and res["rc"] == 2, res
    err = res["stderr"]
    assert "Traceback" not in err and err.startswith("modelcut: error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err
    return err


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


# --- tracebacks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_simulate_forward_not_finite(value):
    refused(["simulate", "--forward", value], words=["--forward must be a finite number"])


def test_schedule_csv_micro_batch_index_of_10_to_the_20():
    refused(["simulate", "--schedule-csv", "s.csv"], {"s.csv": "0F100000000000000000000,0B100000000000000000000\n"},
            ["micro-batches up to 100,000,000,000,000,000,000", "the limit is"])


def test_explore_a_trillion_gpus():
    refused(["explore", "--model", "gpt-1.7b", "--gpu", "a100", "--gpus", "1000000000000", "--seq", "2048",
             "--global-batch-tokens", "1M"], words=["--gpus = 1,000,000,000,000 is beyond the limit of 1,048,576 GPUs",
                                                    "--max-gpus"])


def test_mesh_a_trillion_ranks():
    refused(["mesh", "--tp", "8", "--dp", "1000000000000"], words=["--dp = 1,000,000,000,000", "--max-gpus"])
    refused(["mesh", "--tp", "1024", "--dp", "1024", "--pp", "2"], words=["tp·cp·pp·dp = 2,097,152"])


# --- unbounded work -------------------------------------------------------------------------------

def test_simulate_a_trillion_micro_batches():
    refused(["simulate", "-m", "1000000000000"], words=["needs 8,000,000,000,000 ops", "4,194,304 ops per simulation",
                                                        "--max-ops raises it"])


def test_simulate_a_hundred_thousand_devices_and_micro_batches():
    refused(["simulate", "-p", "100000", "-m", "100000"], words=["needs 20,000,000,000 ops"])


def test_the_command_line_caps_simulations_and_a_flag_raises_the_cap():
    rc, _, err = cli("simulate", "-p", "4", "-m", "10", "--max-ops", "79")
    assert rc == 2 and "needs 80 ops; the limit is 79 ops per simulation (--max-ops raises it)" in err
    assert cli("simulate", "-p", "4", "-m", "10", "--max-ops", "80")[0] == 0
    refused(["simulate", "--max-ops", "-3"], words=["--max-ops must be a positive number"])


def test_predict_a_trillion_sequences_a_step():
    refused(["predict", "run.toml"], {"run.toml": toml(global_batch=10**12)},
            ["run.toml: global_batch · seq_len (tokens per step) = 1,024,000,000,000,000 is beyond the limit"])
    refused(["predict", "run.toml"], {"run.toml": toml(global_batch=10**7, seq_len=1)},
            ["micro-batches through", "simulated ops", "--max-ops raises it"])


def test_predict_a_model_of_10_to_the_21_layers():
    refused(["predict", "run.toml"], {"run.toml": toml(layers=10**21)},
            ["layers = 1,000,000,000,000,000,000,000 is beyond the limit of 100,000 layers"])


def test_the_python_entry_points_refuse_the_same_work():
    from modelcut import catalog
    from modelcut.core.specs import Layout, Run, Training
    from modelcut.service import predict, simulate
    from modelcut.service.explore import ExploreRequest, run_explore

    with pytest.raises(LimitError, match="ops per simulation"):
        simulate.named_schedule("1f1b", 4, 10**12)
    with pytest.raises(LimitError, match="GPUs"):
        run_explore(ExploreRequest(catalog.model("gpt-1.7b"), catalog.hardware("a100"), 10**12, 2048, 2**20))
    big = Run(catalog.model("gpt-1.7b"), "a100-sxm4-80gb", Layout(pp=2), Training(seq_len=2048, global_batch=10**9))
    with pytest.raises(LimitError):
        predict.predict(predict.PredictRequest(big))
    from modelcut.service.requests import SimulateInput, parse
    with pytest.raises(ModelcutError, match="forward must be a finite number"):
        simulate.simulate_input(parse(SimulateInput, {"forward": math.nan}))
    with pytest.raises(ValueError, match="finite"):   # the model itself, as pydantic reports it
        SimulateInput.model_validate({"forward": math.nan})


# --- wrong answers said with confidence -----------------------------------------------------------

def test_explore_zero_gpus_per_node():
    refused(["explore", "--model", "gpt-1.7b", "--gpu", "a100", "--gpus", "8", "--seq", "2048",
             "--global-batch-tokens", "128K", "--gpus-per-node", "0"], words=["--gpus-per-node must be at least 1"])


def test_a_sequence_of_10_to_the_13_tokens():
    refused(["predict", "run.toml"], {"run.toml": toml(seq_len=10**13)},
            ["seq_len = 10,000,000,000,000 is beyond the limit of 16,777,216 tokens per sequence"])
    refused(["explore", "--model", "gpt-1.7b", "--gpu", "a100", "--gpus", "8", "--seq", str(10**13),
             "--global-batch-tokens", "128K"], words=["--seq = 10,000,000,000,000 is beyond the limit"])


def test_a_check_no_layout_can_be_names_why():
    err = refused(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                   "--global-batch-tokens", "4M", "--check", "tp=3,cp=1,pp=1,dp=1"])
    assert "tp·cp·pp·dp = 3 ≠ 64 GPUs" in err and "tp 3 does not divide the model's 32 heads" in err
    assert "fits in memory" not in err


def test_a_check_of_one_size_names_each_reason_once():
    err = refused(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "8192",
                   "--global-batch-tokens", "1M", "--check", "tp=3"])
    assert err.count("does not divide the 8 GPUs") == 1 and "tp 3 does not divide the model's 32 heads" in err
    err = refused(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "8192",
                   "--global-batch-tokens", "1M", "--check", "tp=2,pp=3"])
    assert "tp·pp = 6 does not divide the 8 GPUs" in err and "pp 3 does not divide the 8 GPUs" in err


def test_a_check_outside_the_searched_space_says_so():
    rc, out, _ = cli("explore", "--model", "gpt-1.7b", "--gpu", "a100", "--gpus", "8", "--seq", "2048",
                     "--global-batch-tokens", "128K", "--check", "tp=1,pp=8,schedule=gpipe")
    assert rc == 0 and "no layout of the searched space is like it" in out


def test_weight_without_a_split_backward_says_what_it_does():
    rc, out, _ = cli("simulate", "-s", "1f1b", "--weight", "5")
    assert rc == 0 and "note: 1f1b does not split the backward: the weight time W = 5 is added to B (B = 2 + 5 = 7)" in out
    rc, out, _ = cli("simulate", "-s", "1f1b", "--weight", "5", "--json")
    assert json.loads(out)["notes"] == ["1f1b does not split the backward: the weight time W = 5 is added to B "
                                        "(B = 2 + 5 = 7)"]
    rc, out, _ = cli("simulate", "-s", "zb-h1", "--weight", "1", "--json")
    assert json.loads(out)["notes"] == []


def test_crosscheck_a_negative_forward():
    refused(["crosscheck", "--forward-ms", "-5", "--order-only"], words=["--forward-ms must be more than 0"])
    refused(["crosscheck", "--forward-ms", "nan", "--order-only"], words=["--forward-ms must be a finite number"])


def test_report_into_a_folder_that_is_not_there(tmp_path):
    target = tmp_path / "nonexistent" / "x.md"
    rc, _, err = cli("report", "-o", str(target))
    assert rc == 2 and "no such directory" in err and not target.parent.exists()
    refused(["report", "-o", "/nonexistent/x.md"], words=["/nonexistent: no such directory"])
    assert not Path("/nonexistent").exists()


# --- the web ---------------------------------------------------------------------------------------

def test_the_runs_api_answers_the_default_model():
    from modelcut.service.validation import default_table

    with TestClient(__import__("modelcut.web.app", fromlist=["create_app"]).create_app()) as c:
        r = c.get("/api/runs?mode=default")
        assert r.status_code == 200, r.text
        ans = r.json()
    deck = [row for row in default_table().rows if row.set == "deck"]
    assert ans["mode"] == "default" and [x["id"] for x in ans["runs"]] == [row.id for row in deck]
    assert ans["summary"]["mean_abs_error_pct"] > 0


# --- the main job and long commands ---------------------------------------------------------------

def test_make_demo_leads_with_the_default_model():
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M).group(1).split("\n")
    commands = [line.strip().split("modelcut ", 1)[1] for line in recipe if "modelcut " in line]
    assert commands == ["validate --mode default", "validate", "bubble-table", "report"]


def test_long_commands_show_progress_on_a_terminal(monkeypatch):
    from modelcut.cli import common

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    with common.progress("fitting") as update:
        for i in range(3):
            update(i * 10, None, f"fitting gemm: {i * 10} predictions")
    assert "fitting gemm" in tty.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())   # a file or a pipe: nothing
    with common.progress("fitting") as update:
        update(1)


def test_calibrate_reports_its_progress(tmp_path):
    from modelcut.service.calibrate import calibrate

    csv = tmp_path / "runs.csv"
    csv.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,tflops_per_gpu\n"
                   "a,gpt-1.7b,a100,1,1,8,2048,64,1,130\nb,gpt-3.6b,a100,2,1,4,2048,64,1,135\n"
                   "c,gpt-7.5b,a100,4,1,2,2048,64,1,140\n")
    heard = []
    calibrate(csv, None, "gemm", None, False, progress=lambda done, total, text: heard.append((done, text)))
    assert heard and heard[-1][0] > heard[0][0] and all("fitting gemm on 3 runs" in t for _, t in heard)


def test_simulate_help_names_every_schedule():
    rc, out, _ = cli("simulate", "--help")
    from modelcut.core.sim import registry
    text = " ".join(out.split())
    for name in registry.names():
        assert name in text, name
    assert "torch:<Class>" in text and "dualpipe" in text.split("split the backward", 1)[1][:120]


def test_simulate_json_streams_within_400_mb():
    """The issue's size: p 128, m 2048, v 4 (2,097,152 ops), its JSON written to /dev/null."""
    # VmHWM, the peak since exec (ru_maxrss would keep the forking test process's own, larger RSS)
    code = ("import sys\n"
            "from modelcut.cli import main\n"
            "rc = main(['simulate', '-s', 'interleaved', '-p', '128', '-m', '2048', '-v', '4', '--json'])\n"
            "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
            "print(rc, hwm, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=120, env={**__import__("os").environ, "OPENBLAS_NUM_THREADS": "1"})
    rc, peak_kb = map(int, proc.stderr.split()[-2:])
    assert rc == 0 and peak_kb < 400 * 1024, f"peak {peak_kb / 1024:.0f} MB"


@pytest.mark.parametrize("name,p,m,v,p2p", [("interleaved", 4, 8, 2, 0.0), ("zbv", 3, 6, None, 0.25),
                                            ("dualpipe", 4, 8, None, 0.0), ("1f1b", 32, 64, None, 0.5)])
def test_streamed_json_is_the_documented_object(name, p, m, v, p2p):
    from modelcut.export import pipeline_json
    from modelcut.service.requests import SimulateInput
    from modelcut.service.simulate import simulate_input

    sim = simulate_input(SimulateInput(schedule=name, devices=p, microbatches=m, chunks=v, p2p=p2p, weight=0.5))
    buf = io.StringIO()
    pipeline_json.write(sim.result, buf, sim.notes)
    assert buf.getvalue() == json.dumps(pipeline_json.to_dict(sim.result, notes=sim.notes))


def test_the_limits_are_one_module_for_every_face():
    from modelcut.web import app as webapp
    from modelcut.web import schemas

    assert webapp.MAX_OPS == WEB.max_ops and webapp.MAX_LAYOUTS == WEB.max_layouts
    spec = schemas.ExploreInput.model_json_schema()
    assert spec["properties"]["gpus"]["maximum"] == DEFAULT.max_gpus == WEB.max_gpus
    assert spec["properties"]["seq"]["maximum"] == DEFAULT.max_seq


@pytest.mark.parametrize("command,caps", [
    ("simulate", ["max_ops", "max_time"]), ("mesh", ["max_gpus"]),
    ("explore", ["max_ops", "max_layouts", "max_search_ops", "max_gpus", "max_seq", "max_tokens", "max_layers",
                 "max_width"]),
    ("predict", ["max_ops", "max_gpus", "max_seq", "max_tokens", "max_layers", "max_width"])])
def test_every_flag_a_refusal_names_is_the_command_s(command, caps):
    from modelcut.service.limits import CAPS
    _, out, _ = cli(command, "--help")
    for cap in caps:
        assert CAPS[cap][1] in out, (command, CAPS[cap][1])


def test_calibrate_names_no_flag_it_lacks(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,tflops_per_gpu\n"
                   "a,gpt-1.7b,a100,1,1,99999999999999,2048,512,1,100\n")
    rc, _, err = cli("calibrate", "--runs", str(csv))
    assert rc == 2 and "is beyond the limit" in err and "raises it" not in err
