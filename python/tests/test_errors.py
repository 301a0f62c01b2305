"""python/tests/test_errors.py: bad arguments and failures surface as ferry.Error subclasses
carrying the C code and message."""

import pytest

import models  # noqa: F401 (makes the test folder importable the same way everywhere)


def test_bad_config_key_is_invalid_argument_naming_the_key(ferry_module):
    ferry = ferry_module
    with pytest.raises(ferry.InvalidArgumentError) as info:
        ferry.Receiver(receiver__prot=8000)
    assert info.value.code == ferry.errors.INVALID_ARGUMENT
    assert info.value.status == "INVALID_ARGUMENT"
    assert "receiver.prot" in info.value.message
    assert isinstance(info.value, ValueError)


def test_sender_without_receivers_is_refused(ferry_module):
    ferry = ferry_module
    with pytest.raises(ferry.InvalidArgumentError, match="no receivers"):
        ferry.Sender(receivers=[])


def test_non_contiguous_tensor_is_refused_not_copied(ferry_module):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    ferry = ferry_module
    with ferry.Sender(["127.0.0.1:1"]) as sender:
        with pytest.raises(ferry.InvalidArgumentError) as info:
            sender.push({"w": torch.ones(4, 3).t()}, version=1)
    assert info.value.code == 1
    assert "tensor 0 'w'" in info.value.message
    assert "not row-major contiguous" in info.value.message


def test_duplicate_names_are_refused(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    a = np.ones(3, np.float32)
    with ferry.Sender(["127.0.0.1:1"]) as sender:
        with pytest.raises(ferry.InvalidArgumentError, match="'x': the name appears twice"):
            sender.push([("x", a), ("x", a)], version=1)


def test_unsupported_dtype_is_refused(ferry_module):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    ferry = ferry_module
    with ferry.Sender(["127.0.0.1:1"]) as sender:
        with pytest.raises(ferry.InvalidArgumentError, match="is not a dtype ferry supports"):
            sender.push({"z": torch.zeros(2, dtype=torch.complex64)}, version=1)


def test_object_without_dlpack_is_a_type_error(ferry_module):
    ferry = ferry_module
    with ferry.Sender(["127.0.0.1:1"]) as sender:
        with pytest.raises(TypeError, match="has neither __dlpack__ nor __array_interface__"):
            sender.push({"w": [1.0, 2.0]}, version=1)


def test_absent_receiver_fails_the_push_with_the_report(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    with ferry.Sender(["127.0.0.1:1"], connect_timeout=5) as sender:
        report = sender.push({"w": np.ones(4, np.float32)}, version=1, check=False)
        assert not report.all_committed
        assert report.receivers[0].address == "127.0.0.1:1"
        assert report.receivers[0].error
        with pytest.raises(ferry.PushError) as info:
            sender.push({"w": np.ones(4, np.float32)}, version=2)
    assert info.value.code == ferry.errors.PEER_FAILED
    assert "127.0.0.1:1" in info.value.message
    assert info.value.report.receivers[0].committed is False


def test_duplicate_and_late_registration_are_refused(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        receiver.register_params({"w": np.zeros(4, np.float32)})
        with pytest.raises(ferry.InvalidArgumentError, match="'w' is already registered"):
            receiver.register_params({"w": np.zeros(4, np.float32)})
        receiver.serve(port=0)
        with pytest.raises(ferry.FailedPreconditionError) as info:
            receiver.register_params({"v": np.zeros(4, np.float32)})
        assert info.value.code == ferry.errors.FAILED_PRECONDITION


def test_read_only_array_cannot_be_a_receiver_parameter(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    frozen = np.zeros(4, np.float32)
    frozen.setflags(write=False)
    with ferry.Receiver() as receiver:
        with pytest.raises(ferry.InvalidArgumentError, match="read-only"):
            receiver.register_params({"w": frozen})


def test_release_names_the_tag_and_a_double_release(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        receiver.register_params({"a": np.zeros(4, np.float32)})
        receiver.serve(port=0)
        with pytest.raises(ferry.NotFoundError, match="no tag 'nope'") as info:
            receiver.release("nope")
        assert info.value.code == ferry.errors.NOT_FOUND
        # Engine-owned weights: the engine tells ferry it frees them (docs/guides/colocated.md).
        receiver.release(["weights"])
        assert receiver.health().state == "released"
        with pytest.raises(ferry.FailedPreconditionError, match="already released"):
            receiver.release(["weights"])
        receiver.resume(["weights"])
        assert receiver.health().state != "released"
        with pytest.raises(ferry.FailedPreconditionError, match="not released"):
            receiver.resume(["weights"])


def test_closed_sender_and_receiver_refuse_with_a_clear_error(ferry_module):
    ferry = ferry_module
    sender = ferry.Sender(["127.0.0.1:1"])
    sender.close()
    with pytest.raises(ferry.FailedPreconditionError) as info:
        sender.push({}, version=1)
    assert "the sender is closed" in info.value.message
    with ferry.Receiver() as receiver:
        pass
    with pytest.raises(ferry.FailedPreconditionError) as info:
        receiver.serve(port=0)
    assert "the receiver is closed" in info.value.message
