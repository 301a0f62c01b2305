"""python/tests/test_engine_callbacks.py: the callbacks an engine registers on an embedded
ferry.Receiver run when a trainer drives its control API the way SGLang's RL clients do
(pause_generation, flush_cache, begin_weight_update, an update, end_weight_update,
continue_generation, release/resume of kv_cache), in that order; /update_weights_from_tensor's
flush_cache and abort_all_requests wrap the call that completes the update; a callback's failure
is the request's answer, not swallowed."""

import json
import struct
import urllib.error
import urllib.request

import pytest

import tensor_trainer

TENSOR_SHAPES = {"w1": [8, 4], "w2": [4], "w3": [16]}


def _post(address, path, body=None, method="POST"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{address}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _write_safetensors(path, arrays):
    """A safetensors file (the format's own layout: u64 header length, JSON header, data)."""
    header, blobs, offset = {}, [], 0
    for name, a in arrays.items():
        raw = a.tobytes()
        header[name] = {"dtype": {"float32": "F32", "int64": "I64"}[a.dtype.name],
                        "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class Engine:
    """A stand-in engine: records every callback, fails the one named in `fail`; given the
    receiver's `params`, also which of them held written (nonzero) values as each callback ran."""

    def __init__(self, params=None):
        self.calls = []
        self.written = []
        self.fail = None
        self.params = params

    def _record(self, *call):
        self.calls.append(call)
        if self.params is not None:
            self.written.append(sorted(n for n, t in self.params.items() if t.any()))
        if self.fail == call[0]:
            raise RuntimeError(f"{call[0]} exploded on purpose")

    def pause(self, mode):
        self._record("pause", mode)
        return 3

    def resume(self, empty):
        self._record("resume", empty)

    def flush_cache(self, empty):
        self._record("flush_cache", empty)

    def post_load(self):
        self._record("post_load")

    def memory(self, tags, release):
        self._record("memory", tuple(tags), release)


@pytest.fixture
def embedded(ferry_module, tmp_path):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    target = {"a": np.zeros((8, 4), np.float32), "b": np.zeros(16, np.int64)}
    source = {"a": np.arange(32, dtype=np.float32).reshape(8, 4),
              "b": np.arange(16, dtype=np.int64) * 3}
    checkpoint = tmp_path / "model.safetensors"
    _write_safetensors(checkpoint, source)
    engine = Engine()
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        _serve_with(receiver, engine)
        yield receiver, engine, str(checkpoint), target, source


@pytest.fixture
def tensor_embedded(ferry_module):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    params = {name: torch.zeros(shape) for name, shape in TENSOR_SHAPES.items()}
    engine = Engine(params)
    with ferry_module.Receiver() as receiver:
        receiver.register(params)
        _serve_with(receiver, engine)
        yield receiver, engine


def _serve_with(receiver, engine):
    receiver.set_engine_callbacks(pause=engine.pause, resume=engine.resume,
                                  flush_cache=engine.flush_cache, post_load=engine.post_load,
                                  memory=engine.memory, memory_tags=["kv_cache"])
    receiver.serve(port=0)


def _push_tensors(receiver, names, **fields):
    """One /update_weights_from_tensor call from a trainer process (the same values every time)
    with `fields` beside the tensors: its status and answer."""
    result = tensor_trainer.run(receiver.address, {"seed": 7, "shapes": TENSOR_SHAPES,
                                                   "calls": [names], "fields": fields})
    [[status, body]] = result["answers"]
    return status, body


def test_sglang_update_sequence_runs_the_engine_callbacks_in_order(embedded):
    np = pytest.importorskip("numpy")
    receiver, engine, checkpoint, target, source = embedded
    a = receiver.address
    status, body = _post(a, "/pause_generation", {"mode": "retract"})
    assert status == 200 and body["num_paused_requests"] == 3, body
    assert _post(a, "/flush_cache")[0] == 200
    assert _post(a, "/begin_weight_update", {"selector": "target"})[0] == 200
    status, body = _post(a, "/update_weights_from_disk",
                         {"model_path": checkpoint, "weight_version": "step-1"})
    assert status == 200 and body["success"], body
    # Inside the session the post-load processing waits for end_weight_update.
    assert ("post_load",) not in engine.calls
    status, body = _post(a, "/end_weight_update", {})
    assert status == 200 and body["num_updates"] == 1, body
    assert _post(a, "/continue_generation", {})[0] == 200
    assert engine.calls == [("pause", "retract"), ("flush_cache", False),
                            ("flush_cache", False), ("post_load",), ("resume", True)]
    for name in source:
        assert np.array_equal(target[name], source[name]), name
    assert receiver.version.label == "step-1"


def test_update_outside_a_session_aborts_flushes_and_post_loads(embedded):
    receiver, engine, checkpoint, _, _ = embedded
    status, body = _post(receiver.address, "/update_weights_from_disk",
                         {"model_path": checkpoint, "abort_all_requests": True,
                          "torch_empty_cache": True})
    assert status == 200, body
    assert engine.calls == [("pause", "abort"), ("post_load",), ("flush_cache", True),
                            ("resume", False)]


def test_update_from_tensor_aborts_before_the_last_calls_writes_then_post_loads_and_flushes(
        tensor_embedded):
    receiver, engine = tensor_embedded
    names = list(TENSOR_SHAPES)
    effects = {"flush_cache": True, "abort_all_requests": True, "torch_empty_cache": True}
    status, body = _push_tensors(receiver, names[:1], **effects)
    assert status == 200 and not body["committed"], body
    # A call that does not complete the update runs none of them.
    assert engine.calls == []
    status, body = _push_tensors(receiver, names[1:], weight_version="tensors", **effects)
    assert status == 200 and body["committed"], body
    assert engine.calls == [("pause", "abort"), ("post_load",), ("flush_cache", True),
                            ("resume", False)]
    # The pause came before this call's writes (only the first call's tensor was written), the
    # post-load processing and the flush after all of them.
    everything = sorted(names)
    assert engine.written == [names[:1], everything, everything, everything]
    assert receiver.version.label == "tensors"


def test_update_from_tensor_effects_set_false_run_none_and_absent_take_sglangs_defaults(
        tensor_embedded):
    receiver, engine = tensor_embedded
    names = list(TENSOR_SHAPES)
    status, body = _push_tensors(receiver, names, flush_cache=False, abort_all_requests=False)
    assert status == 200 and body["committed"], body
    assert engine.calls == [("post_load",)]
    # Absent, SGLang's defaults: flush_cache true, abort_all_requests false.
    engine.calls.clear()
    status, body = _push_tensors(receiver, names)
    assert status == 200 and body["committed"], body
    assert engine.calls == [("post_load",), ("flush_cache", False)]


def test_kv_cache_tag_reaches_the_engine(embedded):
    receiver, engine, _, _, _ = embedded
    status, body = _post(receiver.address, "/release_memory_occupation", {"tags": ["kv_cache"]})
    assert status == 200 and body["engine_tags"] == ["kv_cache"], body
    status, body = _post(receiver.address, "/resume_memory_occupation", {"tags": ["kv_cache"]})
    assert status == 200, body
    assert engine.calls == [("memory", ("kv_cache",), True), ("memory", ("kv_cache",), False)]


def test_a_failing_callback_fails_its_request_with_the_reason(embedded):
    receiver, engine, checkpoint, _, _ = embedded
    a = receiver.address
    engine.fail = "post_load"
    assert _post(a, "/begin_weight_update", {})[0] == 200
    status, body = _post(a, "/end_weight_update", {})
    assert status == 500 and not body["success"], body
    assert "post_load exploded on purpose" in body["message"], body
    # The session is closed all the same: a new one can begin.
    assert _post(a, "/begin_weight_update", {})[0] == 200
    assert _post(a, "/end_weight_update", {})[0] == 500
    engine.fail = "flush_cache"
    status, body = _post(a, "/update_weights_from_disk", {"model_path": checkpoint})
    assert status == 500, body
    assert "the update committed" in body["message"] and "flush_cache exploded" in body["message"]
    engine.fail = "pause"
    status, body = _post(a, "/pause_generation", {})
    assert status == 500 and "pause exploded on purpose" in body["message"], body


def test_callbacks_cannot_change_inside_a_session(embedded):
    receiver, engine, _, _, _ = embedded
    ferry = pytest.importorskip("ferry")
    assert _post(receiver.address, "/begin_weight_update", {})[0] == 200
    with pytest.raises(ferry.Error) as refused:
        receiver.set_engine_callbacks()
    assert "weight-update session" in str(refused.value)
    assert _post(receiver.address, "/end_weight_update", {})[0] == 200
    receiver.set_engine_callbacks()  # no callbacks: answered like ferry serve
    status, body = _post(receiver.address, "/pause_generation", {})
    assert status == 200 and body["num_paused_requests"] == 0, body


def test_bad_engine_callbacks_are_refused(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        receiver.register_params({"a": np.zeros(4, np.float32)})
        with pytest.raises(ferry.Error) as no_memory:
            receiver.set_engine_callbacks(memory_tags=["kv_cache"])
        assert "without a memory callback" in str(no_memory.value)
        with pytest.raises(ferry.Error) as store_tag:
            receiver.set_engine_callbacks(memory=lambda tags, release: None,
                                          memory_tags=["weights"])
        assert "ferry's store tags" in str(store_tag.value)


def test_keep_pause_leaves_generation_paused_after_a_disk_update(embedded):
    receiver, engine, checkpoint, _, _ = embedded
    status, body = _post(receiver.address, "/update_weights_from_disk",
                         {"model_path": checkpoint, "abort_all_requests": True,
                          "keep_pause": True, "flush_cache": False})
    assert status == 200, body
    assert engine.calls == [("pause", "abort"), ("post_load",)]
    assert _post(receiver.address, "/continue_generation", {})[0] == 200
    assert engine.calls[-1] == ("resume", True)
