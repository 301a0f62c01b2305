"""python/tests/test_ucx_gpu.py: UCX straight into GPU memory (plugins/ucx/README.md, "GPU
memory"). On a GPU machine, with the UCX plugin built against a UCX with CUDA (the PyPI
libucx-cu13 package, -Ducx_dir): a trainer process holding a Qwen3-8B-shaped model (36 layers,
16.38 GB of bf16) in its CUDA memory pushes it over UCX into a `ferry serve --device cuda:0`
receiver, another process on the same GPU, by cuda_ipc (UCX maps the receiver's GPU memory) and
by tcp with CUDA memory on both sides; every version is verified (ferry's commit checks the
fingerprints of every tensor against the trainer's) and equal, on the receiver, to the next push
of the same values (bench/sharded_push.py with one sender). Skipped without a GPU or without a
UCX plugin that moves CUDA memory (Debian's UCX has no CUDA)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _ucx_moves_cuda(ferry_executable):
    listing = subprocess.run([ferry_executable, "plugins"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=120).stdout
    for line in listing.splitlines():
        words = line.split()
        if words[:2] == ["ucx", "transport"]:
            return "cuda" in words[5].split(",")
    return False


@pytest.mark.parametrize("tls", ["cuda_ipc,cuda_copy,tcp", "tcp,cuda_copy"],
                         ids=["cuda_ipc", "tcp"])
def test_a_16gb_model_crosses_ucx_in_gpu_memory_bit_identical(ferry_module, ferry_executable,
                                                               tls):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: UCX into GPU memory runs on a GPU machine")
    if not _ucx_moves_cuda(ferry_executable):
        pytest.skip("the UCX plugin does not move CUDA memory here (build it against a UCX with "
                    "CUDA: pip install libucx-cu13, -Ducx_dir)")
    script = Path(__file__).resolve().parents[2] / "bench" / "sharded_push.py"
    if not script.is_file():
        pytest.skip(f"{script} is not here")
    env = dict(os.environ, UCX_TLS=tls)
    done = subprocess.run([sys.executable, str(script), "--ferry", ferry_executable,
                           "--transport", "ucx", "--layers", "36", "--senders", "1",
                           "--receivers", "1", "--rounds", "1", "--no-table"],
                          stdout=subprocess.PIPE, text=True, timeout=500, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"ucx {tls}: {json.dumps({k: result.get(k) for k in ('model_bytes', 'first_push_s', 'first_transport', 'first_direct', 'd2d_s')})} "
          f"rows {json.dumps(result.get('rows'))}")
    assert result.get("ok"), result
    assert result["verified"], result["verification"]
    assert result["model_bytes"] > 16e9, result["model_bytes"]
    assert result["first_transport"] == "ucx", result
    # cuda_ipc: put straight into the receiver's parameters; tcp: buckets into its GPU slots.
    assert result["first_direct"] == (tls.startswith("cuda_ipc")), result
    (row,) = result["rows"]
    assert row["transports"] == ["ucx"], row
    assert row["moved_equals_needed"], row
