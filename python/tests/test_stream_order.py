"""python/tests/test_stream_order.py: how a push and an embedded receiver are told to order
themselves after CUDA work (docs/c-api.md, "Stream ordering"), checked where it runs without a
GPU: the accepted spellings of `stream=` and `engine_stream=`, and the refused ones named. The
ordering itself is proven on a GPU (test_real_model_rl.py, tests/capi/capi_stream_order_test)."""

import numpy as np
import pytest


def test_push_takes_streams_or_none_and_names_a_bad_one(ferry_module):
    ferry = ferry_module
    weights = {"w": np.arange(16, dtype=np.float32)}
    with ferry.Receiver() as receiver:
        receiver.register_params({"w": np.zeros(16, dtype=np.float32)})
        receiver.serve(port=0)
        with ferry.Sender([receiver.address], transport="inline") as sender:
            # Host tensors: nothing to wait for, however the producer is named.
            assert sender.push(weights, version=1).all_committed
            assert sender.push(weights, version=2, stream="none").all_committed
            assert sender.push(weights, version=3, stream=[0]).all_committed
            for bad in ("soon", -1, 1.5, True, [0, "x"]):
                with pytest.raises(ferry.InvalidArgumentError) as e:
                    sender.push(weights, version=4, stream=bad)
                assert "stream" in str(e.value)
        assert receiver.version.number == 3


def test_receiver_engine_stream_spellings(ferry_module):
    ferry = ferry_module
    with ferry.Receiver(engine_stream="none") as receiver:
        receiver.set_engine_stream([0, 0])
        receiver.set_engine_stream(None)
        with pytest.raises(ferry.InvalidArgumentError) as e:
            receiver.set_engine_stream("later")
        assert "engine_stream" in str(e.value)
        with pytest.raises(ferry.InvalidArgumentError):
            receiver.set_engine_stream(-3)
