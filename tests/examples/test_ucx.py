"""tests/examples/test_ucx.py: the cross-node example (examples/ucx/, docs/guides/cross-node-ucx.md)
run on loopback as its guide says: engine.py (`ferry serve`) and trainer.py as separate
processes; every step commits over UCX (or inline), and the engine's weights equal the
trainer's final weights bit for bit. Also the failure modes the guide lists, with their
messages: no engine, a mismatched model, a missing token."""

import os

import pytest

import examples_support as ex

ENGINE = ex.example("ucx", "engine.py")
TRAINER = ex.example("ucx", "trainer.py")
HAVE_UCX = os.environ.get("FERRY_TEST_HAVE_UCX", "1") == "1"


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


@pytest.mark.parametrize("transport", ["ucx", "inline"])
def test_trainer_updates_the_engine_every_step(torch, tmp_path, transport):
    if transport == "ucx" and not HAVE_UCX:
        pytest.skip("this build has no UCX plugin (libucx-dev)")
    engine = ex.Engine([ENGINE, "--host", "127.0.0.1", "--port", "0"], tmp_path)
    try:
        final = tmp_path / "trainer.pt"
        result = ex.run([TRAINER, "--engines", engine.address, "--transport", transport,
                         "--steps", "3", "--save", str(final)])
        assert result.returncode == 0, ex.explain(result) + engine.output()
        for step in (1, 2, 3):
            assert f"step {step}: loss" in result.stdout
            assert f"{engine.address}: committed via {transport}" in result.stdout
            assert f"every engine serves step-{step}; values read back match" in result.stdout
        # Independently of the trainer's own check: every value the engine holds.
        assert ex.differing_values(torch.load(final), engine.address) == []
        assert "update 3 ('step-3') from a session" in engine.output()
    finally:
        assert engine.stop() in (0, -15), engine.output()


def test_engine_on_every_interface_reached_by_its_network_address(torch, tmp_path):
    """The guide's engine command as given (--host 0.0.0.0): a trainer naming the machine's own
    network address goes over TCP sessions and UCX, as from another node."""
    address = ex.network_address()
    if address is None:
        pytest.skip("this machine has no global IPv4 address")
    engine = ex.Engine([ENGINE, "--port", "0"], tmp_path)
    try:
        result = ex.run([TRAINER, "--engines", f"{address}:{engine.port}", "--steps", "2"])
        assert result.returncode == 0, ex.explain(result) + engine.output()
        assert result.stdout.count(f"{address}:{engine.port}: committed via ") == 2
        assert f"session with sender {address}:" in engine.output(), engine.output()
    finally:
        engine.stop()


def test_two_engines_and_one_refusing_a_mismatched_model(torch, tmp_path):
    a = ex.Engine([ENGINE, "--host", "127.0.0.1", "--port", "0"], tmp_path, name="a")
    b = ex.Engine([ENGINE, "--host", "127.0.0.1", "--port", "0"], tmp_path, name="b")
    try:
        both = f"{a.address},{b.address}"
        result = ex.run([TRAINER, "--engines", both, "--transport", "auto", "--steps", "1"])
        assert result.returncode == 0, ex.explain(result)
        assert result.stdout.count("committed via") == 2, result.stdout
        # Another model shape: the engines keep step-1 and the trainer says why.
        result = ex.run([TRAINER, "--engines", both, "--steps", "1", "--hidden", "128"])
        assert result.returncode == 1, ex.explain(result)
        assert ("layout check refused: checkpoint tensor 'embed.weight' is BF16 [1024, 128] "
                "but the layout expects BF16 [1024, 256]") in result.stdout
        assert "error: step 1: 2 of 2 engine(s) did not commit" in result.stderr
    finally:
        a.stop()
        b.stop()


def test_no_engine_is_a_clear_error_not_a_hang(torch, tmp_path):
    result = ex.run([TRAINER, "--engines", "127.0.0.1:1", "--steps", "1",
                     "--connect-timeout", "5"], timeout=60)
    assert result.returncode == 1, ex.explain(result)
    assert ("error: http://127.0.0.1:1/get_weight_version: [Errno 111] Connection refused (is "
            "the engine running there?)") in result.stderr, ex.explain(result)


def test_an_engine_with_a_token_refuses_a_trainer_without_it(torch, tmp_path):
    engine = ex.Engine([ENGINE, "--host", "127.0.0.1", "--port", "0", "--token", "s3cret"],
                       tmp_path)
    try:
        result = ex.run([TRAINER, "--engines", engine.address, "--steps", "1"])
        assert result.returncode == 1, ex.explain(result)
        assert "the session needs the receiver's control API token" in result.stdout
        result = ex.run([TRAINER, "--engines", engine.address, "--steps", "1",
                         "--token", "s3cret"])
        assert result.returncode == 0, ex.explain(result)
    finally:
        engine.stop()


def test_bad_arguments_are_named(tmp_path):
    result = ex.run([TRAINER, "--engines", ",", "--steps", "1"])
    assert result.returncode == 2 and "--engines names no engine" in result.stderr
    result = ex.run([TRAINER, "--engines", "x:1", "--steps", "0"])
    assert result.returncode == 2 and "must be at least 1" in result.stderr
    result = ex.run([ENGINE, "--port", "70000"])
    assert result.returncode == 2 and "not a port number: 70000" in result.stderr
    result = ex.run([ENGINE, "--ferry", str(tmp_path / "missing")])
    assert result.returncode == 1 and "not an executable file" in result.stderr
