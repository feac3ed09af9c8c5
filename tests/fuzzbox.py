"""Run command-line cases, each in a process of its own under a time limit and a memory limit.

``python tests/fuzzbox.py`` reads one JSON case a line on stdin, ``{"argv": [...], "files":
{name: text}}``, and writes one JSON result a line on stdout: ``{"rc", "stdout", "stderr",
"seconds", "killed"}``. The box imports modelcut once; each case is a forked child with
RLIMIT_AS at the memory limit, killed at the time limit, that writes the files it is given into a
fresh folder, runs ``modelcut.cli.main(argv)`` there and exits with its status; an exception that
escapes ``main`` prints its traceback, as the console script would. :func:`run` drives the box
from a test.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

#: A case that runs this long is a hang. The heaviest valid case, ``validate --mode default`` (every
#: catalog run in and out of sample), takes about 5 s alone on a two-core machine, so the limit leaves
#: room for a loaded one (CI runs two test workers).
TIME_LIMIT_S = 30.0
MEMORY_LIMIT = 1 << 30


def _child(case: dict, out_path: str, err_path: str, memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    work = tempfile.mkdtemp(prefix="modelcut-fuzz-")
    os.chdir(work)
    for name, text in (case.get("files") or {}).items():
        Path(name).write_text(text, encoding="utf-8")
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
    rc = 1
    try:
        from modelcut.cli import main
        rc = main(case["argv"])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(rc if isinstance(rc, int) else 1)


def _one(case: dict, time_limit: float, memory: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(case, out_path, err_path, memory)
        killed = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - t0 > time_limit:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                killed, status = True, -9
                break
            time.sleep(0.005)
        seconds = time.monotonic() - t0
        rc = os.waitstatus_to_exitcode(status) if not killed else -9

        def read(p):
            try:
                return Path(p).read_text(encoding="utf-8", errors="replace")[-4000:]
            except OSError:
                return ""
        return {"rc": rc, "stdout": read(out_path), "stderr": read(err_path), "seconds": seconds, "killed": killed}


def box(time_limit: float = TIME_LIMIT_S, memory: int = MEMORY_LIMIT) -> None:
    import modelcut.cli  # noqa: F401  (imported once; every child starts from here)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(_one(json.loads(line), time_limit, memory)), flush=True)


def run(cases: list[dict], time_limit: float = TIME_LIMIT_S, memory: int = MEMORY_LIMIT) -> list[dict]:
    """Each case's result, from one box process (the test's own interpreter and PYTHONPATH)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, __file__, str(time_limit), str(memory)],
                          input="".join(json.dumps(c) + "\n" for c in cases), capture_output=True, text=True,
                          env=env, timeout=60 + len(cases) * (time_limit + 1))
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    assert len(lines) == len(cases), f"the box stopped early: {proc.stderr[-2000:]}"
    return lines


if __name__ == "__main__":
    box(float(sys.argv[1]) if len(sys.argv) > 1 else TIME_LIMIT_S,
        int(sys.argv[2]) if len(sys.argv) > 2 else MEMORY_LIMIT)
