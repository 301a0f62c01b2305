#!/usr/bin/env python3
"""examples/nccl/trainer.py: the trainer of the disaggregated form, NCCL rank 0 on --device:
creates a weight-update group with every engine (examples/nccl/engine.py, `ferry serve
--device cuda:N` on other GPUs or nodes), then after every optimizer step posts the update's
request to each engine's /update_weights_from_distributed while ferry.NcclGroup broadcasts
model.state_dict(); checks that every engine committed the step and holds the trainer's values;
destroys the group at the end. Needs one GPU per rank: two or more in all.

    NCCL_NVLS_ENABLE=0 python3 examples/nccl/trainer.py --device cuda:0 \\
        --engines 127.0.0.1:30000 --master-address 127.0.0.1 --master-port 29500 --steps 5
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402

GROUP = "ferry_example"


def post_all(pool, urls, route, body_of, token):
    """POSTs to every engine at once (each call blocks until rank 0 did its part)."""
    return [pool.submit(ex.http_json, f"{url}{route}", body_of(i), token, 600)
            for i, url in enumerate(urls)]


def answers(futures, urls, what):
    """The engines' answers; an ExampleError naming every engine that did not answer 200."""
    failed = []
    out = []
    for url, future in zip(urls, futures):
        try:
            status, answer = future.result()
        except ex.ExampleError as e:
            status, answer = None, {"message": str(e)}
        out.append(answer)
        if status != 200:
            failed.append(f"{url}: {status} {answer.get('message')}")
    if failed:
        raise ex.ExampleError(f"{what}: " + "; ".join(failed))
    return out


def main():
    parser = ex.argument_parser(__doc__)
    ex.add_engines_argument(parser)
    ex.add_group_arguments(parser)
    parser.add_argument("--bucket-mb", type=ex.positive_int, default=256,
                        help="broadcast bucket size in MiB (256)")
    ex.add_trainer_arguments(parser, device="cuda:0")
    args = parser.parse_args()
    engines = ex.engines_of(parser, args)
    if os.environ.get("NCCL_NVLS_ENABLE", "0") != "0":
        print("trainer: NCCL_NVLS_ENABLE overridden: the group runs with NCCL_NVLS_ENABLE=0",
              file=sys.stderr)
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # read by NCCL when the group is created

    torch = ex.import_torch()
    ferry = ex.import_ferry()
    device = ex.torch_device(torch, args.device)
    if device.type != "cuda":
        raise ex.ExampleError(f"--device {args.device}: NCCL rank 0 needs a GPU (cuda:N)")
    urls = [ex.base_url(e) for e in engines]
    for url in urls:  # fail now, not after the group's init timeout
        ex.weight_version(url, args.token)
    model = ex.build_model(torch, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    world = len(engines) + 1

    with ThreadPoolExecutor(max_workers=len(engines)) as pool:
        # Every engine's init blocks until rank 0 created the group: start them first.
        joining = post_all(pool, urls, "/init_weights_update_group", lambda i: {
            "master_address": args.master_address, "master_port": args.master_port,
            "rank_offset": i + 1, "world_size": world, "group_name": GROUP,
            "backend": "nccl", "timeout_s": args.timeout}, args.token)
        try:
            group = ferry.NcclGroup(args.master_address, args.master_port, world,
                                    group_name=GROUP, device=device.index,
                                    bucket_bytes=args.bucket_mb << 20,
                                    init_timeout=args.timeout, bucket_timeout=args.timeout)
        except ferry.Error as e:
            # An engine that refused to join is why rank 0 waited in vain: name it.
            refused = [f"{url}: {f.result()[0]} {f.result()[1].get('message')}"
                       for url, f in zip(urls, joining)
                       if f.done() and not f.exception() and f.result()[0] != 200]
            raise ex.ExampleError(f"creating the group as rank 0 of {world}: {e}"
                                  + "".join(f"; {r}" for r in refused)) from None
        with group:
            answers(joining, urls, "joining the group")
            print(f"group {GROUP!r}: rank 0 on {device}, {len(engines)} engine(s) joined",
                  flush=True)
            for step in range(1, args.steps + 1):
                loss = ex.train_step(torch, model, optimizer, step)
                label = f"step-{step}"
                state = model.state_dict()
                body = group.update_request(state, weight_version=label)
                receiving = post_all(pool, urls, "/update_weights_from_distributed",
                                     lambda i: body, args.token)
                try:
                    sent, seconds = group.broadcast(state)
                except ferry.Error as e:
                    try:  # the engines' answers name the rank that failed
                        answers(receiving, urls, "the engines")
                        theirs = ""
                    except ex.ExampleError as engines_said:
                        theirs = f"; {engines_said}"
                    raise ex.ExampleError(f"step {step}: broadcast failed: {e}{theirs} "
                                          "(every rank aborted: run again for a new group)") \
                        from None
                answers(receiving, urls, f"step {step}")
                print(f"step {step}: loss {loss:.4f}, broadcast {sent / 1e6:.2f} MB in "
                      f"{seconds:.3f} s; every engine committed {label}", flush=True)
                for engine, url in zip(engines, urls):
                    ex.require_arrived(engine, url, state, step, args.token)
            leaving = post_all(pool, urls, "/destroy_weights_update_group",
                               lambda i: {"group_name": GROUP, "timeout_s": 30}, args.token)
            how = group.destroy(timeout=30)
            answers(leaving, urls, "destroying the group")
            print(f"group {GROUP!r} destroyed: {how}", flush=True)
    ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
