"""python/tests/test_ckpt_engine.py: Receiver.update_weights_from_ipc (checkpoint-engine) through
the C API: its fields are checked, and a receiver without a GPU refuses clearly before any
ParameterServer is contacted, keeping its version."""

import pytest

import models  # noqa: F401 (makes the test folder importable the same way everywhere)

HANDLES = {"GPU-0a1b2c3d-0000-1111-2222-333344445555": "ipc://@checkpoint-engine-GPU-x-0.sock"}


def test_cpu_receiver_refuses_with_a_clear_error(ferry_module):
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        with pytest.raises(ferry.FailedPreconditionError) as info:
            receiver.update_weights_from_ipc(HANDLES, weight_version="step-1")
        assert "needs a CUDA receiver" in info.value.message
        assert receiver.version.number == 0


def test_empty_handles_are_invalid_argument_naming_the_field(ferry_module):
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        with pytest.raises(ferry.InvalidArgumentError) as info:
            receiver.update_weights_from_ipc({})
        assert "zmq_handles" in info.value.message
        with pytest.raises(ferry.InvalidArgumentError) as info:
            receiver.update_weights_from_ipc(HANDLES, timeout=-1)
        assert "timeout_s" in info.value.message


def test_handles_as_checkpoint_engine_passes_them(ferry_module):
    # checkpoint-engine's req_func gets a list of (uuid, address) pairs; a list works as a dict.
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        with pytest.raises(ferry.FailedPreconditionError):
            receiver.update_weights_from_ipc(list(HANDLES.items()))
