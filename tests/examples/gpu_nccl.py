"""tests/examples/gpu_nccl.py: the disaggregated example (docs/guides/disaggregated-nccl.md) on
two GPUs of one host as its guide runs it: the engine (`ferry serve`) on cuda:1 joins the
trainer's NCCL group (rank 0 on cuda:0); every step is broadcast and committed, the group is
destroyed "finalized", and every value the engine holds equals the trainer's final weights.
Exits 77 (skipped) with fewer than two GPUs."""

import socket

import examples_support as ex

ENGINE = ex.example("nccl", "engine.py")
TRAINER = ex.example("nccl", "trainer.py")
STEPS = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(workdir):
    torch = ex.gpu_torch(2)
    env = {"NCCL_NVLS_ENABLE": "0"}
    engine = ex.Engine([ENGINE, "--device", "cuda:1", "--host", "127.0.0.1", "--port", "0"],
                       workdir, env=env, timeout=120)
    try:
        result = ex.run([TRAINER, "--engines", engine.address, "--device", "cuda:0",
                         "--master-address", "127.0.0.1", "--master-port", str(free_port()),
                         "--steps", str(STEPS), "--save", str(workdir / "trainer.pt")],
                        timeout=400, env=env)
        print(result.stdout)
        assert result.returncode == 0, ex.explain(result) + engine.output()
        for step in range(1, STEPS + 1):
            assert f"every engine committed step-{step}" in result.stdout, ex.explain(result)
        assert "destroyed: finalized" in result.stdout, ex.explain(result)
        ex.assert_engine_holds(torch, workdir / "trainer.pt", engine.address)
    finally:
        engine.stop()


if __name__ == "__main__":
    ex.gpu_main(check)
