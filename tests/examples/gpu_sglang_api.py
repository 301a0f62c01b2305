"""tests/examples/gpu_sglang_api.py: the trainer written against SGLang's HTTP API
(examples/sglang_api/trainer.py) on one GPU, with the colocated example's engine on the same
GPU, whole RL steps as on the CPU (kv_cache and weights released for training and resumed, the
update in a weight-update session): every step's flattened buckets are CUDA tensors pickled
with torch's reductions (IPC handles), sent right after optimizer.step() with no synchronize,
read by the engine's receiver in place into its parameters; after five steps the engine's values
and greedy tokens match the trainer's and its dumped parameters equal the trainer's final
weights bit for bit. Exits 77 (skipped) without a GPU."""

import examples_support as ex

ENGINE = ex.example("colocated", "engine.py")
TRAINER = ex.example("sglang_api", "trainer.py")
STEPS = 5


def check(workdir):
    torch = ex.gpu_torch(1)
    engine = ex.Engine([ENGINE, "--device", "cuda:0", "--port", "0", "--control-port", "0",
                        "--dump", str(workdir / "engine.pt")], workdir, timeout=120)
    try:
        result = ex.run([TRAINER, "--engine", engine.address, "--engine-control",
                         f"127.0.0.1:{engine.info['control_port']}", "--device", "cuda:0",
                         "--steps", str(STEPS), "--bucket-mib", "0.5",
                         "--save", str(workdir / "t.pt")], timeout=300)
        print(result.stdout)
        assert result.returncode == 0, ex.explain(result) + engine.output()
        assert result.stdout.count("values read back and its greedy tokens match") == STEPS, \
            ex.explain(result)
    finally:
        code = engine.stop()
    assert code == 0, engine.output()
    wrong = ex.same_weights(torch, workdir / "t.pt", workdir / "engine.pt")
    assert wrong == [], f"the engine's parameters differ from the trainer's: {wrong}"


if __name__ == "__main__":
    ex.gpu_main(check)
