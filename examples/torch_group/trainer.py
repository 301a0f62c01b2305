#!/usr/bin/env python3
"""examples/torch_group/trainer.py: the trainer of a disaggregated RL loop written the way verl
and slime drive SGLang's distributed update, pointed at `ferry serve` engines instead: nothing
in it names ferry. It creates a torch.distributed gloo group itself, as rank 0 (SGLang's
init_custom_process_group, which those frameworks copy: a TCPStore at
tcp://MASTER_ADDRESS:MASTER_PORT, world size 1 + engines), while every engine joins it as rank
i + 1 through /init_weights_update_group (backend "gloo").

Each step: one training step, then on every engine /pause_generation, /flush_cache and
/begin_weight_update; /update_weights_from_distributed with the state_dict's names, dtypes and
shapes and the step's weight_version, posted while the trainer broadcasts the tensors: one
flattened bucket (load_format "flattened_bucket", SGLang's FlattenedTensorBucket: every
tensor's bytes one after the other), or with --load-format per_tensor one broadcast per tensor;
then /end_weight_update and /continue_generation. It then checks what every engine serves:
/get_weight_version and values read back with /get_weights_by_name. At the end
/destroy_weights_update_group.

    ferry serve --host 0.0.0.0 --port 30000 --model-family identity
    python3 examples/torch_group/trainer.py --engines 127.0.0.1:30000 \\
        --master-address 127.0.0.1 --master-port 29500 --steps 5
"""

import datetime
import http.client
import json
import select
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402

GROUP = "weight_update_group"  # SGLang's default group name


class PendingPost:
    """A POST sent at once, its answer read later: what an asynchronous client (slime's ray
    calls) does before it joins the broadcast the request waits for. A thread would not do for
    the join on torch 1.x, whose TCPStore holds the GIL while it waits for the group's ranks."""

    def __init__(self, url, route, body, timeout):
        self.where = f"{url}{route}"
        self.reply = None  # (status, answer) once read
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            self.connection.request("POST", route, body=json.dumps(body),
                                    headers={"Content-Type": "application/json"})
        except OSError as e:
            raise ex.ExampleError(f"{self.where}: {e} (is the engine running there?)") from None

    def answered_within(self, seconds):
        """Whether the answer has arrived (an engine that refused answers at once)."""
        return self.reply is not None or bool(
            select.select([self.connection.sock], [], [], seconds)[0])

    def answer(self):
        """The answer; an ExampleError naming the engine unless it is 200 with success."""
        if self.reply is None:
            try:
                response = self.connection.getresponse()
                self.reply = response.status, json.loads(response.read() or b"{}")
            except OSError as e:
                raise ex.ExampleError(f"{self.where}: {e}") from None
        status, answer = self.reply
        if status != 200 or answer.get("success") is False:
            raise ex.ExampleError(f"{self.where} answered {status}: {answer.get('message')}")
        return answer


def refusals(pending):
    """The messages of the posts already answered with a failure."""
    out = []
    for p in pending:
        try:
            if p.answered_within(0):
                p.answer()
        except ex.ExampleError as e:
            out.append(str(e))
    return out


def init_custom_process_group(init_method, world_size, rank, group_name, timeout):
    """SGLang's init_custom_process_group for gloo: a group outside torch's default one, its
    store keys under `group_name` (what an engine joining the group expects)."""
    from torch.distributed import distributed_c10d as c10d
    store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size,
                                                   timeout=timeout))
    store.set_timeout(timeout)
    group = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend("gloo"),
                                           c10d.PrefixStore(group_name, store),
                                           group_name=group_name, timeout=timeout)
    group = group[0] if isinstance(group, tuple) else group  # torch 2.x: (group, its store)
    world = c10d._world.pg_group_ranks if hasattr(c10d, "_world") else c10d._pg_group_ranks
    world[group] = {i: i for i in range(world_size)}
    return group


def create_group(urls, args, timeout):
    """Rank 0 of a gloo group with every engine: their joins are posted first (each blocks
    until the group forms), an engine that refuses at once is named before the trainer waits
    for it; returns the process group."""
    world = len(urls) + 1
    joining = [PendingPost(url, "/init_weights_update_group", {
        "master_address": args.master_address, "master_port": args.master_port,
        "rank_offset": i + 1, "world_size": world, "group_name": GROUP, "backend": "gloo"},
        args.timeout) for i, url in enumerate(urls)]
    for pending in joining:
        if pending.answered_within(0.5):
            pending.answer()  # an answer before the group exists is a refusal: raises
    try:
        group = init_custom_process_group(f"tcp://{args.master_address}:{args.master_port}",
                                          world, 0, GROUP, timeout)
    except (RuntimeError, ValueError) as e:  # torch's rendezvous timed out or failed
        raise ex.ExampleError("; ".join([f"creating the group as rank 0 of {world}: {e}",
                                         *refusals(joining)])) from None
    for pending in joining:
        pending.answer()
    return group


