#!/usr/bin/env python3
"""examples/sglang_api/trainer.py: a colocated trainer that drives its rollout engine through
SGLang's HTTP API only, the way verl and slime drive an SGLang server, pointed at an engine that
embeds a ferry receiver (examples/colocated/engine.py) instead: nothing in it names ferry.

Each step: one training step, then /pause_generation, the model's state_dict in flattened
buckets of --bucket-mib (each bucket one uint8 tensor and its metadata, pickled with torch's
multiprocessing reductions as SGLang's MultiprocessingSerializer does: CUDA tensors travel as
IPC handles, CPU tensors as shared-memory files; base64 in the JSON) through
/update_weights_from_tensor with load_format "flattened_bucket", the last call with the step's
weight_version and flush_cache, then /continue_generation. It then checks what the engine
serves: /get_weight_version, values read back with /get_weights_by_name, and the greedy tokens
of the engine's own /generate (on its control server) against the trainer's model.

    python3 examples/colocated/engine.py --device cuda:0 --port 30000 --control-port 30001
    python3 examples/sglang_api/trainer.py --engine 127.0.0.1:30000 \\
        --engine-control 127.0.0.1:30001 --device cuda:0 --steps 5
"""

import base64
import dataclasses
import io
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]
# Where SGLang defines the bucket metadata; a pickle names the class by this path.
METADATA_MODULE = "sglang.srt.weight_sync.tensor_bucket"


def metadata_class():
    """SGLang's FlattenedTensorMetadata when SGLang is installed; otherwise a dataclass with its
    fields, registered under SGLang's module path so that the pickle is the one SGLang makes."""
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata
        return FlattenedTensorMetadata
    except ImportError:
        pass

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: object
        dtype: object
        start_idx: int
        end_idx: int
        numel: int

    FlattenedTensorMetadata.__module__ = METADATA_MODULE
    FlattenedTensorMetadata.__qualname__ = "FlattenedTensorMetadata"
    prefix = ""
    for part in METADATA_MODULE.split("."):
        prefix = f"{prefix}.{part}" if prefix else part
        sys.modules.setdefault(prefix, types.ModuleType(prefix))
    sys.modules[METADATA_MODULE].FlattenedTensorMetadata = FlattenedTensorMetadata
    return FlattenedTensorMetadata


def buckets_of(torch, state, limit):
    """[(flattened uint8 tensor, [metadata])] in state_dict order, each at most `limit` bytes
    (a larger tensor alone), as verl's and slime's bucketing makes them."""
    meta = metadata_class()
    groups, current, size = [], [], 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            groups.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        groups.append(current)
    out = []
    for group in groups:
        flats = [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in group]
        entries, start = [], 0
        for (name, tensor), flat in zip(group, flats):
            entries.append(meta(name=name, shape=tensor.shape, dtype=tensor.dtype,
                                start_idx=start, end_idx=start + flat.numel(),
                                numel=flat.numel()))
            start += flat.numel()
        out.append((torch.cat(flats), entries))
    return out


def serialize(obj):
    """SGLang's MultiprocessingSerializer.serialize(obj, output_str=True)."""
    import torch.multiprocessing  # noqa: F401 - registers torch's reductions with ForkingPickler
    from multiprocessing.reduction import ForkingPickler
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return base64.b64encode(buffer.getvalue()).decode()


def call(url, route, body=None):
    status, answer = ex.http_json(f"{url}{route}", body if body is not None else {})
    if status != 200 or answer.get("success") is False:
        raise ex.ExampleError(f"{url}{route} answered {status}: {answer.get('message')}")
    return answer


def update_weights(torch, url, state, label, bucket_bytes):
    """One update: every bucket through /update_weights_from_tensor, the last one with the
    weight_version. Returns the number of calls."""
    buckets = buckets_of(torch, state, bucket_bytes)
    for i, (flat, entries) in enumerate(buckets):
        last = i == len(buckets) - 1
        body = {"serialized_named_tensors": [serialize({"flattened_tensor": flat,
                                                        "metadata": entries})],
                "load_format": "flattened_bucket", "flush_cache": last}
        if last:
            body["weight_version"] = label
        call(url, "/update_weights_from_tensor", body)
    return len(buckets)


def main():
    parser = ex.argument_parser(__doc__)
    parser.add_argument("--engine", required=True,
                        help="HOST:PORT of the engine's SGLang-compatible API (its --port)")
    parser.add_argument("--engine-control", required=True,
                        help="HOST:PORT of the engine's own control server, for /generate")
    parser.add_argument("--bucket-mib", type=float, default=1.0,
                        help="flattened bucket size in MiB (1; verl and slime use 512 and more "
                             "on real models)")
    ex.add_trainer_arguments(parser, device="cuda:0", token=False)
    args = parser.parse_args()

    torch = ex.import_torch()
    # CPU tensors travel as shared-memory files, which the engine maps; torch's default for CPU
    # tensors (file descriptors) only works between a parent and its children.
    torch.multiprocessing.set_sharing_strategy("file_system")
    device = ex.torch_device(torch, args.device)
    model = ex.build_model(torch, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    url = ex.base_url(args.engine)
    control_url = ex.base_url(args.engine_control)
    prompt = [t % args.vocab for t in PROMPT]
    bucket_bytes = max(1, int(args.bucket_mib * (1 << 20)))

    for step in range(1, args.steps + 1):
        loss = ex.train_step(torch, model, optimizer, step)
        label = f"rl-step-{step}"
        t0 = time.perf_counter()
        call(url, "/pause_generation", {"mode": "abort"})
        # Right after optimizer.step(), no synchronize: torch's reductions record an event on
        # the current stream that the engine waits for before it reads a CUDA bucket.
        calls = update_weights(torch, url, model.state_dict(), label, bucket_bytes)
        call(url, "/continue_generation", {})
        wall = time.perf_counter() - t0
        served = ex.weight_version(url)[0]
        if served != label:
            raise ex.ExampleError(f"step {step}: the engine serves weight_version {served!r}, "
                                  f"not {label!r}")
        print(f"step {step}: loss {loss:.4f}, {calls} update_weights_from_tensor calls, "
              f"weight_version {label} in {wall:.3f} s", flush=True)
        ex.require_arrived(args.engine, url, model.state_dict(), step)
        ex.require_same_tokens(torch, control_url, model, prompt, label, step)
        print(f"  the engine serves {label}: values read back and its greedy tokens match the "
              "trainer's", flush=True)
    if args.save:
        ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
