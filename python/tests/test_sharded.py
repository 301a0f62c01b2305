"""python/tests/test_sharded.py: sharded pushes from Python (docs/sharded.md): ranks pushing
ferry.Block wrappers (row blocks, column blocks copied out, replicas) from threads of their own
into an embedded receiver land bit-identical and report bytes moved per rank and bytes needed;
overlapping blocks are refused naming the ranks and the tensor, the version unchanged; the
DTensor placements (Shard(d) on several mesh dimensions, Replicate) give the blocks torch.chunk
does; with PyTorch installed, a real DTensor of a one-process gloo mesh is pushed as one. On a GPU,
4 sender processes holding quarters of a model in CUDA memory push into 2 `ferry serve` receivers
by CUDA IPC (bench/sharded_push.py), verified against the one-sender push of the same values."""

import ctypes
import math
import threading

import pytest


class Buffer:
    """A float32 array in host memory, read and written through __array_interface__ (no NumPy
    needed)."""

    def __init__(self, shape, values=None):
        self.shape = tuple(shape)
        n = math.prod(self.shape)
        self._data = (ctypes.c_float * max(1, n))(*(values if values is not None else [0.0] * n))
        self.nbytes = 4 * n
        self.__array_interface__ = {"data": (ctypes.addressof(self._data), False),
                                    "typestr": "<f4", "shape": self.shape, "version": 3}

    def values(self):
        return list(self._data[:math.prod(self.shape)])


def _global(shape, seed):
    n = math.prod(shape)
    return [float((i * 7 + seed * 13) % 101) for i in range(n)]


def _rows(values, shape, begin, end):
    cols = math.prod(shape[1:])
    return Buffer((end - begin,) + tuple(shape[1:]), values[begin * cols:end * cols])


def _cols(values, shape, begin, end):
    rows, cols = shape
    out = [values[r * cols + c] for r in range(rows) for c in range(begin, end)]
    return Buffer((rows, end - begin), out)


SHAPES = {"embed": (8, 6), "proj": (6, 4), "norm": (6,)}


@pytest.fixture
def receiver(ferry_module):
    ferry = ferry_module
    params = {name: Buffer(shape) for name, shape in SHAPES.items()}
    r = ferry.Receiver(receiver__model_family="identity")
    r.register_params(params)
    r.serve(port=0)
    yield r, params
    r.close()


def _push_ranks(ferry, address, per_rank, version=1):
    """Pushes per_rank[r] (name -> tensor or Block) as rank r of len(per_rank), side by side."""
    reports = [None] * len(per_rank)

    def run(r):
        sender = ferry.Sender([address], transport="inline", bucket_bytes=64)
        try:
            reports[r] = sender.push(per_rank[r], version, check=False, rank=r,
                                     world=len(per_rank))
        finally:
            sender.close()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(per_rank))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return reports


def test_row_and_column_blocks_and_a_replica_land_bit_identical(ferry_module, receiver):
    ferry = ferry_module
    r, params = receiver
    values = {name: _global(shape, seed=i + 1) for i, (name, shape) in enumerate(SHAPES.items())}
    Block = ferry.Block
    rank0 = {"embed": Block(_rows(values["embed"], SHAPES["embed"], 0, 3), SHAPES["embed"], (0, 0)),
             "proj": Block(_cols(values["proj"], SHAPES["proj"], 0, 1), SHAPES["proj"], (0, 0)),
             "norm": Block(Buffer(SHAPES["norm"], values["norm"]), SHAPES["norm"])}
    rank1 = {"embed": Block(_rows(values["embed"], SHAPES["embed"], 3, 8), SHAPES["embed"], (3, 0)),
             "proj": Block(_cols(values["proj"], SHAPES["proj"], 1, 4), SHAPES["proj"], (0, 1)),
             "norm": Block(Buffer(SHAPES["norm"], values["norm"]), SHAPES["norm"], replica=True)}
    reports = _push_ranks(ferry, r.address, [rank0, rank1])
    for report in reports:
        assert report.all_committed, str(report)
    assert r.version.number == 1
    for name in SHAPES:
        assert params[name].values() == values[name], name
    outcome = reports[0].receivers[0]
    assert outcome.needed_bytes == 4 * sum(math.prod(s) for s in SHAPES.values())
    # rank 0: 3 rows of embed, 1 column of proj, norm; rank 1 the rest, not the replica.
    assert outcome.rank_bytes == [4 * (3 * 6 + 6 * 1 + 6), 4 * (5 * 6 + 6 * 3)]
    assert sum(outcome.rank_bytes) == outcome.needed_bytes


