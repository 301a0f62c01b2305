"""python/tests/test_torch_group.py: an unmodified torch trainer (torch_group_trainer.py: a gloo
group it creates itself with torch.distributed, SGLang's init_custom_process_group) broadcasts
into an embedded ferry.Receiver through /init_weights_update_group (backend "gloo") and
/update_weights_from_distributed, one broadcast per tensor or one flattened bucket: every step
lands bit-identical and publishes its weight version, the group stays in step over several
updates and leaves on destroy; a trainer that dies in the middle of an update fails it at once
(its connections closed), one that stops broadcasting at the update's deadline, each naming the
group and the phase, and nothing is published. Skips where
torch.distributed with gloo or the torch_gloo plugin (the libtorch feature) is missing."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHAPES = {"embed.weight": [64, 16], "layers.0.qkv": [48, 16], "layers.0.b": [7],
          "norm.weight": [16]}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(address, path, body, timeout=120):
    req = urllib.request.Request(f"http://{address}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _trainer(**spec):
    spec.setdefault("shapes", SHAPES)
    spec.setdefault("world_size", 2)
    spec.setdefault("sglang_dir", str(HERE / "sglang_stub"))
    return subprocess.Popen([sys.executable, str(HERE / "torch_group_trainer.py"),
                             json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _report(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def receiver(ferry_module, request):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with gloo")
    dtype_name, _, device = getattr(request, "param", "float32").partition(":")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dtype = getattr(torch, dtype_name)
    params = {name: torch.zeros(shape, dtype=dtype, device=device or "cpu")
              for name, shape in SHAPES.items()}
    with ferry_module.Receiver() as r:
        r.register(params)
        r.serve(port=0)
        yield r, params, dtype


def _skip_without_plugin(answer):
    status, body = answer
    if status == 501 and "torch_gloo" in body.get("message", ""):
        pytest.skip(body["message"])
    if status == 409 and "would abort the process" in body.get("message", ""):
        pytest.skip(body["message"])  # this Python's torch is not the one ferry was built with


def _assert_identical(params, dump):
    torch = pytest.importorskip("torch")
    for name, t in params.items():
        assert t.cpu().contiguous().view(torch.uint8).flatten().tolist() == dump[name], name


@pytest.mark.parametrize("receiver", ["float32", "bfloat16"], indirect=True)
@pytest.mark.parametrize("load_format", [None, "flattened_bucket"])
def test_torch_trainer_broadcasts_land_bit_identical_every_step(receiver, load_format):
    r, params, dtype = receiver
    torch = pytest.importorskip("torch")
    if dtype == torch.bfloat16 and load_format is None and int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("gloo of torch 1.x cannot broadcast bfloat16 tensors (flattened buckets are "
                    "bytes: that case runs)")
    proc = _trainer(engine=r.address, port=_free_port(), group="rl", steps=3,
                    dtype=str(dtype).split(".")[-1], load_format=load_format, destroy=True)
    try:
        report = _report(proc)
    finally:
        proc.kill()
    _skip_without_plugin(report["init"])
    assert report["init"][0] == 200 and report["init"][1]["success"], report["init"]
    assert len(report["steps"]) == 3
    for step, s in enumerate(report["steps"]):
        status, body = s["answer"]
        assert status == 200 and body["success"], body
        assert body["weight_version"] == f"step-{step}"
    _assert_identical(params, report["steps"][-1]["dump"])  # the last step's weights are served
    assert r.version.label == "step-2"
    status, body = report["destroy"]
    assert status == 200 and body["teardown"] == "left", body


@pytest.mark.parametrize("receiver", ["bfloat16:cuda"], indirect=True)
@pytest.mark.parametrize("load_format", [None, "flattened_bucket"])
def test_cuda_trainer_over_gloo_into_cuda_parameters(receiver, load_format):
    """SGLang's engine on a GPU joined to a gloo group: the trainer broadcasts CUDA tensors
    (torch stages them through host memory), the receiver applies host buckets into its CUDA
    parameters."""
    r, params, dtype = receiver
    torch = pytest.importorskip("torch")
    if load_format is None and int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("gloo of torch 1.x cannot broadcast bfloat16 tensors")
    ptrs = {n: t.data_ptr() for n, t in params.items()}
    proc = _trainer(engine=r.address, port=_free_port(), group="cuda", steps=2, dtype="bfloat16",
                    device="cuda", load_format=load_format, destroy=True)
    try:
        report = _report(proc)
    finally:
        proc.kill()
    _skip_without_plugin(report["init"])
    for s in report["steps"]:
        assert s["answer"][0] == 200, s["answer"]
    _assert_identical(params, report["steps"][-1]["dump"])
    assert {n: t.data_ptr() for n, t in params.items()} == ptrs
    assert report["destroy"][1]["teardown"] == "left", report["destroy"]


def test_a_trainer_dying_mid_update_fails_it_within_the_deadline(receiver):
    r, params, _ = receiver
    port = _free_port()
    # The test is the framework's controller here: it posts the join and the update, while the
    # trainer creates the group, then dies after two of the four broadcasts of its update.
    proc = _trainer(engine=None, port=port, group="dies", steps=1, die_after=2)
    status, body = _post(r.address, "/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
        "group_name": "dies", "backend": "gloo", "timeout_s": 60})
    _skip_without_plugin((status, body))
    assert status == 200 and body["success"], body
    names = list(SHAPES)
    started = time.monotonic()
    status, body = _post(r.address, "/update_weights_from_distributed", {
        "names": names, "dtypes": ["float32"] * len(names),
        "shapes": [SHAPES[n] for n in names], "group_name": "dies", "weight_version": "never",
        "timeout_s": 20})
    took = time.monotonic() - started
    proc.wait(timeout=60)
    assert proc.returncode == 3, proc.stderr.read()
    # Its connections closed: named at once (502), not at the 20 s deadline.
    assert status == 502 and not body["success"], body
    assert "group 'dies'" in body["message"] and "receive bucket 0" in body["message"], body
    assert "by peer" in body["message"], body  # gloo: "Connection closed by peer" or "... reset by peer"
    assert took < 10, took
    assert r.version.number == 0 and r.version.label != "never"
    assert all(not t.any() for t in params.values())  # nothing applied
    # The failed group is re-joined by the next init of that name (a new trainer).
    proc = _trainer(engine=r.address, port=_free_port(), group="dies", steps=1)
    try:
        report = _report(proc)
    finally:
        proc.kill()
    assert report["init"][0] == 200, report["init"]
    assert report["steps"][0]["answer"][0] == 200, report["steps"][0]["answer"]
    _assert_identical(params, report["steps"][0]["dump"])


def test_a_trainer_that_stops_broadcasting_fails_the_update_at_its_deadline(receiver):
    r, params, _ = receiver
    port = _free_port()
    # Joined, then silent: the trainer broadcasts nothing (steps 0) and waits to be killed.
    proc = _trainer(engine=None, port=port, group="hangs", steps=0, linger=60)
    try:
        status, body = _post(r.address, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 2, "group_name": "hangs", "backend": "gloo", "timeout_s": 60})
        _skip_without_plugin((status, body))
        assert status == 200, body
        names = list(SHAPES)
        started = time.monotonic()
        status, body = _post(r.address, "/update_weights_from_distributed", {
            "names": names, "dtypes": ["float32"] * len(names),
            "shapes": [SHAPES[n] for n in names], "group_name": "hangs", "timeout_s": 2})
        took = time.monotonic() - started
    finally:
        proc.kill()
    assert status == 504 and not body["success"], body
    assert "group 'hangs'" in body["message"] and "deadline" in body["message"], body
    assert 1.5 < took < 10, took
    assert r.version.number == 0
    assert all(not t.any() for t in params.values())
    status, body = _post(r.address, "/destroy_weights_update_group", {"group_name": "hangs"})
    assert status == 200 and body["teardown"] == "aborted", body


def test_backend_and_load_format_are_checked(receiver):
    r, _, _ = receiver
    status, body = _post(r.address, "/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": _free_port(), "rank_offset": 1,
        "world_size": 2, "backend": "mpi"})
    assert status == 400 and "backend 'mpi'" in body["message"], body
    status, body = _post(r.address, "/update_weights_from_distributed", {
        "names": ["norm.weight"], "dtypes": ["float32"], "shapes": [[16]],
        "load_format": "safetensors"})
    assert status == 400 and "load_format 'safetensors'" in body["message"], body


def _plugin_dir():
    """Where this build keeps the torch_gloo plugin and its backend, or None."""
    library = Path(os.environ.get("FERRY_LIBRARY", "/nonexistent/lib/libferry.so")).resolve()
    # The build folder (libferry.so in host/capi/), or a bundle's lib/ferry/plugins beside it.
    candidates = [library.parents[2] / "plugins" / "torch_gloo",
                  library.parent / "ferry" / "plugins"]
    return next((d for d in candidates if (d / "libferry_transport_torch_gloo.so").exists()),
                None)


_OTHER_TORCH_CHILD = r"""
import ctypes, json, sys, urllib.error, urllib.request
ctypes.CDLL(sys.argv[1])  # stands in for another torch's libtorch_cpu, loaded first
import ferry
import numpy as np
with ferry.Receiver() as r:
    r.register({"w": np.zeros(4, np.float32)})
    r.serve(port=0)
    req = urllib.request.Request(
        "http://%s/init_weights_update_group" % r.address, method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"master_address": "127.0.0.1", "master_port": int(sys.argv[2]),
                         "rank_offset": 1, "world_size": 2, "backend": "gloo",
                         "timeout_s": 2}).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            print(json.dumps([answer.status, json.loads(answer.read() or b"{}")]))
    except urllib.error.HTTPError as e:
        print(json.dumps([e.code, json.loads(e.read() or b"{}")]))
