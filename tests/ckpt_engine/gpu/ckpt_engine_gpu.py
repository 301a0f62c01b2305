"""tests/ckpt_engine/gpu/ckpt_engine_gpu.py: a real checkpoint-engine ParameterServer (world size
1) updates a `ferry serve --device cuda:0` receiver in another process through
POST /update_weights_from_ipc; the weights are verified bit-identical (ferry's fingerprints after
the IPC update equal its fingerprints after loading the same checkpoint from disk, and values read
back equal the checkpoint's). Then the same ParameterServer updates checkpoint-engine's own worker
(checkpoint_engine.worker.update_weights_from_ipc, the loop its vLLM extension runs, loading by
param.copy_()) in a child process, for the time comparison. Also saves a real reduce_tensor()
pickle of a CUDA buffer (a fixture for the CPU tests).

Usage: python ckpt_engine_gpu.py BUNDLE OUT [GiB]   (BUNDLE: scripts/bundle output)
"""

import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

BUNDLE, OUT = sys.argv[1], sys.argv[2]
GIB = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
os.makedirs(OUT, exist_ok=True)
WORK = tempfile.mkdtemp(prefix="ckpt-gpu-")
RESULT = {"gib": GIB, "torch": torch.__version__, "python": sys.version.split()[0]}

DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_checkpoint(seed):
    """~GIB GiB: bf16 matrices plus a few f32/f16 tensors (odd sizes, so 256-byte padding shows)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    n = max(1, int(GIB * 8))  # 128 MiB each
    for i in range(n):
        out[f"model.layers.{i}.mlp.down_proj.weight"] = torch.randn(
            4096, 16384, generator=g).to(torch.bfloat16)
        out[f"model.layers.{i}.input_layernorm.weight"] = torch.randn(4099, generator=g)
    out["model.norm.weight"] = torch.randn(333, generator=g).to(torch.float16)
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        c = t.contiguous()
        b = (c.view(torch.int16) if t.dtype == torch.bfloat16 else c).numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as r:
        return json.loads(r.read())


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- a real reduce_tensor() pickle (fixture) ----------------------------------------------
from torch.multiprocessing.reductions import reduce_tensor  # noqa: E402

torch.cuda.set_device(0)
fixture_buf = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
with open(os.path.join(OUT, "ipc_handle_real.pickle"), "wb") as f:
    f.write(pickle.dumps(reduce_tensor(fixture_buf), protocol=4))
del fixture_buf

# ---- checkpoints: v0 on disk (the receiver's first load), v1 in the ParameterServer ------------
t = time.time()
v0, v1 = make_checkpoint(0), make_checkpoint(1)
write_safetensors(os.path.join(WORK, "v0", "model.safetensors"), v0)
write_safetensors(os.path.join(WORK, "v1", "model.safetensors"), v1)
total = sum(x.numel() * x.element_size() for x in v1.values())
RESULT["checkpoint_bytes"] = total
RESULT["tensors"] = len(v1)
log(f"checkpoints: {len(v1)} tensors, {total / 2**30:.2f} GiB each, {time.time() - t:.1f} s")

# ---- ferry serve on cuda:0 --------------------------------------------------------------
ready = os.path.join(WORK, "ready")
ferry_log = open(os.path.join(OUT, "ferry_serve.log"), "w")
serve = subprocess.Popen([os.path.join(BUNDLE, "bin", "ferry"), "serve", "--device", "cuda:0",
                          "--model-family", "identity", "--model-path", os.path.join(WORK, "v0"),
                          "--port", "0", "--ready-file", ready],
                         stdout=ferry_log, stderr=subprocess.STDOUT)
deadline = time.time() + 120
while not os.path.exists(ready) or not open(ready).read().strip():
    if serve.poll() is not None or time.time() > deadline:
        ferry_log.flush()
        print(open(os.path.join(OUT, "ferry_serve.log")).read())
        raise SystemExit("ferry serve did not come up")
    time.sleep(0.1)
port = int(open(ready).read())
log(f"ferry serve ready on port {port}")

# ---- the ParameterServer (world size 1) ----------------------------------------------------
os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port()),
                   "PS_MAX_BUCKET_SIZE_GB": os.environ.get("PS_MAX_BUCKET_SIZE_GB", "0.5")})
from checkpoint_engine.ps import ParameterServer  # noqa: E402

ps = ParameterServer(auto_pg=True)
t = time.time()
ps.register_checkpoint("v1", named_tensors=v1)
ps.gather_metas("v1")
log(f"ParameterServer: v1 registered in {time.time() - t:.1f} s")

answers = {}


def ferry_req(socket_paths):
    log(f"req_func: socket_paths {socket_paths}")
    status, body = post(port, "/update_weights_from_ipc",
                        {"zmq_handles": dict(socket_paths), "weight_version": "ckpt-v1",
                         "flush_cache": True})
    answers["ferry"] = (status, body)
    log(f"/update_weights_from_ipc -> {status} {body}")


runs = []
for attempt in range(2):  # twice: the second run reuses nothing but must work the same
    t = time.time()
    ps.update("v1", ferry_req)
    runs.append(time.time() - t)
    status, body = answers["ferry"]
    assert status == 200, (status, body)
RESULT["ferry_update_s"] = runs
RESULT["ferry_report"] = answers["ferry"][1]
log(f"ps.update into ferry: {runs} s")

# ---- verification: bit-identical ---------------------------------------------------------------
fp_ipc = get(port, "/get_fingerprints")
assert fp_ipc["weight_version"] == "ckpt-v1", fp_ipc["weight_version"]
for name in ["model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
             "model.norm.weight"]:
    status, w = post(port, "/get_weights_by_name", {"name": name, "truncate_size": 64})
    assert status == 200, w
    expect = v1[name].flatten()[:64].float().tolist()
    assert w["values"] == expect, (name, w["values"][:4], expect[:4])
fp_v0 = None
status, body = post(port, "/update_weights_from_disk",
                    {"model_path": os.path.join(WORK, "v0"), "weight_version": "disk-v0"})
assert status == 200, body
fp_v0 = get(port, "/get_fingerprints")
status, body = post(port, "/update_weights_from_disk",
                    {"model_path": os.path.join(WORK, "v1"), "weight_version": "disk-v1"})
assert status == 200, body
fp_disk = get(port, "/get_fingerprints")
assert fp_ipc["fingerprints"] == fp_disk["fingerprints"], "IPC and disk fingerprints differ"
assert fp_v0["fingerprints"] != fp_disk["fingerprints"], "v0 and v1 must differ"
RESULT["bit_identical"] = True
RESULT["fingerprint_sample"] = dict(list(fp_ipc["fingerprints"].items())[:3])
RESULT["disk_update_s"] = body.get("seconds")
log("verified: fingerprints after the IPC update == after loading v1 from disk; values match")

serve.terminate()
serve.wait(timeout=30)

# ---- checkpoint-engine's own worker path, same ParameterServer --------------------------------
WORKER = r'''
import sys, time, json, torch, zmq
from checkpoint_engine.worker import update_weights_from_ipc
torch.cuda.set_device(0)
names = json.loads(sys.argv[1])
params = {n: torch.empty(tuple(s), dtype=getattr(torch, d), device="cuda") for n, (s, d) in names.items()}
print("READY", flush=True)
handle = sys.stdin.readline().strip()
t = time.time()
def run(weights):
    for name, w in weights:
        params[name].copy_(w)   # what vLLM's load_weights does for an unsharded parameter
update_weights_from_ipc(zmq.Context(), handle, 0, run=run, post_hook=None)
torch.cuda.synchronize()
sums = {n: int(p.view(torch.uint8).sum(dtype=torch.int64).item()) for n, p in params.items()}
print("DONE", time.time() - t, json.dumps(sums), flush=True)
'''
names = {n: (list(x.shape), str(x.dtype).replace("torch.", "")) for n, x in v1.items()}
ce_runs = []
for attempt in range(2):
    child = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(names)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "READY"

    def ce_req(socket_paths):
        child.stdin.write(dict(socket_paths)[ps._device_uuid] + "\n")
        child.stdin.flush()

    t = time.time()
    ps.update("v1", ce_req)
    ce_runs.append(time.time() - t)
    line = child.stdout.readline().split(" ", 2)
    child.wait(timeout=60)
    sums = json.loads(line[2])
    for n, x in v1.items():
        assert sums[n] == int(x.contiguous().view(torch.uint8).sum(dtype=torch.int64)), n
RESULT["checkpoint_engine_worker_update_s"] = ce_runs
log(f"ps.update into checkpoint-engine's own worker: {ce_runs} s (byte sums verified)")

with open(os.path.join(OUT, "result.json"), "w") as f:
    json.dump(RESULT, f, indent=1)
print(json.dumps(RESULT, indent=1))
