"""python/tests/test_quiet.py: ferry in someone else's process is quiet when all goes well. With
no log level given anywhere (no log_level=, no FERRY_LOG_LEVEL, no config file), a trainer's
ferry.Sender and an engine's ferry.Receiver write nothing to stderr for a push that commits over
the session socket and over UCX (when its plugin is there); log_level="info" shows what each
session did."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys
import numpy as np
import ferry
transport, level = sys.argv[1], sys.argv[2]
kw = {} if level == "default" else {"log_level": level}
target = {"w": np.zeros(1 << 16, np.float32), "b": np.zeros(64, np.float32)}
source = {k: np.full_like(v, 3.0) for k, v in target.items()}
with ferry.Receiver(**kw) as receiver:
    receiver.register_params(target)
    receiver.serve(port=0)
    with ferry.Sender([receiver.address], transport=transport, **kw) as sender:
        for version in (1, 2):
            report = sender.push(source, version=version)
            assert report.all_committed, report
assert (target["w"] == 3.0).all()
print("COMMITTED", flush=True)
"""


def _run(transport, level):
    env = {k: v for k, v in os.environ.items() if k != "FERRY_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHILD, transport, level], capture_output=True,
                          text=True, env=env, timeout=120)
    assert "COMMITTED" in done.stdout, done.stdout + done.stderr
    return done.stderr


@pytest.mark.parametrize("transport", ["inline", "auto"])
def test_a_push_that_commits_writes_nothing_by_default(transport):
    assert _run(transport, "default") == ""


def test_log_level_info_shows_the_sessions():
    assert "[info]" in _run("inline", "info")
