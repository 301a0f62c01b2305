"""python/tests/test_nccl.py: NCCL weight-update groups through ferry.NcclGroup and the embedded
ferry.Receiver: argument checks name the field; without NCCL or a GPU the calls fail with a clear
error instead of hanging; with one GPU, a one-rank group broadcasts, and both sides of a group
answer NOT_FOUND / TIMEOUT as documented."""

import socket

import pytest

import models  # noqa: F401 (makes the test folder importable the same way everywhere)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_group_arguments_are_checked_before_anything_starts(ferry_module):
    ferry = ferry_module
    with pytest.raises(ferry.InvalidArgumentError, match="master_port"):
        ferry.NcclGroup("127.0.0.1", 0, 2)
    with pytest.raises(ferry.InvalidArgumentError, match="world_size"):
        ferry.NcclGroup("127.0.0.1", free_port(), 0)
    with pytest.raises(ferry.InvalidArgumentError, match="init_timeout"):
        ferry.NcclGroup("127.0.0.1", free_port(), 1, init_timeout=-1)


def test_one_rank_group_broadcasts_or_is_refused_clearly(ferry_module):
    """world_size 1 never waits for a peer: with a GPU it broadcasts a host tensor and destroys
    itself (finalized: no other rank); without NCCL or a GPU the error says which."""
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    try:
        group = ferry.NcclGroup("127.0.0.1", free_port(), 1, group_name="g1",
                                bucket_bytes=1 << 20, init_timeout=30)
    except ferry.UnimplementedError as e:
        assert "NCCL" in e.message or "session" in e.message
        return
    except ferry.FailedPreconditionError as e:
        assert "CUDA device" in e.message
        return
    with group:
        tensors = {"w": np.arange(1000, dtype=np.float32), "b": np.ones(7, np.float16)}
        request = group.update_request(tensors, weight_version="v1")
        assert request["names"] == ["w", "b"]
        assert request["dtypes"] == ["F32", "F16"]
        assert request["shapes"] == [[1000], [7]]
        assert request["group_name"] == "g1"
        assert request["bucket_bytes"] == 1 << 20
        assert request["weight_version"] == "v1"
        sent, seconds = group.broadcast(tensors)
        assert sent >= 4000 + 14
        assert seconds >= 0
        assert group.destroy(timeout=10) == "finalized"
        with pytest.raises(ferry.FailedPreconditionError):
            group.broadcast(tensors)


def test_receiver_group_calls_name_the_group_and_the_field(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    param = np.zeros(16, np.float32)
    with ferry.Receiver() as receiver:
        receiver.register({"w": param}.items())
        with pytest.raises(ferry.NotFoundError, match="no weight-update group 'nope'"):
            receiver.destroy_weights_update_group("nope")
        with pytest.raises(ferry.InvalidArgumentError, match="rank_offset"):
            receiver.init_weights_update_group("127.0.0.1", free_port(), 0, 2)
        with pytest.raises(ferry.InvalidArgumentError, match="backend"):
            receiver.init_weights_update_group("127.0.0.1", free_port(), 1, 2, backend="mpi")
        with pytest.raises(ferry.InvalidArgumentError, match="dtypes"):
            receiver.update_weights_from_distributed(names=["w"], dtypes=None, shapes=[[16]])
        with pytest.raises((ferry.NotFoundError, ferry.UnimplementedError)):
            receiver.update_weights_from_distributed(names=["w"], dtypes=["float32"],
                                                     shapes=[[16]], group_name="nope")


def test_receiver_init_without_rank_zero_fails_instead_of_hanging(ferry_module):
    """Nobody serves rank 0 on that port: without NCCL / a GPU the init is refused at once;
    with a GPU it times out naming the phase."""
    pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    import numpy as np
    ferry = ferry_module
    with ferry.Receiver() as receiver:
        receiver.register({"w": np.zeros(4, np.float32)}.items())
        with pytest.raises((ferry.UnimplementedError, ferry.FailedPreconditionError,
                            ferry.TimeoutError)) as info:
            receiver.init_weights_update_group("127.0.0.1", free_port(), 1, 2, timeout=1)
        assert info.value.message
