"""python/tests/test_reads_in_place.py: a trainer whose tensors are new allocations at every push,
into a `ferry serve` engine on the same GPU whose model family (lowbit: FP8 128x128 blocks on
arrival) makes its plan something other than a copy, so that it reads the trainer's tensors in
place through a kept session. Between pushes the trainer either frees its tensors and empties
torch's cache (as an offload and reload of its parameters does), so that the next ones lie at the
same addresses in other allocations, or keeps the old ones alive while it makes the next, so that
they lie elsewhere. Every push must commit through the kept session, reading in place, and equal
a staged push of the same values, and the device's free memory must not shrink from push to push
(nothing keeps the trainer's freed memory mapped). Skipped without torch, a CUDA device, or the
ferry executable.
"""

import os
import subprocess
import time
import urllib.request
import json

import pytest

STEPS = 5
# A Qwen3-shaped dense model whose weights fall on 128 x 128 blocks: ~0.5 GB of bf16.
HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTER, VOCAB, LAYERS = 2048, 128, 16, 4, 6144, 32768, 2


def _shapes():
    h = HIDDEN
    out = [("model.embed_tokens.weight", (VOCAB, h))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, h)),
                (p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, h)),
                (p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, h)),
                (p + "self_attn.o_proj.weight", (h, HEADS * HEAD_DIM)),
                (p + "self_attn.q_norm.weight", (HEAD_DIM,)),
                (p + "self_attn.k_norm.weight", (HEAD_DIM,)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (INTER, h)),
                (p + "mlp.up_proj.weight", (INTER, h)),
                (p + "mlp.down_proj.weight", (h, INTER))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]


class Serve:
    """`ferry serve --device cuda:0 --model-family lowbit` on a free port."""

    def __init__(self, exe, folder):
        self.ready = os.path.join(folder, "serve.port")
        self.log_path = os.path.join(folder, "serve.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [exe, "--log-level", "info", "serve", "--port", "0", "--ready-file", self.ready,
             "--device", "cuda:0", "--model-family", "lowbit"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (os.path.exists(self.ready) and os.path.getsize(self.ready) > 0):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.tail()
            time.sleep(0.05)
        with open(self.ready) as f:
            self.address = f"127.0.0.1:{int(f.read().strip())}"

    def fingerprints(self):
        with urllib.request.urlopen(f"http://{self.address}/get_fingerprints", timeout=60) as r:
            return json.loads(r.read())

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-3000:]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.mark.parametrize("allocations", ["same-addresses", "elsewhere"])
def test_a_trainer_with_new_tensors_every_push_is_read_in_place(ferry_module, ferry_executable,
                                                                 tmp_path, allocations):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: reads in place run on a GPU machine")
    ferry = ferry_module
    serve = Serve(ferry_executable, str(tmp_path))
    timed = ferry.Sender([serve.address], progress=False)
    staged = ferry.Sender([serve.address], progress=False, update__delivery="staged")
    try:
        kept, free, pointers = None, [], []
        version = 0
        for step in range(STEPS):
            gen = torch.Generator(device="cuda").manual_seed(step)
            state = {name: torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
                     for name, shape in _shapes()}
            pointers.append(state["model.embed_tokens.weight"].data_ptr())
            version += 1
            report = timed.push(state, version, check=False)
            r = report.receivers[0]
            assert r.committed, f"step {step}: {r.error}\n{serve.tail()}"
            assert r.reads_in_place, f"step {step}: not read in place: {r}"
            assert r.reused_session or step == 0, f"step {step}: a new session: {r}"
            pushed = serve.fingerprints()
            version += 1
            check = staged.push(state, version, check=False)
            assert check.all_committed, check.receivers[0].error
            assert serve.fingerprints()["fingerprints"] == pushed["fingerprints"], (
                f"step {step}: the version read in place differs from the staged push of the "
                "same values")
            if allocations == "elsewhere":
                kept = state  # alive while the next step allocates
            else:
                del state
                torch.cuda.synchronize()
                torch.cuda.empty_cache()  # the next allocations may land at the same addresses
            free.append(torch.cuda.mem_get_info()[0])
        if allocations == "same-addresses":
            assert len(set(pointers)) < len(pointers), (
                f"torch gave the trainer other addresses every step ({pointers}): the case of "
                "new allocations at the same addresses did not happen")
        # Whatever the engine mapped of the trainer's freed tensors is let go: the free memory
        # after the last push is within 256 MiB of that after the second.
        assert free[-1] >= free[1] - (256 << 20), (
            f"free device memory after each push: {[f >> 20 for f in free]} MiB")
        del kept
    finally:
        timed.close()
        staged.close()
        serve.close()
