"""python/tests/torch_group_trainer.py: an unmodified torch trainer of a disaggregated RL loop,
written the way SGLang's clients (verl, slime, OpenRLHF) drive /init_weights_update_group and
/update_weights_from_distributed: rank 0 of a torch.distributed group it creates itself
(rendezvous at tcp://address:port, SGLang's init_custom_process_group: a group-name PrefixStore
and torch's process-group helper), the engine's join posted from a thread while the trainer
creates the group, then per step the update request posted from a thread while the trainer
broadcasts: one `torch.distributed.broadcast` per tensor in the request's order, or with
load_format "flattened_bucket" one of SGLang's FlattenedTensorBucket. Nothing here knows ferry.

Prints one JSON line: per step the HTTP answer and the bytes of every tensor it sent.

usage: torch_group_trainer.py SPEC_JSON
SPEC: {"engine": "host:port" (null: post nothing, the test posts), "port": int, "group": str,
       "world_size": int, "backend": "gloo", "shapes": {name: [dims]}, "dtype": str,
       "steps": int, "load_format": null|"flattened_bucket", "seed": int, "sglang_dir": path,
       "device": "cpu"|"cuda" (where the trainer's tensors live; gloo stages CUDA ones),
       "die_after": int (exit abruptly after that many broadcasts of the first step),
       "post_updates": bool (default true; false: the test posts them), "destroy": bool,
       "linger": seconds to stay in the group after the steps, silent}
"""

import datetime
import http.client
import json
import os
import sys
import threading
import urllib.error
import urllib.request


def post(engine, path, body, answers):
    req = urllib.request.Request(f"http://{engine}{path}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            answers.append([r.status, json.loads(r.read() or b"{}")])
    except urllib.error.HTTPError as e:
        answers.append([e.code, json.loads(e.read() or b"{}")])


def in_thread(engine, path, body):
    answers = []
    t = threading.Thread(target=post, args=(engine, path, body, answers))
    t.start()
    return t, answers


def send_now(engine, path, body):
    """Sends the request at once and returns a function that reads the answer: what an async
    client does. torch 1.x holds the GIL while its TCPStore waits for the group's ranks, so a
    thread could not send the engine's join until that wait timed out."""
    host, port = engine.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})

    def answer():
        r = conn.getresponse()
        return [r.status, json.loads(r.read() or b"{}")]
    return answer


def init_custom_process_group(backend, init_method, world_size, rank, group_name, timeout):
    # What SGLang's engine and its trainers run to make a group outside the default one.
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper,
                                                    rendezvous)
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg = _new_process_group_helper(world_size, rank, [], Backend(backend), store,
                                   group_name=group_name, timeout=timeout)
    if isinstance(pg, tuple):  # torch 2.x returns (group, its store)
        pg = pg[0]
    ranks = c10d._world.pg_group_ranks if hasattr(c10d, "_world") else c10d._pg_group_ranks
    ranks[pg] = {i: i for i in range(world_size)}
    return pg


def main():
    spec = json.loads(sys.argv[1])
    if spec.get("sglang_dir"):
        sys.path.insert(0, spec["sglang_dir"])
    import torch
    import torch.distributed as dist
    torch.manual_seed(spec.get("seed", 1))
    dtype = getattr(torch, spec.get("dtype", "float32"))
    engine, group = spec.get("engine"), spec.get("group", "weight_update_group")
    names = list(spec["shapes"])

    joined = None
    if engine:
        joined = send_now(engine, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": spec["port"], "rank_offset": 1,
            "world_size": spec["world_size"], "group_name": group,
            "backend": spec.get("backend", "gloo")})
    pg = init_custom_process_group(spec.get("backend", "gloo"),
                                   f"tcp://127.0.0.1:{spec['port']}", spec["world_size"], 0,
                                   group, datetime.timedelta(seconds=60))
    report = {"init": None, "steps": []}
    if joined:
        report["init"] = joined()

    sent = 0
    for step in range(spec.get("steps", 1)):
        tensors = {n: (torch.randn(shape) * 10).to(dtype).to(spec.get("device", "cpu"))
                   for n, shape in spec["shapes"].items()}
        update = None
        if engine and spec.get("post_updates", True):
            update = in_thread(engine, "/update_weights_from_distributed", {
                "names": names, "dtypes": [str(tensors[n].dtype).split(".")[-1] for n in names],
                "shapes": [list(tensors[n].shape) for n in names], "group_name": group,
                "load_format": spec.get("load_format"), "weight_version": f"step-{step}",
                "flush_cache": True})
        if spec.get("load_format") == "flattened_bucket":
            from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
            bucket = FlattenedTensorBucket(named_tensors=[(n, tensors[n]) for n in names])
            dist.broadcast(bucket.get_flattened_tensor(), src=0, group=pg)
        else:
            for n in names:
                if spec.get("die_after") is not None and sent == spec["die_after"]:
                    sys.stdout.flush()
                    os._exit(3)  # the trainer dies in the middle of an update
                dist.broadcast(tensors[n], src=0, group=pg)
                sent += 1
        answer = None
        if update:
            update[0].join()
            answer = update[1][0]
        report["steps"].append({
            "answer": answer,
            "dump": {n: t.cpu().contiguous().view(torch.uint8).flatten().tolist()
                     for n, t in tensors.items()}})
    if spec.get("linger"):
        import time
        time.sleep(spec["linger"])  # joined and silent, until killed
    if spec.get("destroy") and engine:
        destroyed = []
        post(engine, "/destroy_weights_update_group", {"group_name": group}, destroyed)
        report["destroy"] = destroyed[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