def test_overlapping_blocks_are_refused_naming_the_ranks_and_the_tensor(ferry_module, receiver):
    ferry = ferry_module
    r, params = receiver
    values = {name: _global(shape, seed=5) for name, shape in SHAPES.items()}
    Block = ferry.Block
    rank0 = {name: Block(Buffer(shape, values[name]), shape) for name, shape in SHAPES.items()}
    rank1 = {"embed": Block(_rows(values["embed"], SHAPES["embed"], 2, 4), SHAPES["embed"], (2, 0))}
    reports = _push_ranks(ferry, r.address, [rank0, rank1])
    for report in reports:
        assert not report.all_committed
        error = report.receivers[0].error
        assert "tensor 'embed'" in error and "rank 0 [0:8, 0:6] and rank 1 [2:4, 0:6] overlap" in \
            error, error
    assert r.version.number == 0


def test_a_block_needs_a_rank_and_a_world(ferry_module, receiver):
    ferry = ferry_module
    r, _ = receiver
    sender = ferry.Sender([r.address], transport="inline")
    try:
        with pytest.raises(ferry.InvalidArgumentError, match="rank= and world="):
            sender.push({"norm": ferry.Block(Buffer((6,)), (6,))}, 1)
        with pytest.raises(ferry.InvalidArgumentError, match="outside its global extent"):
            sender.push({"norm": ferry.Block(Buffer((4,)), (6,), (3,))}, 1, rank=0, world=1)
    finally:
        sender.close()


# ---- DTensor placements ---------------------------------------------------------------------

class _Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True

    def is_replicate(self):
        return False


class _Replicate:
    def is_shard(self):
        return False

    def is_replicate(self):
        return True


class _Mesh:
    def __init__(self, shape, coordinate):
        self.shape, self._coordinate = tuple(shape), list(coordinate)

    def get_coordinate(self):
        return self._coordinate

    def size(self, m):
        return self.shape[m]


class DTensor:  # the attributes ferry reads of torch.distributed.tensor.DTensor
    def __init__(self, shape, mesh, placements, local_shape):
        self.shape, self.device_mesh, self.placements = shape, mesh, placements
        self._local = Buffer(local_shape)

    def to_local(self):
        return self._local


def test_dtensor_placements_give_torch_chunk_blocks(ferry_module):
    from ferry.sharding import dtensor_block, dtensor_rank_world
    # Shard(0) over a mesh of 4 of 10 rows: chunks of 3, 3, 3, 1.
    dt = DTensor((10, 4), _Mesh((4,), (3,)), [_Shard(0)], (1, 4))
    b = dtensor_block("w", dt)
    assert (b.offsets, b.global_shape, b.replica) == ((9, 0), (10, 4), False)
    assert dtensor_rank_world(dt) == (3, 4)
    # A 2 x 2 mesh: Shard(1) on dim 0 of the mesh, Replicate on dim 1: coordinate 1 replicates.
    dt = DTensor((4, 8), _Mesh((2, 2), (1, 1)), [_Shard(1), _Replicate()], (4, 4))
    b = dtensor_block("w", dt)
    assert (b.offsets, b.replica) == ((0, 4), True)
    assert dtensor_rank_world(dt) == (3, 4)
    # Shard(0) on both mesh dims: the second splits what the first left.
    dt = DTensor((8, 2), _Mesh((2, 2), (1, 0)), [_Shard(0), _Shard(0)], (2, 2))
    assert dtensor_block("w", dt).offsets == (4, 0)
    # An empty shard holds nothing; a local shard of another shape is refused.
    assert dtensor_block("w", DTensor((2, 2), _Mesh((4,), (3,)), [_Shard(0)], (0, 2))) is None
    with pytest.raises(ferry_module.InvalidArgumentError, match="local shard"):
        dtensor_block("w", DTensor((10, 4), _Mesh((4,), (0,)), [_Shard(0)], (2, 4)))


