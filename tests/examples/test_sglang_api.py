"""tests/examples/test_sglang_api.py: the trainer written against SGLang's HTTP API
(examples/sglang_api/trainer.py) driving the colocated example's engine, which embeds a ferry
receiver, on this machine's CPU, one RL step at a time as verl and slime drive SGLang: the
engine's kv_cache (its callback) and ferry's weights released for training and resumed, the
update bracketed by /pause_generation, /flush_cache, /begin_weight_update, /end_weight_update and
/continue_generation (the engine's callbacks, in that order, every step), its flattened buckets
travelling as torch shared-memory files through /update_weights_from_tensor in several calls of
one weight-update session; afterwards the engine is ready, unpaused, with no session open and
nothing released, serves the last step's version, and its parameters equal the trainer's bit for
bit. Also those routes called alone: pause, and a release and resume (the engine's refusal keeps
its 409). The GPU run (CUDA IPC handles) is gpu_sglang_api.py."""

import pytest

import examples_support as ex
from examples_support import http_get, http_post

TRAINER = ex.example("sglang_api", "trainer.py")
STEPS = 3
# What the engine logs for each route of one RL step that reaches it (examples/colocated/engine.py).
STEP_EVENTS = ["KV cache released", "generation paused (abort)", "cache flushed",
               "post-load processing of the new weights", "generation continued",
               "KV cache allocated"]


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


def engine_events(log):
    """The STEP_EVENTS the engine logged after it started serving, in order."""
    lines = log.split("engine: receiver on", 1)[1].splitlines()
    return [e for line in lines for e in STEP_EVENTS if line.startswith(f"engine: {e}")]


def test_an_sglang_trainer_drives_whole_rl_steps_through_the_embedded_receiver(torch, tmp_path):
    engine = ex.colocated_engine(tmp_path, "--dump", str(tmp_path / "engine.pt"))
    control = f"127.0.0.1:{engine.info['control_port']}"
    try:
        # 2 layers of hidden 256, vocab 1024, bf16: ~2.1 MB in buckets of 0.25 MiB.
        result = ex.run([TRAINER, "--engine", engine.address, "--engine-control", control,
                         "--device", "cpu", "--steps", str(STEPS), "--bucket-mib", "0.25",
                         "--save", str(tmp_path / "t.pt")])
        assert result.returncode == 0, ex.explain(result) + engine.output()
        for step in range(1, STEPS + 1):
            assert f"step {step}: released kv_cache and weights for training" in result.stdout
            line = next(x for x in result.stdout.splitlines()
                        if x.startswith(f"step {step}: loss"))
            calls = int(line.split(" update_weights_from_tensor calls")[0].split()[-1])
            assert calls >= 4, line
            assert f"in one weight-update session, weight_version rl-step-{step}" in line
            assert (f"the engine serves rl-step-{step}: values read back and its greedy tokens "
                    "match the trainer's") in result.stdout
        # The step left nothing behind: ready (weights resumed), generation not paused, no
        # session open, the KV cache back (/generate answers), the last step published.
        status, health = http_get(engine.address, "/health")
        assert status == 200 and health["ready"], health
        status, info = http_get(engine.address, "/server_info")
        assert status == 200, info
        state = info["ferry"]["engine"]
        assert state["registered"] and not state["paused"], state
        assert not state["weight_update_session"], state
        assert http_get(engine.address, "/get_weight_version")[1] == {
            "weight_version": f"rl-step-{STEPS}", "version": STEPS}
        metrics = ex.http_text(engine.address, "/metrics")
        assert 'ferry_memory_released{tag="weights"} 0' in metrics.splitlines(), metrics
        status, answer = http_post(control, "/generate", {"tokens": [1, 2]})
        assert status == 200 and answer["weight_version"] == f"rl-step-{STEPS}", answer
    finally:
        assert engine.stop() == 0, engine.output()
    assert engine_events(engine.output()) == STEP_EVENTS * STEPS, engine.output()
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


def test_a_release_through_the_receiver_frees_the_kv_cache_and_the_weights(torch, tmp_path):
    engine = ex.colocated_engine(tmp_path)
    control = f"127.0.0.1:{engine.info['control_port']}"
    try:
        status, answer = http_post(engine.address, "/release_memory_occupation",
                                   {"tags": ["kv_cache", "weights"]})
        assert status == 200 and answer["engine_tags"] == ["kv_cache"], answer
        assert answer["not_held"] == [], answer
        assert [(m["tag"], m["released"]) for m in answer["memory"]] == [("weights", True)]
        status, answer = http_post(control, "/generate", {"tokens": [1, 2]})
        assert status == 409 and answer["message"] == "memory released: resume first", answer
        status, health = http_get(engine.address, "/health")
        assert status == 503 and health["state"] == "released", health
        status, answer = http_post(engine.address, "/resume_memory_occupation",
                                   {"tags": ["weights"]})
        assert status == 200 and answer["engine_tags"] == [], answer
        assert [(m["tag"], m["released"]) for m in answer["memory"]] == [("weights", False)]
        assert http_get(engine.address, "/health")[1]["state"] == "empty"  # no update yet
        # The engine's refusal keeps its status and message on the receiver's port.
        status, answer = http_post(engine.address, "/release_memory_occupation",
                                   {"tags": ["kv_cache"]})
        assert status == 409, answer
        assert answer["message"] == ("the engine's release_memory callback failed: memory: the "
                                     "KV cache is already released"), answer
        status, answer = http_post(engine.address, "/resume_memory_occupation",
                                   {"tags": ["kv_cache"]})
        assert status == 200 and answer["engine_tags"] == ["kv_cache"], answer
        assert http_post(control, "/generate", {"tokens": [1, 2]})[0] == 200
    finally:
        assert engine.stop() == 0, engine.output()


def test_the_trainer_names_an_engine_that_is_not_there(torch, tmp_path):
    result = ex.run([TRAINER, "--engine", "127.0.0.1:1", "--engine-control", "127.0.0.1:1",
                     "--device", "cpu", "--steps", "1"], timeout=60)
    assert result.returncode == 1, ex.explain(result)
    assert ("error: http://127.0.0.1:1/release_memory_occupation: [Errno 111] Connection "
            "refused (is the engine running there?)") in result.stderr, ex.explain(result)
