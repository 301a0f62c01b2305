"""python/tests/test_update_from_tensor.py: /update_weights_from_tensor as SGLang's colocated
clients drive it, from a trainer in another process (tensor_trainer.py: torch's ForkingPickler,
base64, one entry per TP rank) into an embedded ferry.Receiver: CPU tensors shared through
shared-memory files (file_system strategy) land bit-identical, direct and flattened_bucket, in
one call or several (written as each call brings them, committed with the last tensor or at
end_weight_update; an update a client left is aborted after update.staged_tensors_timeout_ms, and
an incomplete one is rolled back from the host mirror, or fences a receiver with no committed
version); the file-descriptor strategy, hostile and malformed payloads are refused by the
restricted reader, never executed, and change nothing. The CUDA variant (CUDA IPC handles, direct and flattened_bucket) skips
without a GPU."""

import base64
import json
import os
import pickle
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import tensor_trainer

HERE = Path(__file__).resolve().parent
SHAPES = {"embed.weight": [64, 16], "layers.0.w": [16, 16], "layers.0.b": [16], "norm": [16]}


def _post(address, path, body):
    req = urllib.request.Request(f"http://{address}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _trainer(address, **spec):
    spec.setdefault("seed", 7)
    spec.setdefault("shapes", SHAPES)
    spec.setdefault("sglang_dir", str(HERE / "sglang_stub"))
    spec["dump"] = True
    return tensor_trainer.run(address, spec)


@pytest.fixture
def receiver(ferry_module):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    params = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    with ferry_module.Receiver() as r:
        r.register(params)
        r.serve(port=0)
        yield r, params


def _assert_identical(params, dump):
    torch = pytest.importorskip("torch")
    for name, t in params.items():
        got = t.contiguous().view(torch.uint8).flatten().tolist()
        assert got == dump[name], name


@pytest.mark.parametrize("load_format", [None, "direct", "flattened_bucket"])
def test_cpu_tensors_in_one_call_land_bit_identical(receiver, load_format):
    r, params = receiver
    result = _trainer(r.address, load_format=load_format, calls=[list(SHAPES)],
                      fields={"weight_version": "step-1", "flush_cache": True})
    [[status, body]] = result["answers"]
    assert status == 200 and body["committed"], body
    _assert_identical(params, result["dump"])
    assert r.version.label == "step-1"


def test_calls_outside_a_session_commit_with_the_last_tensor(receiver):
    r, params = receiver
    names = list(SHAPES)
    result = _trainer(r.address, load_format="flattened_bucket",
                      calls=[names[:2], names[2:]], fields={"weight_version": "two-calls"})
    (s1, b1), (s2, b2) = result["answers"]
    assert s1 == 200 and not b1["committed"] and b1["num_pending"] == 2, b1
    assert s2 == 200 and b2["committed"], b2
    _assert_identical(params, result["dump"])
    assert r.version.label == "two-calls"


def test_tensors_of_a_client_that_went_away_are_discarded(ferry_module):
    # update.staged_tensors_timeout_ms: the first call's tensors are dropped once the client has
    # sent nothing for that long, so a second client's call that completes the checkpoint does
    # not commit them, and the published version stays.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    import time
    params = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    with ferry_module.Receiver(update__staged_tensors_timeout_ms=300) as r:
        r.register(params)
        r.serve(port=0)
        before = r.version.number
        names = list(SHAPES)
        first = _trainer(r.address, calls=[names[:2]], fields={"weight_version": "gone"})
        [[status, body]] = first["answers"]
        assert status == 200 and not body["committed"] and body["num_pending"] == 2, body
        time.sleep(1.5)  # the timeout, and at least one look of the reaper after it
        rest = _trainer(r.address, seed=8, calls=[names[2:]], fields={"weight_version": "rest"})
        [[status, body]] = rest["answers"]
        assert status == 200 and not body["committed"], body
        assert body["num_pending"] == len(names) - 2, body  # only this call's
        assert r.version.number == before
        # (The rest is discarded in turn while the next trainer process starts: one whole call.)
        whole = _trainer(r.address, seed=9, calls=[names], fields={"weight_version": "all"})
        [[status, body]] = whole["answers"]
        assert status == 200 and body["committed"], body


def test_calls_inside_a_session_commit_at_end_weight_update(receiver):
    r, params = receiver
    before = r.version.number
    assert _post(r.address, "/begin_weight_update", {})[0] == 200
    names = list(SHAPES)
    result = _trainer(r.address, calls=[names[:1], names[1:]], fields={"weight_version": "sess"})
    assert all(s == 200 and not b["committed"] for s, b in result["answers"]), result["answers"]
    assert r.version.number == before  # nothing published before the session ends
    status, body = _post(r.address, "/end_weight_update", {})
    assert status == 200 and body["num_updates"] == 1, body
    _assert_identical(params, result["dump"])
    assert r.version.label == "sess"


def test_an_incomplete_session_fails_at_end_and_is_rolled_back(ferry_module):
    # The calls write the weights as they come; an update that never completes is aborted and
    # what it wrote is restored from the host mirror (mirror_refresh "complete": the copy of the
    # committed version always exists when the next update begins).
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    params = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    with ferry_module.Receiver(memory__mirror_refresh="complete") as r:
        r.register(params)
        r.serve(port=0)
        first = _trainer(r.address, calls=[list(SHAPES)], fields={"weight_version": "one"})
        assert first["answers"][0][1]["committed"], first["answers"]
        prints, version = r.fingerprints(), r.version
        assert _post(r.address, "/begin_weight_update", {})[0] == 200
        result = _trainer(r.address, seed=8, calls=[list(SHAPES)[:2]])
        assert result["answers"][0][0] == 200
        status, body = _post(r.address, "/end_weight_update", {})
        assert status >= 400 and "failed to commit" in body["message"], body
        assert "never sent" in body["message"] and "aborted" in body["message"], body
        assert r.version == version and r.fingerprints() == prints
        _assert_identical(params, first["dump"])  # the first update's bytes, restored
        assert r.health().ready, r.health()
        assert _post(r.address, "/begin_weight_update", {})[0] == 200  # the session did close
        assert _post(r.address, "/end_weight_update", {})[0] == 200


def test_a_first_update_that_fails_midway_fences_the_receiver(receiver):
    # No committed version to roll back to: the receiver says so instead of serving a mix.
    r, _ = receiver
    names = list(SHAPES)
    result = _trainer(r.address, calls=[names[:1], names[:1]])
    assert result["answers"][0][0] == 200
    assert result["answers"][1][0] == 400 and "aborted" in result["answers"][1][1]["message"]
    health = r.health()
    assert not health.ready and health.state == "fenced", health
    whole = _trainer(r.address, seed=9, calls=[names], fields={"weight_version": "all"})
    assert whole["answers"][0][1]["committed"], whole["answers"]
    assert r.health().ready


def test_file_descriptor_sharing_is_refused_naming_file_system(receiver):
    r, _ = receiver
    prints = r.fingerprints()
    result = _trainer(r.address, strategy="file_descriptor", calls=[list(SHAPES)])
    [[status, body]] = result["answers"]
    assert status == 400, body
    assert "file_system" in body["message"] and "file descriptor" in body["message"], body
    assert r.fingerprints() == prints


class _Exploit:
    """A pickle that would run a shell command if anything unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _raw(pickled):
    return {"serialized_named_tensors": [base64.b64encode(pickled).decode()]}


def test_hostile_and_malformed_payloads_are_refused_and_change_nothing(receiver, tmp_path):
    r, _ = receiver
    prints, version = r.fingerprints(), r.version
    marker = tmp_path / "pwned"
    nested = []
    for _ in range(200):
        nested = [nested]
    torch = pytest.importorskip("torch")
    good = pickle.dumps([("norm", torch.zeros(16))], protocol=4)  # torch.save-style, not shared
    cases = {
        "os.system": (_raw(pickle.dumps([("norm", _Exploit(marker))], protocol=4)),
                      "not on the allow-list"),
        "deep nesting": (_raw(pickle.dumps(nested, protocol=4)), "nesting deeper"),
        "truncated": (_raw(pickle.dumps([("norm", 1.0)], protocol=4)[:-3]), "pickle"),
        "not a tensor": (_raw(pickle.dumps([("norm", 1.0)], protocol=4)), "rebuild"),
        "torch.save pickle": (_raw(good), "allow-list"),
        "bad base64": ({"serialized_named_tensors": ["@@@@"]}, "base64"),
        "two ranks for one": ({"serialized_named_tensors": ["", ""]}, "tp_size 1"),
        "bad load_format": ({**_raw(pickle.dumps([], protocol=4)), "load_format": "pt"},
                            "load_format"),
    }
    for what, (body, expect) in cases.items():
        status, answer = _post(r.address, "/update_weights_from_tensor", body)
        assert status == 400, (what, answer)
        assert expect in answer["message"], (what, answer["message"])
    assert not marker.exists()
    assert r.version == version and r.fingerprints() == prints


def test_wrong_sizes_and_names_are_refused(receiver):
    r, _ = receiver
    prints = r.fingerprints()
    wrong_shape = dict(SHAPES, norm=[17])
    result = _trainer(r.address, shapes=wrong_shape, calls=[list(SHAPES)])
    assert result["answers"][0][0] == 400 and "'norm'" in result["answers"][0][1]["message"]
    extra = dict(SHAPES, stranger=[4])
    result = _trainer(r.address, shapes=extra, calls=[["stranger"]])
    assert result["answers"][0][0] == 400
    assert "'stranger' is not one of" in result["answers"][0][1]["message"]
    assert r.fingerprints() == prints  # each refused before anything was written
    result = _trainer(r.address, shapes=SHAPES, calls=[["norm"], ["norm"]])
    assert result["answers"][1][0] == 400 and "sent already" in result["answers"][1][1]["message"]


@pytest.mark.parametrize("load_format", ["direct", "flattened_bucket"])
def test_cuda_tensors_of_a_trainer_process_arrive_bit_identical(ferry_module, load_format):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (run on a GPU host: see docs/http-api.md)")
    params = {name: torch.zeros(shape, device="cuda:0", dtype=torch.bfloat16)
              for name, shape in SHAPES.items()}
    with ferry_module.Receiver() as r:
        r.register(params)
        r.serve(port=0)
        result = _trainer(r.address, device="cuda", dtype="bfloat16", load_format=load_format,
                          calls=[list(SHAPES)], fields={"weight_version": "gpu"})
        [[status, body]] = result["answers"]
        assert status == 200 and body["committed"], body
        torch.cuda.synchronize()
        _assert_identical({n: t.cpu() for n, t in params.items()}, result["dump"])