def test_a_real_dtensor_of_a_one_process_mesh(ferry_module, receiver, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    dist = pytest.importorskip("torch.distributed")
    tensor_api = pytest.importorskip("torch.distributed.tensor")
    ferry = ferry_module
    r, params = receiver
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
        state = {}
        for i, (name, shape) in enumerate(SHAPES.items()):
            full = torch.tensor(_global(shape, seed=i + 7), dtype=torch.float32).reshape(shape)
            state[name] = tensor_api.distribute_tensor(full, mesh, [tensor_api.Shard(0)])
        report = ferry.Sender([r.address], transport="inline").push(state, 3)
        assert report.all_committed, str(report)
        for i, (name, shape) in enumerate(SHAPES.items()):
            assert params[name].values() == _global(shape, seed=i + 7), name
    finally:
        dist.destroy_process_group()


def _run_sharded_bench(ferry_executable, extra):
    """bench/sharded_push.py on cuda:0 (8 layers, 2 rounds, 2 receivers) with `extra`; its JSON.
    Skips without torch, CUDA or the script."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the sharded CUDA IPC push runs on a GPU machine "
                    "(tests/bench runs the same program on the CPU)")
    script = Path(__file__).resolve().parents[2] / "bench" / "sharded_push.py"
    if not script.is_file():
        pytest.skip(f"{script} is not here")
    done = subprocess.run([sys.executable, str(script), "--ferry", ferry_executable,
                           "--layers", "8", "--rounds", "2", "--no-table"] + list(extra),
                          stdout=subprocess.PIPE, text=True, timeout=400)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.get("ok"), result
    return result


def test_four_gpu_ranks_into_two_gpu_receivers_by_cuda_ipc(ferry_module, ferry_executable):
    """bench/sharded_push.py on cuda:0: 4 sender processes, each holding a quarter (dim-0 rows) of
    every tensor of an 8-layer Qwen3-8B-shaped model (3.7 GB of bf16) in its own CUDA memory,
    push into 2 `ferry serve --device cuda:0` receivers; every sharded version must equal, on
    both receivers, the one-sender push of the same values (fingerprints), bytes moved = bytes
    needed, and the transport cuda_ipc, with update.delivery = "staged": every rank's blocks go
    through the receivers' slots."""
    result = _run_sharded_bench(ferry_executable, ["--senders", "4", "--delivery", "staged"])
    assert result["verified"], result["verification"]
    (row,) = result["rows"]
    assert row["transports"] == ["cuda_ipc"], row
    assert row["moved_equals_needed"] and len(row["rank_bytes"]) == 4, row
    assert sum(row["rank_bytes"]) == row["needed_bytes"] == result["model_bytes"], row
    assert row["direct_ranks"] == [False] * 4, row


def test_four_gpu_ranks_write_their_row_blocks_into_the_receivers_parameters(ferry_module,
                                                                             ferry_executable):
    """The same with update.delivery = "auto" (the default): every rank's dim-0 blocks go straight
    into the receivers' parameters (the piece's destination in the tensor's plan), verified
    against the one-sender push on both receivers, bytes moved = bytes needed; the second round
    goes through the sessions kept from the first."""
    result = _run_sharded_bench(ferry_executable, ["--senders", "4"])
    assert result["verified"], result["verification"]
    (row,) = result["rows"]
    assert row["transports"] == ["cuda_ipc"], row
    assert row["moved_equals_needed"], row
    assert row["direct_ranks"] == [True] * 4, row


def test_gpu_ranks_delivering_directly_beside_a_staged_rank(ferry_module, ferry_executable):
    """The same on cuda:0 with rank 1 staging (update.delivery = "staged") while ranks 0, 2 and 3
    write their blocks in place ("direct"): one update of both kinds of bucket, verified on both
    receivers against the one-sender push, bytes moved = bytes needed."""
    result = _run_sharded_bench(ferry_executable, ["--senders", "4", "--delivery", "direct",
                                                   "--staged-ranks", "1"])
    assert result["verified"], result["verification"]
    (row,) = result["rows"]
    assert row["direct_ranks"] == [True, False, True, True], row
    assert row["moved_equals_needed"], row


def test_four_gpu_ranks_into_two_tensor_parallel_gpu_receivers(ferry_module, ferry_executable):
    """4 sender processes holding dim-0 quarters on cuda:0 into 2 `ferry serve` receivers that
    are one engine's tensor-parallel ranks (dense engine layout, tp_size 2), staged and then
    with update.delivery = "direct": each receiver takes only its rows and columns (bytes moved =
    bytes needed, less than the model), every version equal to the one-sender push of the same
    values on both receivers; direct, every rank's pieces go straight into the parameters."""
    for extra, direct in ((["--delivery", "staged"], False), (["--delivery", "direct"], True)):
        result = _run_sharded_bench(ferry_executable, ["--senders", "4", "--tp"] + extra)
        assert result["verified"], result["verification"]
        (row,) = result["rows"]
        assert row["transports"] == ["cuda_ipc"], row
        assert row["moved_equals_needed"], row
        # Each receiver took its half of the split tensors (and the norms whole): no whole model.
        assert all(m < result["model_bytes"] for m in row["moved_bytes"]), row
        assert row["direct_ranks"] == [direct] * 4, row
