"""python/tests/test_roundtrip.py: a trainer's tensors pushed with ferry.Sender into an embedded
ferry.Receiver in a second process end bit-identical there (PyTorch and NumPy), through UCX when
its plugin loads, else the inline transport."""

import pytest

import models


def _transports(report):
    return sorted({r.transport for r in report.receivers})


def test_torch_state_dict_lands_bit_identical_in_named_parameters(ferry_module, receiver_process,
                                                                  tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    ferry = ferry_module
    trainer = models.torch_model(seed=1)
    engine = receiver_process("torch", seed=2)
    dump = tmp_path / "engine.pt"

    # Different seeds: the engine starts with other weights (the test can fail).
    assert engine.ask(f"dump {dump}").startswith("DUMPED")
    before = torch.load(dump)
    assert not all(torch.equal(before[k], v) for k, v in trainer.state_dict().items())

    sender = ferry.Sender(receivers=[engine.address], transport="auto")
    report = sender.push(trainer.state_dict(), version=1)
    assert report.all_committed, str(report)
    assert report.version == 1
    print("transport:", _transports(report))

    assert engine.ask("version") == "VERSION 1 1"
    assert engine.ask(f"dump {dump}").startswith("DUMPED")
    after = torch.load(dump)
    state = trainer.state_dict()
    assert sorted(after) == sorted(state)
    for name, tensor in state.items():
        assert after[name].dtype == tensor.dtype, name
        assert torch.equal(after[name], tensor), name

    # A second step: the trainer changes its weights in place, the engine follows.
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(1)
    report = sender.push(trainer.state_dict(), version=2, label="step-2")
    assert report.all_committed, str(report)
    assert engine.ask("version") == "VERSION 2 step-2"
    assert engine.ask(f"dump {dump}").startswith("DUMPED")
    after = torch.load(dump)
    for name, tensor in trainer.state_dict().items():
        assert torch.equal(after[name], tensor), name
    sender.close()


def test_numpy_arrays_land_bit_identical(ferry_module, receiver_process, tmp_path):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    arrays = models.numpy_arrays(seed=11)
    arrays["w.f32"].setflags(write=False)  # read-only: sent through __array_interface__
    engine = receiver_process("numpy", seed=12)
    with ferry.Sender(receivers=[engine.address]) as sender:
        report = sender.push(arrays, version=7)
    assert report.all_committed, str(report)
    print("transport:", _transports(report))
    dump = tmp_path / "engine.npz"
    assert engine.ask(f"dump {dump}").startswith("DUMPED")
    with np.load(dump) as after:
        assert sorted(after.files) == sorted(arrays)
        for name, array in arrays.items():
            assert after[name].dtype == array.dtype, name
            assert after[name].shape == array.shape, name
            assert np.array_equal(after[name], array), name


def test_in_process_receiver_reports_version_and_fingerprints(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    target = {"a": np.zeros((8, 4), np.float32), "b": np.zeros(16, np.int64)}
    source = {"a": np.arange(32, dtype=np.float32).reshape(8, 4),
              "b": np.arange(16, dtype=np.int64) * 3}
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        assert receiver.version.number == 0
        empty = receiver.fingerprints()
        with ferry.Sender([receiver.address]) as sender:
            sender.push(source, version=5)
        assert receiver.version == ferry.Version(5, "5")
        for name in source:
            assert np.array_equal(target[name], source[name]), name
        after = receiver.fingerprints()
        assert sorted(after) == ["a", "b"]
        assert after != empty


def test_report_says_when_a_push_reused_the_kept_session(ferry_module):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    target = {"a": np.zeros((8, 4), np.float32)}
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        with ferry.Sender([receiver.address]) as sender:
            first = sender.push({"a": np.ones((8, 4), np.float32)}, version=1)
            second = sender.push({"a": np.full((8, 4), 2, np.float32)}, version=2)
        assert [r.reused_session for r in first.receivers] == [False]
        assert [r.reused_session for r in second.receivers] == [True]
        # Host arrays go through the receiver's staging slots.
        assert not second.receivers[0].direct
        assert np.array_equal(target["a"], np.full((8, 4), 2, np.float32))


def test_push_gives_back_every_dlpack_view_it_took(ferry_module):
    # Views are released in one C call (ferry_dlpack_release): each capsule's deleter ran once,
    # so the arrays' reference counts are what they were before the push.
    import sys
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    if not hasattr(np.ndarray, "__dlpack__"):
        pytest.skip("this NumPy has no __dlpack__")
    ferry = ferry_module
    target = {f"w{i}": np.zeros(16, np.float32) for i in range(40)}
    source = {f"w{i}": np.full(16, i, np.float32) for i in range(40)}
    before = {k: sys.getrefcount(v) for k, v in source.items()}
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        with ferry.Sender([receiver.address]) as sender:
            for version in (1, 2):
                assert sender.push(source, version=version).all_committed
    assert {k: sys.getrefcount(v) for k, v in source.items()} == before
    assert all(np.array_equal(target[k], source[k]) for k in source)


def test_push_logs_its_python_side_at_debug_level(ferry_module, caplog):
    # docs/config.md: Sender.push logs its own phases through logging ("ferry.sender").
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    target = {"a": np.zeros((8, 4), np.float32), "b": np.zeros(3, np.float32)}
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        with ferry.Sender([receiver.address]) as sender:
            sender.push({"a": np.ones((8, 4), np.float32), "b": np.ones(3, np.float32)},
                        version=1)
            assert not [r for r in caplog.records if r.name == "ferry.sender"]
            with caplog.at_level("DEBUG", logger="ferry.sender"):
                sender.push({"a": np.full((8, 4), 2, np.float32), "b": np.ones(3, np.float32)},
                            version=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "ferry.sender"]
    assert len(lines) == 1, lines
    assert lines[0].startswith("push of version 2: 2 tensors exported in "), lines[0]
    assert "ferry_sender_push" in lines[0] and "views released in" in lines[0], lines[0]


def test_a_push_of_the_same_torch_tensors_reuses_their_views_and_follows_every_change(
        ferry_module, caplog):
    # The Sender describes torch tensors without DLPack and keeps those views while the next
    # push names the same tensors (pointer, shape, strides, dtype, device): every push still reads
    # the values of its call, and anything that changes a tensor's description is seen.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target = {"a": np.zeros((4, 4), np.float32), "b": np.zeros(6, np.float32)}
    a = torch.arange(16, dtype=torch.float32, device=device).reshape(4, 4)
    source = {"a": a, "b": torch.ones(6, device=device)}

    def exported_by():
        lines = [r.getMessage() for r in caplog.records if r.name == "ferry.sender"]
        caplog.clear()
        assert len(lines) == 1, lines
        return "plain views" if "(plain views)" in lines[0] else "DLPack"

    def landed():
        for name, t in source.items():
            assert np.array_equal(target[name], t.cpu().numpy()), name

    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        with ferry.Sender([receiver.address]) as sender, \
                caplog.at_level("DEBUG", logger="ferry.sender"):
            sender.push(source, version=1)
            landed()
            assert exported_by() == "plain views"
            with torch.no_grad():
                a.mul_(3)  # in place: the same views, the new values
            sender.push(source, version=2)
            landed()
            assert exported_by() == "plain views"
            source["b"] = torch.full((6,), 7.0, device=device)  # new storage, same name
            sender.push(source, version=3)
            landed()
            assert exported_by() == "plain views"
            # The same pointer and shape with other strides (a transpose): never the old view.
            source["a"] = a.t()
            with pytest.raises(ferry.InvalidArgumentError, match="'a'"):
                sender.push(source, version=4)
            caplog.clear()
            # The same pointer, shape, strides and dtype, negated lazily: never the old view, and
            # refused (its memory holds the values before the negation), naming the tensor.
            source["a"] = a._neg_view()
            with pytest.raises(ferry.InvalidArgumentError, match="'a'.*negative bit"):
                sender.push(source, version=4)
            caplog.clear()
            # A parameter whose storage is swapped (an offload/reload): the new storage is read.
            b = torch.nn.Parameter(torch.ones(6, device=device), requires_grad=False)
            source["a"] = a
            source["b"] = b
            sender.push(source, version=4)
            landed()
            assert exported_by() == "plain views"
            b.data = torch.full((6,), 9.0, device=device)
            sender.push(source, version=5)
            landed()
            assert exported_by() == "plain views"
            source["a"] = a
            source["c"] = np.full(3, 5, np.float32)  # not a torch tensor: the push goes by DLPack
            unknown = sender.push(source, version=6, check=False)
            assert exported_by() == "DLPack"
            assert not unknown.all_committed  # "c" is no parameter of the receiver
            del source["c"]
            sender.push(source, version=7)
            landed()
            assert exported_by() == "plain views"
        assert receiver.version.number == 7


def test_one_push_reaches_two_receivers(ferry_module, receiver_process, tmp_path):
    np = pytest.importorskip("numpy", reason="NumPy is not installed (python3-numpy)")
    ferry = ferry_module
    arrays = models.numpy_arrays(seed=21)
    engines = [receiver_process("numpy", seed=22), receiver_process("numpy", seed=23)]
    with ferry.Sender(receivers=[e.address for e in engines]) as sender:
        report = sender.push(arrays, version=3)
    assert [r.address for r in report.receivers] == [e.address for e in engines]
    assert all(r.committed for r in report.receivers), str(report)
    for i, engine in enumerate(engines):
        dump = tmp_path / f"engine{i}.npz"
        assert engine.ask(f"dump {dump}").startswith("DUMPED")
        with np.load(dump) as after:
            for name, array in arrays.items():
                assert np.array_equal(after[name], array), (engine.address, name)
