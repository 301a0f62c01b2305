"""tests/examples/test_nccl.py: what of the disaggregated NCCL example (examples/nccl/,
docs/guides/disaggregated-nccl.md) runs without GPUs: both scripts parse their arguments and
refuse, with the guide's messages, what cannot work (a CPU device, no GPU, an unreachable
engine) before any group is created, and a CPU `ferry serve` refuses to join a group naming the
reason. The two-GPU run is gpu_nccl.py."""

import pytest

import examples_support as ex
from examples_support import http_post

ENGINE = ex.example("nccl", "engine.py")
TRAINER = ex.example("nccl", "trainer.py")


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


def test_help_lists_the_options():
    result = ex.run([TRAINER, "--help"])
    assert result.returncode == 0, ex.explain(result)
    for option in ("--engines", "--master-address", "--master-port", "--bucket-mb", "--timeout"):
        assert option in result.stdout
    result = ex.run([ENGINE, "--help"])
    assert result.returncode == 0 and "--device" in result.stdout


def test_arguments_are_checked():
    result = ex.run([TRAINER, "--engines", " , "])
    assert result.returncode == 2 and "--engines names no engine" in result.stderr
    result = ex.run([TRAINER, "--engines", "x:1", "--master-port", "70000"])
    assert result.returncode == 2 and "not a port number: 70000" in result.stderr
    result = ex.run([TRAINER, "--engines", "x:1", "--bucket-mb", "0"])
    assert result.returncode == 2 and "must be at least 1" in result.stderr


def test_cpu_devices_are_refused(torch):
    result = ex.run([ENGINE, "--device", "cpu"])
    assert result.returncode == 1
    assert "--device cpu: an NCCL weight-update group needs the engine's weights on a GPU" \
        in result.stderr
    result = ex.run([TRAINER, "--engines", "127.0.0.1:1", "--device", "cpu"])
    assert result.returncode == 1
    assert "--device cpu: NCCL rank 0 needs a GPU (cuda:N)" in result.stderr


def test_without_a_gpu_both_sides_say_so(torch, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = ex.run([TRAINER, "--engines", "127.0.0.1:1"])
    assert result.returncode == 1
    assert "--device cuda:0: no CUDA device is usable here" in result.stderr
    result = ex.run([ENGINE, "--device", "cuda:0", "--port", "0"])
    assert result.returncode == 1, ex.explain(result)
    assert "device 'cuda:0': no CUDA device is usable here" in result.stdout + result.stderr


def test_a_cpu_receiver_refuses_to_join_naming_the_reason(torch, tmp_path):
    # What the trainer prints for an engine started without a GPU: ferry serve's own answer.
    engine = ex.Engine([ex.example("ucx", "engine.py"), "--host", "127.0.0.1", "--port", "0"],
                       tmp_path)
    try:
        status, answer = http_post(engine.address, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": 29599, "rank_offset": 1,
            "world_size": 2, "group_name": "ferry_example", "backend": "nccl"})
        assert status == 409, answer
        assert answer["message"].startswith(
            "weight-update group 'ferry_example' rank 1/2 (create): "), answer
        assert "NCCL broadcast needs one GPU per rank" in answer["message"], answer
    finally:
        engine.stop()
