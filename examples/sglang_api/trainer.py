#!/usr/bin/env python3
"""examples/sglang_api/trainer.py: a colocated trainer that drives its rollout engine through
SGLang's HTTP API only, the way verl and slime drive an SGLang server, pointed at an engine that
embeds a ferry receiver (examples/colocated/engine.py) instead: nothing in it names ferry.

Each step is one RL step as SGLang's clients make it. Rollout done, /release_memory_occupation
of the tags "kv_cache" and "weights" frees the engine's memory for training; one training step;
/resume_memory_occupation of "weights"; then the update: /pause_generation, /flush_cache,
/begin_weight_update (selector "all"), the model's state_dict in flattened buckets of
--bucket-mib through /update_weights_from_tensor with load_format "flattened_bucket" and the
step's weight_version (each bucket one uint8 tensor and its metadata, pickled with torch's
multiprocessing reductions as SGLang's MultiprocessingSerializer does: CUDA tensors travel as
IPC handles, CPU tensors as shared-memory files; base64 in the JSON), /end_weight_update (the
update is published and the engine's post-load processing runs), /continue_generation; last,
/resume_memory_occupation of "kv_cache" for the next rollout. It then checks what the engine
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
        flat = ex.flatten(torch, [t for _, t in group])
        entries, start = [], 0
        for name, tensor in group:
            nbytes = tensor.numel() * tensor.element_size()
            entries.append(meta(name=name, shape=tensor.shape, dtype=tensor.dtype,
                                start_idx=start, end_idx=start + nbytes, numel=nbytes))
            start += nbytes
        out.append((flat, entries))
    return out


def serialize(obj):
    """SGLang's MultiprocessingSerializer.serialize(obj, output_str=True)."""
    import torch.multiprocessing  # noqa: F401 - registers torch's reductions with ForkingPickler
    from multiprocessing.reduction import ForkingPickler
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return base64.b64encode(buffer.getvalue()).decode()


def memory(url, route, tags, released):
    """/release_memory_occupation or /resume_memory_occupation of `tags`; an ExampleError unless
    the answer says every tag is now as asked: the engine's own tags (engine_tags) acted on, and
    ferry's store tags (memory) `released` or not."""
    answer = ex.post(url, route, {"tags": tags})
    store = {m["tag"]: m["released"] for m in answer.get("memory", [])}
    wrong = [t for t in tags
             if not (t in answer.get("engine_tags", []) or store.get(t) == released)]
    if wrong:
        raise ex.ExampleError(f"{url}{route} {tags}: {wrong} not "
                              f"{'released' if released else 'resumed'}: {answer}")
    return answer


def update_weights(torch, url, state, label, bucket_bytes):
    """One update as slime's and miles' update_weights makes it: inside a weight-update session
    (ex.weight_update_session: generation paused, the cache flushed), every bucket through
    /update_weights_from_tensor with the step's weight_version. Returns the number of calls."""
    buckets = buckets_of(torch, state, bucket_bytes)
    with ex.weight_update_session([url]) as ended:
        for flat, entries in buckets:
            body = {"serialized_named_tensors": [serialize({"flattened_tensor": flat,
                                                            "metadata": entries})],
                    "load_format": "flattened_bucket", "flush_cache": False,
                    "weight_version": label}
            if ex.post(url, "/update_weights_from_tensor", body).get("committed"):
                raise ex.ExampleError(f"{url}: a bucket was committed inside the weight-update "
                                      "session, before /end_weight_update")
    if ended[0].get("num_updates") != 1 or ended[0].get("weight_version") != label:
        raise ex.ExampleError(f"{url}/end_weight_update: expected one update publishing "
                              f"{label!r}, the engine answered {ended[0]}")
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
        # Rollout is done: the engine's memory goes to the trainer (verl's and slime's release).
        memory(url, "/release_memory_occupation", ["kv_cache", "weights"], True)
        print(f"step {step}: released kv_cache and weights for training", flush=True)
        loss = ex.train_step(torch, model, optimizer, step)
        label = f"rl-step-{step}"
        memory(url, "/resume_memory_occupation", ["weights"], False)
        t0 = time.perf_counter()
        # Right after optimizer.step(), no synchronize: torch's reductions record an event on
        # the current stream that the engine waits for before it reads a CUDA bucket.
        calls = update_weights(torch, url, model.state_dict(), label, bucket_bytes)
        wall = time.perf_counter() - t0
        memory(url, "/resume_memory_occupation", ["kv_cache"], False)
        served = ex.weight_version(url)[0]
        if served != label:
            raise ex.ExampleError(f"step {step}: the engine serves weight_version {served!r}, "
                                  f"not {label!r}")
        print(f"step {step}: loss {loss:.4f}, {calls} update_weights_from_tensor calls in one "
              f"weight-update session, weight_version {label} in {wall:.3f} s", flush=True)
        ex.require_arrived(args.engine, url, model.state_dict(), step)
        ex.require_same_tokens(torch, control_url, model, prompt, label, step)
        print(f"  the engine serves {label}: values read back and its greedy tokens match the "
              "trainer's", flush=True)
    ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
