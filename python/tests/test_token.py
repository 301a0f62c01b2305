"""python/tests/test_token.py: ferry.Sender takes the receivers' bearer token from `token`, a
token file (refused when every user may read it) or FERRY_TOKEN, so that it need not be in the
trainer's source or command line; a push without the right token is not committed."""

import os

import pytest

import models


@pytest.fixture
def guarded_receiver(ferry_module):
    """An embedded receiver (NumPy parameters) whose mutating routes need the token 'py-secret'."""
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    receiver = ferry_module.Receiver(receiver__token="py-secret")
    receiver.register_params(models.numpy_arrays(seed=3))
    receiver.serve(port=0)
    yield receiver, models.numpy_arrays(seed=4), np
    receiver.stop()
    receiver.close()


def _push(ferry, receiver, arrays, version, **kwargs):
    with ferry.Sender([receiver.address], transport="inline", **kwargs) as sender:
        return sender.push(arrays, version=version, check=False)


def test_token_file_and_environment_reach_the_receiver(ferry_module, guarded_receiver, tmp_path,
                                                       monkeypatch):
    ferry = ferry_module
    receiver, arrays, _ = guarded_receiver
    monkeypatch.delenv("FERRY_TOKEN", raising=False)
    refused = _push(ferry, receiver, arrays, 1)
    assert not refused.all_committed
    assert "token" in refused.receivers[0].error.lower(), refused.receivers[0].error

    token_file = tmp_path / "token"
    token_file.write_text("py-secret\n")
    token_file.chmod(0o600)
    assert _push(ferry, receiver, arrays, 2, token_file=token_file).all_committed

    monkeypatch.setenv("FERRY_TOKEN", "py-secret")
    assert _push(ferry, receiver, arrays, 3).all_committed
    # An explicit token wins over the environment.
    assert not _push(ferry, receiver, arrays, 4, token="wrong").all_committed
    assert receiver.version.number == 3


def test_a_token_file_every_user_can_read_is_refused(ferry_module, tmp_path):
    ferry = ferry_module
    token_file = tmp_path / "token"
    token_file.write_text("py-secret\n")
    token_file.chmod(0o644)
    with pytest.raises(ferry.InvalidArgumentError, match="every user .*chmod 600"):
        ferry.Sender(["127.0.0.1:1"], token_file=token_file)
    token_file.chmod(0o600)
    os.truncate(token_file, 0)
    with pytest.raises(ferry.InvalidArgumentError, match="one line"):
        ferry.Sender(["127.0.0.1:1"], token_file=str(token_file))
