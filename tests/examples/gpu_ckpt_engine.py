"""tests/examples/gpu_ckpt_engine.py: the checkpoint-engine example
(docs/guides/checkpoint-engine.md) on one GPU as its guide runs it: the trainer writes the initial
checkpoint, the engine (`ferry serve --device cuda:0`) loads it, and the trainer's
ParameterServer updates the engine every step; every value the engine holds then equals the
trainer's final weights; an engine started without a checkpoint is refused
by the trainer naming why. Exits 77 (skipped) without a GPU, checkpoint-engine or safetensors."""

import importlib.util

import examples_support as ex

ENGINE = ex.example("ckpt_engine", "engine.py")
TRAINER = ex.example("ckpt_engine", "trainer.py")
STEPS = 3


def check(workdir):
    torch = ex.gpu_torch(1)
    for module, package in (("checkpoint_engine", "checkpoint-engine"),
                            ("safetensors", "safetensors")):
        if importlib.util.find_spec(module) is None:
            ex.skip(f"{package} is not installed")
    initial = workdir / "initial"
    result = ex.run([TRAINER, "--write-initial", str(initial)])
    assert result.returncode == 0, ex.explain(result)
    engine = ex.Engine([ENGINE, "--device", "cuda:0", "--port", "0", "--model-path",
                        str(initial)], workdir, timeout=120)
    try:
        result = ex.run([TRAINER, "--engine", engine.address, "--device", "cuda:0",
                         "--steps", str(STEPS), "--save", str(workdir / "trainer.pt")],
                        timeout=400)
        print(result.stdout)
        assert result.returncode == 0, ex.explain(result) + engine.output()
        for step in range(1, STEPS + 1):
            assert f"the engine committed step-{step}" in result.stdout, ex.explain(result)
        ex.assert_engine_holds(torch, workdir / "trainer.pt", engine.address)
    finally:
        engine.stop()
    # An engine without a checkpoint has no layout: the trainer says so before training.
    bare = ex.Engine([ex.example("ucx", "engine.py"), "--device", "cuda:0", "--host",
                      "127.0.0.1", "--port", "0"], workdir, name="bare", timeout=120)
    try:
        result = ex.run([TRAINER, "--engine", bare.address, "--device", "cuda:0"])
        assert result.returncode == 1, ex.explain(result)
        assert "has no model loaded" in result.stderr, ex.explain(result)
        assert "start the engine with --model-path" in result.stderr, ex.explain(result)
    finally:
        bare.stop()


if __name__ == "__main__":
    ex.gpu_main(check)
