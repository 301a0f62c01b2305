"""tests/examples/test_sglang_api.py: the trainer written against SGLang's HTTP API
(examples/sglang_api/trainer.py) driving the colocated example's engine, which embeds a ferry
receiver, on this machine's CPU: the flattened buckets travel as torch shared-memory files
through /update_weights_from_tensor in several calls per step, bracketed by /pause_generation
and /continue_generation (the engine's callbacks), and afterwards the engine's parameters equal
the trainer's bit for bit. The GPU run (CUDA IPC handles) is gpu_sglang_api.py."""

import pytest

import examples_support as ex
from examples_support import http_post

TRAINER = ex.example("sglang_api", "trainer.py")


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


def test_an_sglang_trainer_updates_the_embedded_receiver_in_several_calls(torch, tmp_path):
    engine = ex.colocated_engine(tmp_path, "--dump", str(tmp_path / "engine.pt"))
    control = f"127.0.0.1:{engine.info['control_port']}"
    try:
        # 2 layers of hidden 256, vocab 1024, bf16: ~2.1 MB in buckets of 0.25 MiB.
        result = ex.run([TRAINER, "--engine", engine.address, "--engine-control", control,
                         "--device", "cpu", "--steps", "3", "--bucket-mib", "0.25",
                         "--save", str(tmp_path / "t.pt")])
        assert result.returncode == 0, ex.explain(result) + engine.output()
        for step in (1, 2, 3):
            line = next(x for x in result.stdout.splitlines() if x.startswith(f"step {step}:"))
            calls = int(line.split(" update_weights_from_tensor calls")[0].split()[-1])
            assert calls >= 4, line
            assert f"weight_version rl-step-{step}" in line
            assert (f"the engine serves rl-step-{step}: values read back and its greedy tokens "
                    "match the trainer's") in result.stdout
    finally:
        assert engine.stop() == 0, engine.output()
    assert ex.same_weights(torch, tmp_path / "t.pt", tmp_path / "engine.pt") == []


def test_pause_generation_reaches_the_engine(torch, tmp_path):
    engine = ex.colocated_engine(tmp_path)
    control = f"127.0.0.1:{engine.info['control_port']}"
    try:
        assert http_post(control, "/generate", {"tokens": [1, 2]})[0] == 200
        status, answer = http_post(engine.address, "/pause_generation", {"mode": "abort"})
        assert status == 200 and answer["success"] and answer["num_paused_requests"] == 0, answer
        status, answer = http_post(control, "/generate", {"tokens": [1, 2]})
        assert status == 409, answer
        assert answer["message"] == "generation is paused (abort): /continue_generation first"
        status, answer = http_post(engine.address, "/continue_generation", {})
        assert status == 200 and answer["success"], answer
        assert http_post(control, "/generate", {"tokens": [1, 2]})[0] == 200
    finally:
        assert engine.stop() == 0, engine.output()


def test_the_trainer_names_an_engine_that_is_not_there(torch, tmp_path):
    result = ex.run([TRAINER, "--engine", "127.0.0.1:1", "--engine-control", "127.0.0.1:1",
                     "--device", "cpu", "--steps", "1"], timeout=60)
    assert result.returncode == 1, ex.explain(result)
    assert ("error: http://127.0.0.1:1/pause_generation: [Errno 111] Connection refused (is "
            "the engine running there?)") in result.stderr, ex.explain(result)
