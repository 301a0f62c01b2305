"""python/tests/conftest.py: fixtures: the library (skip with the reason when it cannot be
found), the ferry executable beside it, and embedded receivers running in second processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def ferry_module():
    import ferry
    try:
        ferry.library_path()
    except ferry.NotFoundError as e:
        pytest.skip(f"libferry.so is not available: {e.message}")
    return ferry


@pytest.fixture(scope="session")
def ferry_executable(ferry_module):
    """The ferry executable beside the library in use: a bundle's bin/ferry (lib/../bin) or a
    build tree's host/cli/ferry (host/capi/../cli); $FERRY_EXE first."""
    if os.environ.get("FERRY_EXE"):
        return os.environ["FERRY_EXE"]
    lib = Path(ferry_module.library_path()).resolve().parent
    for candidate in (lib.parent / "bin" / "ferry", lib.parent / "cli" / "ferry"):
        if candidate.is_file():
            return str(candidate)
    pytest.skip(f"no ferry executable beside {lib} (set FERRY_EXE)")


class ReceiverProcess:
    """receiver_process.py in a child process, driven over its stdin/stdout."""

    def __init__(self, kind, seed):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE),
                                             env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, str(HERE / "receiver_process.py"), kind,
                                      str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        first = self.proc.stdout.readline().strip()
        if not first.startswith("PORT "):
            self.close()
            raise RuntimeError(f"receiver process said: {first!r}")
        self.port = int(first.split()[1])
        self.address = f"127.0.0.1:{self.port}"

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=60)


@pytest.fixture
def receiver_process():
    started = []

    def start(kind, seed):
        p = ReceiverProcess(kind, seed)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()