"""


def test_an_engine_running_another_torch_is_refused_before_the_backend_loads(ferry_module,
                                                                              tmp_path):
    """An engine embedding the receiver already runs a torch whose libtorch_cpu is not the one
    ferry's torch_gloo backend was built against: loading the backend (and with it a second
    libtorch) would abort the engine, so a gloo join answers 409 naming both, and the engine
    lives on. (A copy of a small system library named libtorch_cpu.so.0 plays the other torch,
    in a child process.)"""
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")  # noqa
    plugins = _plugin_dir()
    if plugins is None:
        pytest.skip("the torch_gloo plugin was not built (the libtorch feature)")
    import ctypes.util
    import shutil
    system = ctypes.util.find_library("z")
    places = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
              "/lib", "/usr/lib")
    source = next((Path(d) / system for d in places if system and (Path(d) / system).exists()),
                  None)
    if source is None:
        pytest.skip("no zlib shared library to stand in for another libtorch")
    other = tmp_path / "libtorch_cpu.so.0"
    shutil.copy(source, other)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "FERRY_PLUGIN_PATH": str(plugins)}
    child = subprocess.run(
        [sys.executable, "-c", _OTHER_TORCH_CHILD, str(other), str(_free_port())],
        capture_output=True, text=True, timeout=120, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    status, body = json.loads(child.stdout.strip().splitlines()[-1])
    assert status == 409, body
    message = body["message"]
    assert "libtorch_cpu.so.0" in message and "would abort the process" in message, message
    assert "libferry_torch_gloo_backend.so" in message, message


def test_a_plugin_without_its_backend_is_refused_naming_the_file(ferry_module, tmp_path,
                                                                 monkeypatch):
    """A bundle or wheel carries the plugin without the build's libtorch backend: the plugin
    loads, and a gloo join answers 409 naming the backend file it looked for."""
    pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    import shutil
    plugins = _plugin_dir()
    if plugins is None:
        pytest.skip("the torch_gloo plugin was not built (the libtorch feature)")
    plugin = plugins / "libferry_transport_torch_gloo.so"
    shutil.copy(plugin, tmp_path / plugin.name)
    monkeypatch.setenv("FERRY_PLUGIN_PATH", str(tmp_path))
    with ferry_module.Receiver() as r:
        r.register({"w": __import__("torch").zeros(4)})
        r.serve(port=0)
        status, body = _post(r.address, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": _free_port(), "rank_offset": 1,
            "world_size": 2, "backend": "gloo", "timeout_s": 2})
    assert status == 409, body
    assert "libferry_torch_gloo_backend.so" in body["message"], body
