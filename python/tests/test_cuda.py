"""python/tests/test_cuda.py: PyTorch CUDA tensors on both sides: a sender pushing CUDA tensors
(staged through host memory by the sender) into an embedded receiver whose parameters live in
CUDA memory (written in place on the GPU). Skipped without torch or without a CUDA device."""

import pytest


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA round trip runs on a GPU machine")
    return torch


def test_cuda_tensors_land_bit_identical_in_cuda_parameters(ferry_module):
    torch = _torch_cuda()
    ferry = ferry_module
    gen = torch.Generator(device="cpu").manual_seed(7)
    shapes = {"embed.weight": (512, 256), "layer.0.w": (256, 1024), "layer.0.b": (1024,),
              "head.weight": (256, 512)}
    source = {}
    for i, (name, shape) in enumerate(shapes.items()):
        dtype = (torch.bfloat16, torch.float32, torch.float16, torch.bfloat16)[i]
        source[name] = torch.randn(shape, generator=gen).to(dtype).cuda()
    target = {name: torch.zeros_like(t) for name, t in source.items()}
    addresses = {name: t.data_ptr() for name, t in target.items()}
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        for version in (1, 2):
            for t in source.values():
                t.add_(1)  # a new step: every value changes
            with ferry.Sender([receiver.address]) as sender:
                sender.push(source, version=version)
            torch.cuda.synchronize()
            assert receiver.version.number == version
            for name in source:
                assert target[name].data_ptr() == addresses[name], name  # written in place
                assert torch.equal(target[name], source[name]), name


def test_pinned_host_tensors_a_non_blocking_copy_fills_are_read_after_it(ferry_module):
    """A trainer that stages its weights with tensor.to("cpu", non_blocking=True) into page-locked
    memory and pushes at once: ferry waits for torch's current stream before reading them."""
    torch = _torch_cuda()
    ferry = ferry_module
    n = 1 << 22
    source = torch.randn(n, device="cuda")
    staged = torch.empty(n, pin_memory=True)
    target = torch.zeros(n)
    with ferry.Receiver() as receiver:
        receiver.register_params({"w": target})
        receiver.serve(port=0)
        with ferry.Sender([receiver.address]) as sender:
            for version in (1, 2):
                source.add_(1)
                staged.fill_(0)
                torch.cuda._sleep(100_000_000)  # the copy lands ~50 ms after push() is called
                staged.copy_(source, non_blocking=True)
                sender.push({"w": staged}, version=version)
                assert receiver.version.number == version
                assert torch.equal(target, source.cpu()), "read before the copy landed"
