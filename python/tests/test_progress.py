"""python/tests/test_progress.py: ferry.Sender's progress= argument: by default a trainer whose
stderr is a pipe or a file prints no progress, and one on a terminal sees one line redrawn in
place; "lines" prints a line every progress_interval_ms; a callable gets (bytes_done,
bytes_total) instead; a bad value is refused by name. Each push is 512 MiB into an embedded
receiver in a child process (its stderr is what is checked)."""

import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# The child: pushes 512 MiB (16 arrays) into its own embedded receiver with lines every 100 ms;
# argv[1] is the progress= value ("default": not given).
CHILD = r"""
import sys
import numpy as np
import ferry
target = {f"t{i}": np.zeros(8 << 20, np.float32) for i in range(16)}
source = {k: np.ones_like(v) for k, v in target.items()}
kw = {} if sys.argv[1] == "default" else {"progress": sys.argv[1]}
with ferry.Receiver(log_level="warn") as receiver:
    receiver.register_params(target)
    receiver.serve(port=0)
    with ferry.Sender([receiver.address], transport="inline", progress_interval_ms=100,
                      update__bucket_bytes=8 << 20, **kw) as sender:
        report = sender.push(source, version=1)
print("COMMITTED" if report.all_committed else "FAILED", flush=True)
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    env["FERRY_LOG_LEVEL"] = "warn"
    return env


def _run(progress, terminal):
    """(stdout, stderr) of the child; stderr on a pseudo-terminal when `terminal`."""
    if not terminal:
        done = subprocess.run([sys.executable, "-c", CHILD, progress], capture_output=True,
                              text=True, env=_env(), timeout=120)
        return done.stdout, done.stderr
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, progress], stdout=subprocess.PIPE,
                            stderr=slave, env=_env())
    os.close(slave)
    err = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read().decode()
    proc.wait(timeout=60)
    os.close(master)
    return out, err.decode()


@pytest.fixture
def numpy_installed():
    pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")


LINE = re.compile(r"push of version 1: [0-9.]+ / 512\.0 MiB \(\d+%\)")


def test_default_is_silent_off_a_terminal(ferry_module, numpy_installed):
    out, err = _run("default", terminal=False)
    assert "COMMITTED" in out, out + err
    assert "push of version" not in err, err


def test_default_redraws_in_place_on_a_terminal(ferry_module, numpy_installed):
    out, err = _run("default", terminal=True)
    assert "COMMITTED" in out, out + err
    assert re.search(r"\rpush of version 1: .*\x1b\[K", err), repr(err)
    # The closing draw ends the line: "512.0 MiB in N s (R MB/s)".
    assert re.search(r"\rpush of version 1: 512\.0 MiB in [0-9.]+ s \([0-9.]+ MB/s\)\x1b\[K\r?\n",
                     err), repr(err)


def test_lines_print_every_interval(ferry_module, numpy_installed):
    out, err = _run("lines", terminal=False)
    assert "COMMITTED" in out, out + err
    assert "\r" not in err, repr(err)
    # 512 MiB take well over the 100 ms interval.
    assert len([line for line in err.splitlines() if LINE.match(line)]) >= 1, err
    assert "push of version 1: 512.0 MiB in" in err, err


def test_a_callable_gets_bytes_done_and_total(ferry_module, capfd):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    target = {f"t{i}": np.zeros(1 << 20, np.float32) for i in range(8)}  # 32 MiB
    source = {k: np.full_like(v, 3) for k, v in target.items()}
    calls = []
    with ferry.Receiver(log_level="warn") as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        with ferry.Sender([receiver.address], transport="inline",
                          progress=lambda done, total: calls.append((done, total))) as sender:
            assert sender.push(source, version=1).all_committed
    assert calls, "the callable was never called"
    total = 32 << 20
    assert all(t == total for _, t in calls), calls
    assert [d for d, _ in calls] == sorted(d for d, _ in calls), calls
    assert calls[-1] == (total, total), calls
    assert "push of version" not in capfd.readouterr().err


def test_a_bad_progress_value_is_refused_by_name(ferry_module):
    ferry = ferry_module
    with pytest.raises(ferry.InvalidArgumentError, match="progress='sometimes'"):
        ferry.Sender(["127.0.0.1:1"], progress="sometimes")
