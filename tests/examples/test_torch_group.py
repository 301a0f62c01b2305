"""tests/examples/test_torch_group.py: the disaggregated trainer written the way verl and slime
drive SGLang's distributed update (examples/torch_group/trainer.py, docs/guides/torch-group.md)
against `ferry serve` engines on this machine's CPU, as its guide runs it: the trainer creates a
gloo group with torch.distributed as rank 0, the engines join it (/init_weights_update_group,
backend "gloo"), and after two steps, by one flattened bucket into two engines and by one
broadcast per tensor into one (on the interface GLOO_SOCKET_IFNAME names), every engine serves
the last step and holds the trainer's final weights bit for bit. Also the guide's failures: an
engine without the gloo transport, an update an engine refuses (named at once; the next run
forms a new group), bfloat16 broadcasts on torch 1.x, an engine that is not there. Skips where
torch has no gloo or this build has no torch_gloo plugin (the libtorch feature)."""

import subprocess

import pytest

import examples_support as ex
from examples_support import http_get

TRAINER = ex.example("torch_group", "trainer.py")
# A model small enough that /get_weights_by_name returns every value of every tensor.
MODEL = ["--vocab", "128", "--hidden", "64", "--layers", "2"]


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with gloo")
    listed = subprocess.run([ex.ferry_exe(), "plugins"], capture_output=True, text=True,
                            timeout=60)
    if not any(line.split()[:1] == ["torch_gloo"] for line in listed.stdout.splitlines()):
        pytest.skip("this build has no torch_gloo plugin (the libtorch feature: apt-get install "
                    "libtorch-dev libgloo-dev, then scripts/build)")
    return torch


def trainer(engines, *extra, timeout=180, env=None):
    return ex.run([TRAINER, "--engines", ",".join(e.address for e in engines),
                   "--master-port", str(free_port()), *MODEL, *extra], timeout=timeout, env=env)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_serves(torch, engine, saved, label, version):
    """The engine serves `label` as version `version`, holds the weights torch.save'd in `saved`
    bit for bit, and is left with no session open and generation not paused."""
    assert http_get(engine.address, "/get_weight_version")[1] == {
        "weight_version": label, "version": version}
    state = torch.load(saved)
    assert ex.differing_values(state, engine.address) == [], engine.output()
    status, prints = http_get(engine.address, "/get_fingerprints")
    assert status == 200 and prints["weight_version"] == label, prints
    assert sorted(prints["fingerprints"]) == sorted(state), prints
    status, info = http_get(engine.address, "/server_info")
    assert not info["ferry"]["engine"]["paused"], info
    assert not info["ferry"]["engine"]["weight_update_session"], info
    return prints["fingerprints"]


def test_two_steps_as_one_flattened_bucket_into_two_engines(torch, tmp_path):
    engines = [ex.ferry_serve(tmp_path, name=f"engine{i}") for i in (1, 2)]
    try:
        result = trainer(engines, "--steps", "2", "--save", str(tmp_path / "t.pt"))
        assert result.returncode == 0, ex.explain(result) + engines[0].output()
        out = result.stdout
        assert ("group 'weight_update_group': rank 0 of 3 (gloo), 2 engine(s) joined"
                in out), out
        assert out.count("broadcast 0.16 MB (flattened_bucket)") == 2, out
        for step in (1, 2):
            assert f"every engine published step-{step}" in out, out
            assert (f"  every engine serves step-{step}: values read back match the trainer's"
                    in out), out
        assert out.count("group 'weight_update_group' left: left") == 2, out
        prints = [assert_serves(torch, e, tmp_path / "t.pt", "step-2", 2) for e in engines]
        assert prints[0] == prints[1]
    finally:
        codes = [e.stop() for e in engines]
    assert codes == [0, 0], engines[0].output()
    for e in engines:
        assert ("update 2 ('step-2') by broadcast in group 'weight_update_group' (flattened)"
                in e.output()), e.output()


