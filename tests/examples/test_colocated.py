"""tests/examples/test_colocated.py: the colocated example (examples/colocated/,
docs/guides/colocated.md) on this machine's CPU, as its guide's "try it without a GPU" says: the
engine embeds a ferry.Receiver over its model's parameters, the trainer releases the engine's KV
cache, trains, pushes, resumes and checks; afterwards the engine's saved parameters equal the
trainer's bit for bit; with TinyLM and with --model llama (a transformers LlamaForCausalLM,
skipped where transformers is not importable: meson's examples_colocated_llama runs this file
with build-venv/examples's python, which has it). Also the engine's control answers the guide
lists. The GPU run (CUDA IPC) is gpu_colocated.py."""

import pytest

import examples_support as ex
from examples_support import http_post

ENGINE = ex.example("colocated", "engine.py")
TRAINER = ex.example("colocated", "trainer.py")


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


@pytest.mark.parametrize("model", ["tiny", "llama"])
def test_release_train_push_resume_on_cpu(torch, tmp_path, model):
    if model == "llama":
        pytest.importorskip("transformers", reason=f"transformers is not importable by "
                            f"{ex.PYTHON} (meson test examples_colocated_llama runs this with "
                            "build-venv/examples/bin/python; scripts/examples-venv makes it)")
    engine = ex.colocated_engine(tmp_path, "--model", model, "--dump",
                                 str(tmp_path / "engine.pt"), timeout=120)
    control = f"127.0.0.1:{engine.info['control_port']}"
    try:
        status, before = http_post(control, "/generate", {"tokens": [1, 2], "max_new_tokens": 3})
        assert status == 200 and before["weight_version"] == "", before
        result = ex.run([TRAINER, "--model", model, "--engine", engine.address,
                         "--engine-control", control, "--device", "cpu", "--steps", "3",
                         "--save", str(tmp_path / "t.pt")])
        assert result.returncode == 0, ex.explain(result) + engine.output()
        for step in (1, 2, 3):
            assert f"step {step}: loss" in result.stdout
            assert (f"the engine serves step-{step}: values read back and its greedy tokens "
                    "match the trainer's") in result.stdout
        # A CPU trainer goes through UCX (or inline without it), never CUDA IPC.
        assert "committed via cuda_ipc" not in result.stdout
        status, after = http_post(control, "/generate", {"tokens": [1, 2], "max_new_tokens": 3})
        assert status == 200 and after["weight_version"] == "step-3", after
        assert len(after["next_tokens"]) == 2 and len(after["generated"]) == 3, after
    finally:
        assert engine.stop() == 0, engine.output()
    assert "engine: stopped" in engine.output()
    if model == "llama":
        assert "parameters of LlamaForCausalLM on cpu" in engine.output()
    assert ex.same_weights(torch, tmp_path / "t.pt", tmp_path / "engine.pt") == []


def test_engine_control_answers(torch, tmp_path):
    engine = ex.colocated_engine(tmp_path)
    control = f"127.0.0.1:{engine.info['control_port']}"
    try:
        status, answer = http_post(control, "/generate", {"tokens": [1, 2, 3]})
        assert status == 200 and answer["weight_version"] == "", answer
        assert len(answer["next_tokens"]) == 3 and answer["generated"] == []
        status, answer = http_post(control, "/generate", {"tokens": [1], "max_new_tokens": 2})
        assert status == 200 and len(answer["generated"]) == 2, answer
        status, answer = http_post(control, "/generate", {"tokens": [1], "max_new_tokens": 65})
        assert status == 400 and answer["message"] == "'max_new_tokens' must be an int from 0 to 64"
        status, answer = http_post(control, "/generate", {"tokens": [5000]})
        assert status == 400 and "non-empty list of ints below 1024" in answer["message"]
        assert http_post(control, "/release_memory_occupation")[0] == 200
        status, answer = http_post(control, "/release_memory_occupation")
        assert status == 409 and answer["message"] == "the KV cache is already released"
        status, answer = http_post(control, "/generate", {"tokens": [1]})
        assert status == 409 and answer["message"] == "memory released: resume first"
        assert http_post(control, "/resume_memory_occupation")[0] == 200
        status, answer = http_post(control, "/resume_memory_occupation")
        assert status == 409 and answer["message"] == "the KV cache is not released"
    finally:
        engine.stop()


def test_trainer_names_an_engine_that_is_not_there(torch, tmp_path):
    result = ex.run([TRAINER, "--engine", "127.0.0.1:1", "--engine-control", "127.0.0.1:1",
                     "--device", "cpu", "--steps", "1"], timeout=60)
    assert result.returncode == 1, ex.explain(result)
    assert ("error: http://127.0.0.1:1/get_weight_version: [Errno 111] Connection refused (is "
            "the engine running there?)") in result.stderr, ex.explain(result)


def test_a_gpu_device_without_a_gpu_is_refused_clearly(torch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for script in (ENGINE, TRAINER):
        args = [script, "--device", "cuda:0"]
        if script == TRAINER:
            args += ["--engine", "127.0.0.1:1", "--engine-control", "127.0.0.1:1"]
        result = ex.run(args)
        assert result.returncode == 1, ex.explain(result)
        assert ("--device cuda:0: no CUDA device is usable here (torch.cuda.is_available() is "
                "False)") in result.stderr


def test_a_wrong_control_port_is_named(torch, tmp_path):
    engine = ex.colocated_engine(tmp_path)
    try:
        result = ex.run([TRAINER, "--engine", engine.address, "--engine-control", "127.0.0.1:1",
                         "--device", "cpu", "--steps", "1"], timeout=60)
        assert result.returncode == 1, ex.explain(result)
        assert ("error: http://127.0.0.1:1/release_memory_occupation: [Errno 111] Connection "
                "refused (is the engine running there?)") in result.stderr, ex.explain(result)
    finally:
        engine.stop()


def test_an_engine_tells_ferry_before_it_frees_its_weights(torch):
    # The guide's "What the engine adds": an engine whose allocator frees or remaps its weights
    # calls release() first and resume() once the memory is back at the same addresses; ferry
    # keeps a copy (weights_policy backup) and writes it back.
    import ferry
    model = torch.nn.Linear(4, 4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ferry.Receiver() as receiver:
        receiver.register(model.named_parameters())
        receiver.serve(port=0)
        receiver.release("weights")
        assert receiver.health().state == "released"
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()  # what the engine's allocator gives back: not the weights
        receiver.resume("weights")
        for name, p in model.named_parameters():
            assert torch.equal(p.detach(), before[name]), name
        assert receiver.health().state != "released"
