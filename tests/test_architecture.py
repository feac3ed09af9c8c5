"""The structure the README promises, checked on the code itself (docs/architecture.md).

* Layers import downward only: core ← catalog ← analysis ← service ← faces (export, web, cli), and
  no import cycle anywhere, function-level imports included (the package's imports read with ast).
* The core is pure: no I/O modules, no printing, no file access.
* No schedule name is compared outside the schedule registry.
* The same predict and explore request gives the same JSON from the CLI and from the web API.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from modelcut.cli import main
from modelcut.core.sim import registry
from modelcut.web.app import create_app

SRC = Path(__file__).resolve().parent.parent / "src" / "modelcut"
#: Each package's layer; a module may import only from its own layer or below.
LAYERS = {"core": 0, "catalog": 1, "analysis": 2, "service": 3, "export": 4, "web": 5, "cli": 6}
#: Modules the core must not use: the file system, the network, the process, serialization.
IMPURE = {"os", "sys", "io", "pathlib", "tomllib", "json", "csv", "importlib", "subprocess", "socket", "shutil",
          "tempfile", "urllib", "http", "logging", "pickle"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(name: str, node: ast.ImportFrom) -> list[str]:
    """The modelcut modules an ``from … import …`` names (a submodule where a name is one)."""
    if node.level:
        base = name.split(".") if is_package(name) else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("modelcut"):
        return []
    out = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    if len(out) < len(node.names) and target in MODULES:
        out.append(target)
    return out


def imports(name: str) -> tuple[set[str], set[str]]:
    """(modelcut modules, top-level third-party or standard modules) a module imports anywhere."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    ours, theirs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level or (node.module or "").startswith("modelcut"):
                ours.update(resolve(name, node))
            elif node.module:
                theirs.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                (ours.add(a.name) if a.name.startswith("modelcut") else theirs.add(a.name.split(".")[0]))
    return {m for m in ours if m in MODULES and m != name}, theirs


GRAPH = {m: imports(m)[0] for m in MODULES}


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_layers_import_downward_only():
    bad = [f"{m} -> {t}" for m, ts in GRAPH.items() for t in ts
           if layer(m) is not None and layer(t) is not None and layer(t) > layer(m)]
    assert not bad, "imports that run back up the layers:\n" + "\n".join(sorted(bad))


def test_core_imports_nothing_above_it():
    bad = [f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("modelcut.core") for t in ts
           if not t.startswith("modelcut.core")]
    assert not bad, "\n".join(sorted(bad))


def test_core_is_pure():
    for m, path in MODULES.items():
        if not m.startswith("modelcut.core"):
            continue
        assert not (imports(m)[1] & IMPURE), f"{m} imports {sorted(imports(m)[1] & IMPURE)}"
        calls = {n.func.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name)}
        assert not calls & {"print", "open", "input", "exec", "eval", "__import__"}, m


def test_no_import_cycles():
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in GRAPH[v]:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_dynamic_import_scaffolding():
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)):
                name = n.func.id if isinstance(n.func, ast.Name) else n.func.attr
                assert name not in ("import_module", "__import__"), f"{m} imports dynamically"


