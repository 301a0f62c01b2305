"""tests/examples/gpu_ucx.py: the cross-node example (docs/guides/cross-node-ucx.md) with the
engine's weights on a GPU (`engine.py --device cuda:0`, as the guide offers) and a GPU trainer
pushing over UCX, both on this machine's network address: every step commits via ucx and every
value the engine holds equals the trainer's final weights. Exits 77 (skipped) without a GPU."""

import examples_support as ex

ENGINE = ex.example("ucx", "engine.py")
TRAINER = ex.example("ucx", "trainer.py")
STEPS = 3


def check(workdir):
    torch = ex.gpu_torch(1)
    address = ex.network_address() or "127.0.0.1"
    engine = ex.Engine([ENGINE, "--device", "cuda:0", "--port", "0"], workdir, timeout=120)
    try:
        result = ex.run([TRAINER, "--engines", f"{address}:{engine.port}", "--device", "cuda:0",
                         "--transport", "ucx", "--steps", str(STEPS),
                         "--save", str(workdir / "trainer.pt")], timeout=300)
        print(result.stdout)
        assert result.returncode == 0, ex.explain(result) + engine.output()
        assert result.stdout.count("committed via ucx") == STEPS, ex.explain(result)
        ex.assert_engine_holds(torch, workdir / "trainer.pt", engine.address)
    finally:
        engine.stop()


if __name__ == "__main__":
    ex.gpu_main(check)
