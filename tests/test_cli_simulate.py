"""``modelcut simulate`` and ``modelcut bubble-table``, and the faces they write: the JSON
object, the text timeline, the Chrome trace, the Gantt chart and the action CSV."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction as Fr

import pytest
from rich.console import Console

from modelcut.cli import main
from modelcut.core.sim import closed_forms, registry
from modelcut.core.sim.engine import Timing
from modelcut.core.sim.run import DECK_BUBBLE_TABLE, run_named
from modelcut.core.sim.registry import build
from helpers import SCHEDULES
from modelcut.export import chrome_trace, gantt, pipeline_json, timeline_text


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str) -> str:
    assert rc != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("modelcut: error")
    return lines[0]


# --json ---------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("-s", "interleaved", "-p", "4", "-m", "8", "-v", "2"),
    ("-s", "zbv", "-p", "3", "-m", "6"),
    ("-s", "1f1b", "-p", "4", "-m", "8", "--p2p", "0.25"),
])
def test_json_has_the_documented_keys(capsys, args):
    rc, out, err = cli(capsys, "simulate", *args, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    types = {"schedule": str, "devices": int, "microbatches": int, "chunks": int, "makespan": float,
             "bubble": float, "peak_activations": list, "ops": list}
    for key, t in types.items():
        assert isinstance(doc[key], t), key
    assert doc["closed_form_bubble"] is None or isinstance(doc["closed_form_bubble"], float)
    p = doc["devices"]
    assert len(doc["peak_activations"]) == p and all(isinstance(x, float) for x in doc["peak_activations"])
    sched = build(doc["schedule"], p, doc["microbatches"], doc["chunks"])
    assert len(doc["ops"]) == sched.num_ops
    for op in doc["ops"]:
        assert set(op) >= {"device", "kind", "microbatch", "chunk", "start", "end"}
        assert op["kind"] in "FBW" and 0 <= op["device"] < p and 0 <= op["chunk"] < doc["chunks"]
        assert op["end"] >= op["start"]
    # the figures are the core's
    timing = Timing(1, 2, None, Fr(args[-1]) if "--p2p" in args else 0)
    r = run_named(doc["schedule"], p, doc["microbatches"], doc["chunks"], timing, exact=True)
    assert doc["makespan"] == float(r.metrics.makespan)
    assert doc["bubble"] == float(r.metrics.bubble)
    assert doc["peak_activations"] == [float(x) for x in r.metrics.peak_activations]
    assert max(op["end"] for op in doc["ops"]) == doc["makespan"]
    if "--p2p" in args:
        assert doc["closed_form_bubble"] is None  # sends have no closed form
    else:
        assert doc["closed_form_bubble"] == doc["bubble"]


# text -----------------------------------------------------------------------------

def test_summary_and_timeline(capsys):
    rc, out, _ = cli(capsys, "simulate", "-s", "gpipe", "-p", "4", "-m", "8")
    assert rc == 0
    r = run_named("gpipe", 4, 8, exact=True)
    assert f"makespan             {float(r.metrics.makespan):g}" in out
    assert f"bubble (simulated)   {float(r.metrics.bubble):.4f}" in out
    assert f"bubble (closed form) {float(r.closed_form_bubble):.4f}" in out
    rows = [line for line in out.splitlines() if line.startswith("d")]
    assert [row.split()[0] for row in rows] == ["d0", "d1", "d2", "d3"]
    assert "\x1b[" not in out  # no colour codes when not writing to a terminal


@pytest.mark.parametrize("name,p,m,v", [("interleaved", 4, 8, 2), ("zbv", 4, 8, 2), ("1f1b", 4, 8, 1),
                                        ("gpipe", 4, 8, 1), ("zb-h1", 4, 8, 1)])
def test_timeline_fits_100_columns_and_shows_every_op(name, p, m, v):
    r = run_named(name, p, m, v, exact=True)
    text = timeline_text.render(r.trace, max_width=100)
    assert text is not None
    lines = text.plain.splitlines()
    assert all(len(line) <= 100 for line in lines)
    cell = timeline_text.fits(r.trace, 100)
    unit = timeline_text.time_unit(r.trace)
    rows = [line for line in lines[1:] if line.startswith("d")]  # below the time ruler; marks between
    assert len(rows) == p
    for d, row in enumerate(rows):
        body = row[len(f"d{p - 1}") + 2:]
        assert len(body) == r.metrics.makespan / unit * cell
        # the idle cells are the device's idle time
        assert body.count(timeline_text.IDLE) == (r.metrics.makespan - r.metrics.busy[d]) / unit * cell
        # B and W show their letter; F its letter too when there is room
        order = r.schedule.orders[d]
        for kind in "BW" + ("F" if cell > 1 else ""):
            assert body.count(kind) == sum(op.kind == kind for op in order)


@pytest.mark.parametrize("name,p,m,v,width", [("interleaved", 4, 8, 2, 100), ("interleaved", 2, 4, 2, 100),
                                              ("interleaved", 4, 8, 4, 200), ("zbv", 4, 8, 2, 100)])
def test_chunked_timelines_keep_the_chunk_marks_the_legend_promises(name, p, m, v, width):
    """Every op of a later chunk shows its mark, in its cells or on the line below its row, and
    the legend says which; a legend promises only the marks it can show."""
    r = run_named(name, p, m, v, exact=True)
    lines = timeline_text.render(r.trace, max_width=width).plain.splitlines()[1:]
    legend = timeline_text.legend(r.trace, width)
    cell, unit = timeline_text.fits(r.trace, width), timeline_text.time_unit(r.trace)
    chunk = pipeline_json.chunk_index(r)
    below = not lines[1].startswith("d")
    assert below == ("line below" in legend)
    assert ("' " in legend or "' =" in legend) and ('"' in legend) == (v > 2)
    step = 2 if below else 1
    indent = len(f"d{p - 1}") + 2
    for d in range(p):
        row = lines[step * d][indent:]
        marks = lines[step * d + 1][indent:] if below else ""
        for op, s, e in zip(r.schedule.orders[d], r.trace.starts[d], r.trace.ends[d]):
            a, b = int(s / unit) * cell, int(e / unit) * cell
            k = chunk[op.stage]
            if k:
                want = timeline_text._chunk_mark(k)
                assert want in row[a:b] or marks[a:b].strip() in (want, want[-1]), (d, str(op))
            else:
                assert not marks[a:b].strip()


def test_legend_names_only_what_the_timeline_shows():
    one = timeline_text.legend(run_named("1f1b", 4, 8, exact=True).trace, 100)
    assert "W3" not in one and "chunk" not in one
    assert "W3" in timeline_text.legend(run_named("zb-h1", 4, 8, exact=True).trace, 100)


def test_narrow_cells_keep_micro_batch_digits_in_forward_order():
    r = run_named("interleaved", 4, 8, 2, exact=True)
    text = timeline_text.render(r.trace, max_width=100).plain.splitlines()
    assert timeline_text.fits(r.trace, 100) == 1  # 57 half-unit steps: one character each
    row0 = text[1][4:]
    forwards = [op for op in r.schedule.orders[0] if op.kind == "F"]
    # reading the row left to right, the F cells spell the forwards' micro-batches
    shown, i = [], 0
    while i < len(row0):
        if row0[i] == "B":
            i += 2 if i + 1 < len(row0) and row0[i + 1].isdigit() else 1
            continue
        if row0[i].isdigit():
            shown.append(int(row0[i]))
        i += 1
    assert shown == [op.microbatch % 10 for op in forwards]


def test_wide_cells_label_each_op():
    r = run_named("gpipe", 3, 4, exact=True)
    text = timeline_text.render(r.trace, max_width=200).plain
    assert timeline_text.fits(r.trace, 200) == 3
    for mb in range(4):
        assert f"F{mb}" in text and f"B{mb}" in text


def test_timeline_colours_by_micro_batch():
    r = run_named("1f1b", 2, 3, exact=True)
    text = timeline_text.render(r.trace, max_width=200)
    styles = [str(span.style) for span in text.spans]
    for mb in range(3):
        colour = timeline_text.PALETTE[mb]
        assert any(colour in s and "reverse" in s for s in styles)  # its F
        assert any(colour in s and "bold" in s for s in styles)     # its B
    con = Console(force_terminal=True, color_system="standard", width=200)
    with con.capture() as cap:
        con.print(text)
    assert "\x1b[" in cap.get()


def test_timeline_too_wide_says_so(capsys):
    assert timeline_text.render(run_named("1f1b", 8, 32).trace, max_width=100) is None
    rc, out, _ = cli(capsys, "simulate", "-s", "1f1b", "-p", "16", "-m", "64")
    assert rc == 0 and "timeline too wide" in out


@pytest.mark.parametrize("kind,mb,chunk,cells,want", [
    ("F", 3, 0, 3, "F3 "), ("F", 3, 1, 3, "F3'"), ("F", 12, 0, 2, "12"), ("F", 12, 0, 1, "2"),
    ("B", 3, 0, 2, "B3"), ("B", 3, 0, 1, "B"), ("W", 5, 2, 4, 'W5" '), ("B", 12, 0, 2, "B"),
])
def test_labels(kind, mb, chunk, cells, want):
    assert timeline_text.label(kind, mb, chunk, cells) == want.ljust(cells)


# --trace --------------------------------------------------------------------------

def test_trace_has_one_track_per_device(capsys, tmp_path):
    path = tmp_path / "t.json"
    rc, _, err = cli(capsys, "simulate", "-s", "interleaved", "-p", "4", "-m", "8", "-v", "2",
                     "--trace", str(path))
    assert rc == 0, err
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    threads = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(threads) == 4
    assert {e["tid"] for e in slices} == {e["tid"] for e in threads}
    assert sorted(e["args"]["name"] for e in threads) == [f"device {d}" for d in range(4)]
    r = run_named("interleaved", 4, 8, 2, exact=True)
    assert len(slices) == r.schedule.num_ops
    for e in slices:
        assert {"ts", "dur", "pid", "tid", "name", "cname"} <= set(e)
        assert e["dur"] > 0 and e["ts"] >= 0
        assert {"microbatch", "stage", "kind"} <= set(e["args"])
        assert e["name"] == f"{e['args']['kind']}{e['args']['microbatch']}"
    # one simulated unit is shown as one second: the last end is the makespan in µs
    assert max(e["ts"] + e["dur"] for e in slices) == pytest.approx(float(r.metrics.makespan) * 1e6)
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {f"activations, device {d}" for d in range(4)}


def test_trace_multi_puts_timelines_side_by_side():
    a = [(0, "F", 0, 0, 0.0, 0.001), (1, "F", 0, 1, 0.001, 0.002)]
    b = [(0, "F", 0, 0, 0.0, 0.0015), (1, "B", 0, 1, 0.002, 0.004)]
    doc = chrome_trace.to_trace_multi([("measured", a), ("simulated", b)])
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {1: "measured", 2: "simulated"}
    tids = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert len(tids) == 4 and len({t for _, t in tids}) == 4  # thread ids unique across processes
    assert [e["dur"] for e in events if e["ph"] == "X"] == pytest.approx([1000, 1000, 1500, 2000])


def test_trace_multi_refuses_bad_rows():
    from modelcut.core.errors import ModelcutError
    with pytest.raises(ModelcutError, match="ends"):
        chrome_trace.to_trace_multi([("x", [(0, "F", 0, 0, 2.0, 1.0)])])
    with pytest.raises(ModelcutError, match="needs"):
        chrome_trace.to_trace_multi([("x", [(0, "F", 0)])])


# --plot ---------------------------------------------------------------------------

def test_plot_png_and_svg(capsys, tmp_path):
    png, svg = tmp_path / "g.png", tmp_path / "g.svg"
    rc, _, err = cli(capsys, "simulate", "-s", "zbv", "-p", "4", "-m", "8", "--plot", str(png))
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    gantt.save(run_named("interleaved", 4, 8, 2, exact=True), svg)
    text = svg.read_text()
    assert "<svg" in text and "interleaved: p = 4, m = 8, v = 2" in text


def test_plot_refuses_other_suffixes(capsys, tmp_path):
    path = tmp_path / "g.pdf"
    rc, out, err = cli(capsys, "simulate", "--plot", str(path))
    assert ".png or .svg" in one_line_error(rc, err)
    assert not path.exists() and out == ""


# action CSV -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_csv_export_then_import_keeps_the_makespan(capsys, tmp_path, name):
    path = tmp_path / f"{name}.csv"
    rc, out1, err = cli(capsys, "simulate", "-s", name, "-p", "4", "-m", "8", "--json", "--export-csv", str(path))
    assert rc == 0, err
    rc, out2, err = cli(capsys, "simulate", "--schedule-csv", str(path), "--json")
    assert rc == 0, err
    a, b = json.loads(out1), json.loads(out2)
    assert b["makespan"] == a["makespan"]
    assert b["schedule"] == f"{name}.csv" and b["closed_form_bubble"] is None  # a custom order claims none
    assert (b["devices"], b["microbatches"], b["chunks"]) == (a["devices"], a["microbatches"], a["chunks"])
    if name in ("zb-h1", "zbv"):
        assert "I" in path.read_text()  # torch's I is modelcut's split B


DEADLOCK_CSV = "2F0,0F0,2B0,0B0\n3F0,1F0,3B0,1B0\n"


def test_deadlocked_csv_is_one_line(capsys, tmp_path):
    path = tmp_path / "dead.csv"
    path.write_text(DEADLOCK_CSV)
    rc, out, err = cli(capsys, "simulate", "--schedule-csv", str(path))
    line = one_line_error(rc, err)
    assert "deadlock" in line and "device 0 at 2F0 waits for 1F0" in line


def test_csv_missing_a_micro_batch_is_one_line(capsys, tmp_path):
    path = tmp_path / "gap.csv"
    path.write_text("0F0,0F2,0B0,0B2\n1F0,1F2,1B0,1B2\n")  # micro-batch 1 never named
    rc, _, err = cli(capsys, "simulate", "--schedule-csv", str(path))
    assert "micro-batch 1" in one_line_error(rc, err)


def test_csv_errors_exit_non_zero_without_traceback_in_a_real_process(tmp_path):
    path = tmp_path / "dead.csv"
    path.write_text(DEADLOCK_CSV)
    proc = subprocess.run([sys.executable, "-m", "modelcut", "simulate", "--schedule-csv", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "deadlock" in one_line_error(proc.returncode, proc.stderr)


# bad input ------------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (("-p", "0"), "--devices must be at least 1, got 0"),
    (("-m", "0"), "--microbatches must be at least 1, got 0"),
    (("-s", "nope"), "unknown schedule 'nope'"),
    (("-s", "interleaved", "-p", "4", "-m", "6"), "m mod N = 0 or >= p"),
    (("--forward", "-1"), "--forward must be at least 0, got -1.0"),
    (("--schedule-csv", "/nonexistent/x.csv"), "x.csv"),
    # all ops of no duration: the bubble was printed as 0 beside the closed form's 0.375, and no
    # device held an activation
    (("--forward", "0", "--backward", "0"), "forward, backward and weight times are all 0"),
    (("-s", "zb-h1", "--forward", "0", "--backward", "0", "--weight", "0"), "times are all 0"),
])
def test_bad_input_is_one_line(capsys, args, words):
    rc, _, err = cli(capsys, "simulate", *args)
    assert words in one_line_error(rc, err)


# bubble-table ---------------------------------------------------------------------

def test_bubble_table_reproduces_the_deck(capsys):
    rc, out, _ = cli(capsys, "bubble-table", "--json")
    assert rc == 0
    doc = json.loads(out)
    rows = doc["rows"]
    assert [(r["schedule"], r["devices"], r["microbatches"], r["chunks"]) for r in rows] == DECK_BUBBLE_TABLE
    for r in rows:
        cf = registry.closed_form(r["schedule"], r["devices"], r["microbatches"], r["chunks"])
        assert r["closed_form_bubble"] == float(cf) == float(Fr(r["devices"] - 1, r["chunks"] * r["microbatches"]))
        assert r["simulated_bubble"] == float(run_named(r["schedule"], r["devices"], r["microbatches"],
                                                        r["chunks"], exact=True).metrics.bubble)
    assert doc["largest_difference"] == max(abs(r["simulated_bubble"] - r["closed_form_bubble"]) for r in rows)
    assert doc["largest_difference"] == 0.0
    rc, out, _ = cli(capsys, "bubble-table")
    assert "Largest difference between simulation and formula: 0.0" in out
    for name, p, m, v in DECK_BUBBLE_TABLE:
        assert f"{float(Fr(p - 1, v * m)):.4f}" in out