def _compared_literals(tree: ast.AST):
    """String constants a comparison (==, !=, in, not in) holds, alone or in a tuple, list or set."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            for side in [n.left, *n.comparators]:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for x in items:
                    if isinstance(x, ast.Constant) and isinstance(x.value, str):
                        yield n.lineno, x.value
        elif isinstance(n, ast.match_case):
            for x in ast.walk(n.pattern):
                if isinstance(x, ast.Constant) and isinstance(x.value, str):
                    yield x.lineno, x.value


def test_no_schedule_name_comparison_outside_the_registry():
    names = set(registry.names())
    allowed = {"modelcut.core.sim.registry"}
    bad = []
    for m, path in MODULES.items():
        if m in allowed:
            continue
        for line, value in _compared_literals(ast.parse(path.read_text())):
            if value in names:
                bad.append(f"{path.relative_to(SRC.parent)}:{line} compares {value!r}")
    assert not bad, "\n".join(bad)


def test_the_name_check_finds_a_comparison():
    """The check above can fail: it sees the comparisons the old code made."""
    found = list(_compared_literals(ast.parse('if name == "dualpipe" or s in ("zb-h1", "zbv"): pass')))
    assert [v for _, v in found] == ["dualpipe", "zb-h1", "zbv"]


# ---------------------------------------------------------------- one JSON for CLI and web

def cli(*argv: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(list(argv)) == 0
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app()) as c:
        yield c


@pytest.mark.parametrize("mode", ["default", "seed"])
def test_predict_gives_the_same_json_from_cli_and_web(client, tmp_path, mode):
    (tmp_path / "run.toml").write_text("""
[model]
name = "llama3-70b"
[hardware]
gpu = "h100"
[layout]
tp = 4
pp = 4
dp = 4
vpp = 5
sequence_parallel = true
[training]
seq_len = 8192
global_batch = 64
micro_batch = 1
recompute = "selective"
""")
    by_cli = cli("predict", str(tmp_path / "run.toml"), "--mode", mode, "--json")
    body = {"model": "llama3-70b", "gpu": "h100", "mode": mode,
            "layout": {"tp": 4, "pp": 4, "dp": 4, "vpp": 5, "sequence_parallel": True},
            "training": {"seq_len": 8192, "global_batch": 64, "micro_batch": 1, "recompute": "selective"}}
    r = client.post("/api/predict", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == by_cli


def test_explore_gives_the_same_json_from_cli_and_web(client):
    by_cli = cli("explore", "--model", "gpt-1.7b", "--gpu", "a100", "--gpus", "8", "--seq", "2048",
                 "--global-batch-tokens", "128K", "--top", "5", "--check", "tp=1,pp=1", "--json")
    body = {"model": "gpt-1.7b", "gpu": "a100", "gpus": 8, "seq": 2048, "global_batch_tokens": "128K", "top": 5,
            "check": {"tp": 1, "pp": 1}}
    r = client.post("/api/explore", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == by_cli


# ---------------------------------------------------------------- the worked example of docs/architecture.md

def _doc_blocks() -> list[str]:
    text = (SRC.parent.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Adding a schedule", 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]


def test_the_worked_schedule_example_runs(monkeypatch):
    """Registering the page's generator and entry is all a new schedule takes: it builds, the
    engine runs it, its plan resolves and both step models time it."""
    from modelcut import catalog
    from modelcut.analysis.validation import seed_eta
    from modelcut.core.sim.checks import check_complete
    from modelcut.core.sim.engine import simulate
    from modelcut.core.specs import Layout, Run, Training
    from modelcut.core.step import seed

    generator, entry = _doc_blocks()
    ns: dict = {}
    exec(compile(generator, "docs/architecture.md", "exec"), ns)
    (spec,) = eval(entry, {**ns, "ScheduleSpec": registry.ScheduleSpec})
    monkeypatch.setitem(registry.SCHEDULES, spec.name, spec)
    sched = registry.build("2f2b", 4, 8)
    check_complete(sched)
    trace = simulate(sched)
    assert trace.makespan > 0 and sched.num_ops == 2 * 4 * 8
    with pytest.raises(Exception, match="even"):
        registry.build("2f2b", 4, 7)
    run = Run(catalog.model("gpt-1.7b"), "a100-sxm4-80gb", Layout(tp=1, pp=4, dp=2, schedule="2f2b"),
              Training(seq_len=2048, global_batch=32, micro_batch=2))
    pred = seed.predict(run, catalog.hardware("a100"), seed_eta())
    assert pred.schedule == "2f2b" and pred.plan.name == "2f2b" and pred.step_time_s > 0
