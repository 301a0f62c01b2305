"""tests/examples/examples_support.py: running the examples/ scripts as a user does, as real
processes: an engine started in the background (its log kept for failure messages, its port read
from its --ready-file), a trainer run to completion with a deadline, and comparing the weights
both sides saved. Shared by the tests of every deployment form."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable


def example(form, script):
    return str(EXAMPLES / form / script)


def environment(extra=None):
    """The environment meson gives (PYTHONPATH to python/, FERRY_EXE), the default log levels
    (what a user sees), unbuffered output."""
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT / "python"))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run(args, timeout=180, env=None):
    """Runs a script to completion; returns CompletedProcess (stdout and stderr as text)."""
    return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=timeout,
                          env=environment(env), cwd=ROOT)


class Engine:
    """An engine script (or, with program, another program) in the background, started with
    --ready-file."""

    def __init__(self, args, workdir, name="engine", env=None, timeout=60, program=PYTHON):
        self.ready = Path(workdir) / f"{name}.ready"
        self.log_path = Path(workdir) / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([program, *args, "--ready-file", str(self.ready)],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=environment(env), cwd=ROOT)
        deadline = time.monotonic() + timeout
        while not (self.ready.exists() and self.ready.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start (exit {self.proc.returncode}):\n"
                                   f"{self.output()}")
            time.sleep(0.05)
        time.sleep(0.05)  # the file is written in one go; let the writer close it
        text = self.ready.read_text().strip()
        self.info = json.loads(text) if text.startswith("{") else {"port": int(text)}
        self.port = self.info["port"]
        self.address = f"127.0.0.1:{self.port}"

    def output(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        """SIGTERM, as Ctrl-C would; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()
        return self.proc.returncode


def colocated_engine(workdir, *extra, timeout=60):
    """examples/colocated/engine.py on the CPU with free ports and an 8 MiB KV cache."""
    return Engine([example("colocated", "engine.py"), "--device", "cpu", "--port", "0",
                   "--control-port", "0", "--kv-cache-mib", "8", *extra], workdir,
                  timeout=timeout)


def ferry_exe():
    """The `ferry` executable the suite runs: FERRY_EXE (meson sets it), else this checkout's
    build/host/cli/ferry."""
    return os.environ.get("FERRY_EXE") or str(ROOT / "build" / "host" / "cli" / "ferry")


def ferry_serve(workdir, *extra, name="engine", env=None):
    """`ferry serve` on a free port of 127.0.0.1, as a guide starts it (the identity model: the
    parameter names are the trainer's)."""
    return Engine(["serve", "--host", "127.0.0.1", "--port", "0", "--model-family", "identity",
                   *extra], workdir, name=name, env=env, program=ferry_exe())


def same_weights(torch, a_path, b_path):
    """Names whose tensors differ between two torch.save'd state dicts (empty: identical)."""
    a, b = torch.load(a_path), torch.load(b_path)
    if sorted(a) != sorted(b):
        return [f"names differ: {sorted(set(a) ^ set(b))}"]
    return [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]


def explain(result):
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


# The most values one /get_weights_by_name answers (docs/http-api.md).
MAX_VALUES = 65536


def differing_values(state, address):
    """Names of the tensors of `state` whose values, read back from the receiver at `address`
    (/get_weights_by_name: every value of a tensor of up to MAX_VALUES, the first MAX_VALUES of a
    larger one), are not the same bit for bit (empty: the receiver holds `state`). A value of
    bfloat16, float16 or float32 is exact as a float, and is compared by its hex form, so that
    -0.0 differs from 0.0."""
    wrong = []
    for name, tensor in state.items():
        count = min(tensor.numel(), MAX_VALUES)
        status, answer = http_post(address, "/get_weights_by_name",
                                   {"name": name, "truncate_size": count})
        mine = [float.hex(v) for v in tensor.float().flatten()[:count].tolist()]
        if (status != 200 or answer["shape"] != list(tensor.shape)
                or [float.hex(float(v)) for v in answer["values"]] != mine):
            wrong.append(name)
    return wrong


def http_post(address, route, body=None, timeout=60):
    """(status, JSON answer) of POST http://ADDRESS/ROUTE."""
    return http_json(address, route, json.dumps(body or {}).encode(), timeout)


def http_get(address, route, timeout=60):
    """(status, JSON answer) of GET http://ADDRESS/ROUTE."""
    return http_json(address, route, None, timeout)


def http_json(address, route, data, timeout=60):
    """(status, JSON answer) of a request with body `data` (None: GET)."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(f"http://{address}{route}", data=data)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def http_text(address, route, timeout=60):
    """The text of GET http://ADDRESS/ROUTE (/metrics)."""
    import urllib.request
    with urllib.request.urlopen(f"http://{address}{route}", timeout=timeout) as r:
        return r.read().decode()


def skip(reason):
    """meson's skip: exit code 77, with the reason."""
    print(f"SKIP: {reason}", flush=True)
    sys.exit(77)


def gpu_torch(gpus=1):
    """torch when this machine has `gpus` CUDA devices, else a skip saying what is missing."""
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < gpus:
        skip(f"needs {gpus} CUDA device(s), this machine has {count}")
    return torch


def gpu_main(check):
    """Runs check(workdir) for a GPU script: PASS and exit 0, or FAIL with the reason, exit 1."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="ferry-examples-") as workdir:
        try:
            check(Path(workdir))
        except (AssertionError, RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"FAIL: {e}", flush=True)
            sys.exit(1)
    print("PASS", flush=True)
    sys.exit(0)


def network_address():
    """This machine's first global IPv4 address (`ip -4 addr`), or None."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        words = line.split()
        if "inet" in words:
            return words[words.index("inet") + 1].split("/")[0]
    return None


def assert_engine_holds(torch, saved, address):
    """Every value the engine at `address` holds equals the trainer's weights saved in `saved`."""
    wrong = differing_values(torch.load(saved), address)
    assert wrong == [], f"the engine's weights differ from the trainer's: {wrong}"