def broadcast(torch, tensors, group, receiving):
    """Broadcasts the tensors in order while watching the engines' answers: one that answers
    while the broadcast runs and is not 200 refused the update (the answer says why), and is
    named at once rather than after the trainer's send times out."""
    works = [torch.distributed.broadcast(t, src=0, group=group, async_op=True) for t in tensors]
    watching = {p.connection.sock: p for p in receiving}
    while watching and not all(w.is_completed() for w in works):
        for sock in select.select(list(watching), [], [], 0.01)[0]:
            watching.pop(sock).answer()  # raises unless the engine took the update
    try:
        for w in works:
            w.wait()
    except RuntimeError as e:  # a peer's connection closed, or the send timed out
        raise ex.ExampleError("; ".join([f"broadcast failed: {e}", *refusals(receiving)])) \
            from None


def leave(urls, quietly=False):
    """/destroy_weights_update_group on every engine; their answers' teardown."""
    out = []
    for url in urls:
        try:
            out.append(ex.post(url, "/destroy_weights_update_group", {"group_name": GROUP}))
        except ex.ExampleError:
            if not quietly:
                raise
    return out


def update_weights(torch, urls, group, state, label, args):
    """One update of every engine as SGLang's RL clients make it: inside a weight-update session
    (ex.weight_update_session: generation paused, the cache flushed), the request posted to
    every engine while the tensors are broadcast. Returns the bytes broadcast."""
    names = list(state)
    request = {"names": names, "dtypes": [str(state[n].dtype).split(".")[-1] for n in names],
               "shapes": [list(state[n].shape) for n in names], "group_name": GROUP,
               "weight_version": label, "flush_cache": False,
               "load_format": None if args.load_format == "per_tensor" else "flattened_bucket"}
    with ex.weight_update_session(urls):
        receiving = [PendingPost(url, "/update_weights_from_distributed", request, args.timeout)
                     for url in urls]
        try:
            broadcast(torch, [state[n] for n in names] if args.load_format == "per_tensor"
                      else [ex.flatten(torch, state.values())], group, receiving)
        except ex.ExampleError as e:
            # torch cannot cancel a broadcast: the engines leave the group, so that the sends
            # still waiting for them fail now, not at their timeout.
            leave(urls, quietly=True)
            raise ex.ExampleError(f"{e} (the group was left: run again for a new one)") \
                from None
        for pending in receiving:
            answer = pending.answer()
            if answer.get("weight_version") != label:
                raise ex.ExampleError(f"{pending.where}: published "
                                      f"{answer.get('weight_version')!r}, not {label!r}")
    return sum(t.numel() * t.element_size() for t in state.values())


def main():
    parser = ex.argument_parser(__doc__)
    ex.add_engines_argument(parser)
    ex.add_group_arguments(parser)
    parser.add_argument("--load-format", choices=["flattened_bucket", "per_tensor"],
                        default="flattened_bucket",
                        help="one broadcast of every tensor's bytes (flattened_bucket, the "
                             "default), or one broadcast per tensor")
    ex.add_trainer_arguments(parser, device="cpu", token=False)
    args = parser.parse_args()
    engines = ex.engines_of(parser, args)

    torch = ex.import_torch()
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        raise ex.ExampleError("this torch has no torch.distributed with gloo")
    if (args.load_format == "per_tensor" and args.dtype == "bfloat16"
            and int(torch.__version__.split(".")[0]) < 2):
        raise ex.ExampleError(f"--load-format per_tensor: gloo of torch {torch.__version__} "
                              "cannot broadcast bfloat16 tensors; use --load-format "
                              "flattened_bucket (bytes) or --dtype float32")
    device = ex.torch_device(torch, args.device)
    urls = [ex.base_url(e) for e in engines]
    for url in urls:  # fail now, not after the group's timeout
        ex.weight_version(url)
    model = ex.build_model(torch, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    group = create_group(urls, args, datetime.timedelta(seconds=args.timeout))
    print(f"group {GROUP!r}: rank 0 of {len(urls) + 1} (gloo), {len(urls)} engine(s) joined",
          flush=True)
    for step in range(1, args.steps + 1):
        loss = ex.train_step(torch, model, optimizer, step)
        label = f"step-{step}"
        state = model.state_dict()
        t0 = time.perf_counter()
        sent = update_weights(torch, urls, group, state, label, args)
        print(f"step {step}: loss {loss:.4f}, broadcast {sent / 1e6:.2f} MB "
              f"({args.load_format}) in {time.perf_counter() - t0:.3f} s; every engine "
              f"published {label}", flush=True)
        for engine, url in zip(engines, urls):
            ex.require_serves(engine, url, state, label, step)
        print(f"  every engine serves {label}: values read back match the trainer's",
              flush=True)
    for answer in leave(urls):
        print(f"group {GROUP!r} left: {answer.get('teardown')}", flush=True)
    ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
