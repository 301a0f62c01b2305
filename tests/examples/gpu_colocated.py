"""tests/examples/gpu_colocated.py: the colocated example (docs/guides/colocated.md) on one GPU
as its guide runs it: engine and trainer processes on cuda:0. A first one-step run forced
inline (the session socket) commits, and the trainer warns that GPU tensors did not go through
CUDA IPC; then every step of a five-step run goes through CUDA IPC straight into the engine's
parameters, the engine gives back its KV cache's GPU memory while the trainer trains, its values
and greedy tokens match the trainer's, and the parameters it dumps as it stops equal the
trainer's final weights bit for bit. Exits 77 (skipped) without a GPU."""

import examples_support as ex

ENGINE = ex.example("colocated", "engine.py")
TRAINER = ex.example("colocated", "trainer.py")
STEPS = 5


def check(workdir):
    torch = ex.gpu_torch(1)
    engine = ex.Engine([ENGINE, "--device", "cuda:0", "--port", "0", "--control-port", "0",
                        "--dump", str(workdir / "engine.pt")], workdir, timeout=120)
    trainer = [TRAINER, "--engine", engine.address, "--engine-control",
               f"127.0.0.1:{engine.info['control_port']}", "--device", "cuda:0"]
    try:
        other = ex.run(trainer + ["--steps", "1", "--transport", "inline"], timeout=300)
        print(other.stdout)
        assert other.returncode == 0, ex.explain(other) + engine.output()
        assert "warning: GPU tensors went through inline, not cuda_ipc" in other.stdout, \
            ex.explain(other)
        result = ex.run(trainer + ["--steps", str(STEPS), "--save", str(workdir / "t.pt")],
                        timeout=300)
        print(result.stdout)
        assert result.returncode == 0, ex.explain(result) + engine.output()
        assert result.stdout.count("committed via cuda_ipc (direct into its parameters)") \
            == STEPS, ex.explain(result)
        assert "warning" not in result.stdout, ex.explain(result)
        # The KV cache (256 MiB by default) went back to the driver while the trainer trained.
        freed = [line for line in result.stdout.splitlines() if "gave back" in line]
        assert freed and int(freed[0].split()[4]) >= 256, ex.explain(result)
    finally:
        code = engine.stop()
    assert code == 0, engine.output()
    wrong = ex.same_weights(torch, workdir / "t.pt", workdir / "engine.pt")
    assert wrong == [], f"the engine's parameters differ from the trainer's: {wrong}"


if __name__ == "__main__":
    ex.gpu_main(check)
