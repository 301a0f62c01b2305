"""python/tests/tensor_trainer.py: a trainer process that drives /update_weights_from_tensor the
way SGLang's clients do (slime, verl): its tensors serialized by torch's ForkingPickler (what
SGLang's MultiprocessingSerializer runs), base64 over HTTP, one entry per TP rank; load_format
"direct" (a list of (name, tensor)) or "flattened_bucket" (SGLang's FlattenedTensorBucket: the
tensors' bytes in one uint8 tensor plus FlattenedTensorMetadata). The tensors stay alive until
every answer arrived. Prints one JSON line: the answers. A test runs it through run().

usage: tensor_trainer.py URL SPEC_JSON
SPEC: {"device": "cpu"|"cuda", "strategy": "file_system"|"file_descriptor", "seed": int,
       "shapes": {name: [dims]}, "dtype": "float32"|..., "load_format": null|"direct"|
       "flattened_bucket", "calls": [[names...], ...], "fields": {...}, "sglang_dir": path}
"""

import base64
import io
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path


def run(address, spec):
    """Runs this trainer in a process of its own against the receiver at `address` (host:port),
    with this interpreter's import path, and returns what it printed ({"answers", "dump"})."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), f"http://{address}",
                          json.dumps(spec)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if out.returncode != 0:
        raise RuntimeError(f"tensor_trainer.py exited with {out.returncode}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    url, spec = sys.argv[1], json.loads(sys.argv[2])
    if spec.get("sglang_dir"):
        sys.path.insert(0, spec["sglang_dir"])
    import torch
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
    mp.set_sharing_strategy(spec.get("strategy", "file_system"))
    torch.manual_seed(spec["seed"])
    dtype = getattr(torch, spec.get("dtype", "float32"))
    tensors = {name: (torch.randn(shape) * 10).to(dtype).to(spec.get("device", "cpu"))
               for name, shape in spec["shapes"].items()}
    if spec.get("device") == "cuda":
        torch.cuda.synchronize()

    def serialize(obj):
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        return base64.b64encode(buf.getvalue()).decode()

    keep, answers = [], []
    for names in spec["calls"]:
        named = [(n, tensors[n]) for n in names]
        if spec.get("load_format") == "flattened_bucket":
            from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
            bucket = FlattenedTensorBucket(named_tensors=named)
            payload = {"flattened_tensor": bucket.get_flattened_tensor(),
                       "metadata": bucket.get_metadata()}
        else:
            payload = named
        keep.append(payload)
        body = {"serialized_named_tensors": [serialize(payload)],
                "load_format": spec.get("load_format"), **spec.get("fields", {})}
        req = urllib.request.Request(url + "/update_weights_from_tensor",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                answers.append([r.status, json.loads(r.read())])
        except urllib.error.HTTPError as e:
            answers.append([e.code, json.loads(e.read() or b"{}")])
    # What the receiver should now hold, for the test to compare bit for bit.
    dump = {n: t.cpu().contiguous().view(torch.uint8).flatten().tolist() if t.numel() else []
            for n, t in tensors.items()} if spec.get("dump") else None
    print(json.dumps({"answers": answers, "dump": dump}))


if __name__ == "__main__":
    main()