def test_two_steps_as_one_broadcast_per_tensor_on_the_interface_named(torch, tmp_path):
    loopback = {"GLOO_SOCKET_IFNAME": "lo"}
    engine = ex.ferry_serve(tmp_path, env=loopback)
    try:
        result = trainer([engine], "--steps", "2", "--load-format", "per_tensor",
                         "--dtype", "float32", "--save", str(tmp_path / "t.pt"), env=loopback)
        assert result.returncode == 0, ex.explain(result) + engine.output()
        assert "broadcast 0.33 MB (per_tensor)" in result.stdout, result.stdout
        assert_serves(torch, engine, tmp_path / "t.pt", "step-2", 2)
    finally:
        assert engine.stop() == 0, engine.output()
    assert ("update 2 ('step-2') by broadcast in group 'weight_update_group' (one broadcast per "
            "tensor)") in engine.output()


def test_an_engine_without_the_gloo_transport_is_named_at_once(torch, tmp_path):
    engine = ex.ferry_serve(tmp_path, "--set", "update.gloo_transport=torch_gloo_absent")
    try:
        result = trainer([engine], "--steps", "1", timeout=60)
    finally:
        engine.stop()
    assert result.returncode == 1, ex.explain(result)
    assert (f"error: http://{engine.address}/init_weights_update_group answered 501: "
            "init_weights_update_group: backend 'gloo' needs the transport plugin "
            "'torch_gloo_absent'") in result.stderr, ex.explain(result)


def test_an_update_an_engine_refuses_is_named_at_once_and_the_next_run_goes_on(torch,
                                                                                tmp_path):
    engine = ex.ferry_serve(tmp_path)
    try:
        assert trainer([engine], "--steps", "1").returncode == 0  # the layout: bfloat16
        result = trainer([engine], "--steps", "1", "--load-format", "per_tensor",
                         "--dtype", "float32", timeout=60)
        assert result.returncode == 1, ex.explain(result)
        assert (f"error: http://{engine.address}/update_weights_from_distributed answered 400: "
                "group 'weight_update_group' update failed during phase 'open the update': "
                "checkpoint tensor 'embed.weight' is F32 [128, 64] but the layout expects BF16 "
                "[128, 64] (the group was left: run again for a new one)") in result.stderr, \
            ex.explain(result)
        # The engine kept step-1 and was left as the trainer found it.
        assert http_get(engine.address, "/get_weight_version")[1]["weight_version"] == "step-1"
        state = http_get(engine.address, "/server_info")[1]["ferry"]["engine"]
        assert not state["paused"] and not state["weight_update_session"], state
        result = trainer([engine], "--steps", "1", "--save", str(tmp_path / "t.pt"))
        assert result.returncode == 0, ex.explain(result) + engine.output()
        assert_serves(torch, engine, tmp_path / "t.pt", "step-1", 2)
    finally:
        assert engine.stop() == 0, engine.output()


def test_bfloat16_per_tensor_on_torch_1_is_refused(torch):
    if int(torch.__version__.split(".")[0]) >= 2:
        pytest.skip("torch 2's gloo broadcasts bfloat16 tensors")
    result = ex.run([TRAINER, "--engines", "127.0.0.1:1", "--load-format", "per_tensor"])
    assert result.returncode == 1, ex.explain(result)
    assert (f"error: --load-format per_tensor: gloo of torch {torch.__version__} cannot broadcast "
            "bfloat16 tensors; use --load-format flattened_bucket (bytes) or --dtype float32"
            in result.stderr), ex.explain(result)


def test_an_engine_that_is_not_there_is_named(torch):
    result = ex.run([TRAINER, "--engines", "127.0.0.1:1"])
    assert result.returncode == 1, ex.explain(result)
    assert ("error: http://127.0.0.1:1/get_weight_version: [Errno 111] Connection refused (is "
            "the engine running there?)") in result.stderr, ex.explain(result)


def test_arguments_are_checked():
    result = ex.run([TRAINER, "--engines", " , "])
    assert result.returncode == 2 and "--engines names no engine" in result.stderr
    result = ex.run([TRAINER, "--engines", "x:1", "--load-format", "safetensors"])
    assert result.returncode == 2 and "invalid choice: 'safetensors'" in result.stderr
