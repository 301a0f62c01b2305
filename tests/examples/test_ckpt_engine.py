"""tests/examples/test_ckpt_engine.py: what of the checkpoint-engine example
(examples/ckpt_engine/, docs/guides/checkpoint-engine.md) runs on a CPU machine: the initial
checkpoint the trainer writes is a valid safetensors checkpoint for `ferry serve` (when safetensors is installed; else the
trainer names the package), both scripts refuse a CPU device and a missing checkpoint with the
guide's messages, and a CPU `ferry serve` answers /update_weights_from_ipc with the reason. The
run with a real ParameterServer on a GPU is gpu_ckpt_engine.py."""

import importlib.util
import subprocess

import pytest

import examples_support as ex
from examples_support import http_post

ENGINE = ex.example("ckpt_engine", "engine.py")
TRAINER = ex.example("ckpt_engine", "trainer.py")


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


def test_initial_checkpoint_loads_in_ferry_serve(torch, tmp_path):
    folder = tmp_path / "initial"
    result = ex.run([TRAINER, "--write-initial", str(folder)])
    if importlib.util.find_spec("safetensors") is None:
        assert result.returncode == 1
        assert "safetensors is not importable" in result.stderr
        assert "pip install safetensors" in result.stderr
        return
    assert result.returncode == 0, ex.explain(result)
    assert f"start the engine with --model-path {folder}" in result.stdout
    # ferry validates it as the engine will load it.
    inspect = subprocess.run([ex.environment()["FERRY_EXE"], "inspect", str(folder)],
                             capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    assert "head.weight" in inspect.stdout


def test_engine_refusals():
    result = ex.run([ENGINE, "--device", "cpu", "--model-path", "."])
    assert result.returncode == 1
    assert "--device cpu: checkpoint-engine shares its buffer by CUDA IPC" in result.stderr
    result = ex.run([ENGINE, "--model-path", "/nonexistent/ckpt"])
    assert result.returncode == 1
    assert "--model-path /nonexistent/ckpt: no such file or folder" in result.stderr
    result = ex.run([ENGINE])
    assert result.returncode == 2 and "--model-path" in result.stderr


def test_trainer_refusals(torch):
    result = ex.run([TRAINER])
    assert result.returncode == 2
    assert "--engine is required (or --write-initial FOLDER)" in result.stderr
    result = ex.run([TRAINER, "--engine", "127.0.0.1:1", "--device", "cpu"])
    assert result.returncode == 1
    assert "the ParameterServer shares its buffer by CUDA IPC" in result.stderr
    if not torch.cuda.is_available():
        result = ex.run([TRAINER, "--engine", "127.0.0.1:1"])
        assert result.returncode == 1
        assert "--device cuda:0: no CUDA device is usable here" in result.stderr


def test_a_cpu_receiver_answers_the_update_with_the_reason(tmp_path):
    serve = ex.Engine([ex.example("ucx", "engine.py"), "--host", "127.0.0.1", "--port", "0"],
                      tmp_path)
    try:
        status, answer = http_post(serve.address, "/update_weights_from_ipc", {
            "zmq_handles": {"GPU-00000000-0000-0000-0000-000000000000": "ipc://@x"},
            "weight_version": "step-1"})
        assert status == 409
        assert "update_weights_from_ipc needs a CUDA receiver" in answer["message"]
    finally:
        serve.stop()
