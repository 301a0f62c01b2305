"""examples/example_common.py: what every example's trainer and engine share: the small
language model both sides build (same names, dtypes and shapes: a plain-torch TinyLM, or for
the colocated example a transformers LlamaForCausalLM), one training step, greedy decoding, SGLang's
flattened bucket layout, JSON over HTTP to a receiver's control API (and the calls SGLang's RL
clients wrap an update in), the check that pushed weights arrived, and finding the `ferry`
executable and the `ferry` Python package. Each example script puts this folder on sys.path;
nothing here is part of ferry itself."""

import argparse
import contextlib
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
CHECKOUT = EXAMPLES.parent


class ExampleError(Exception):
    """A failure the example reports in one line and exits 1 for (no traceback)."""


def run_main(main):
    """Runs main() -> exit code; an ExampleError, a ferry.Error or Ctrl-C is one line on stderr,
    exit 1 (130 for Ctrl-C)."""
    try:
        sys.exit(main())
    except ExampleError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # a ferry.Error is a message for the user too: no traceback
        if not type(e).__module__.startswith("ferry"):
            raise
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        sys.exit(1)


# ---- arguments ---------------------------------------------------------------------------------

def argument_parser(doc):
    """The script's parser: its docstring's first paragraph as the description, the rest (the
    usage example) after the options."""
    first, _, rest = doc.partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_trainer_arguments(parser, device, token=True, models=("tiny",)):
    """What every trainer takes: its device, the number of steps, a file for its final weights
    and (where the engine has a control API) the engine's token."""
    parser.add_argument("--device", default=device, help=f"the trainer's device ({device})")
    parser.add_argument("--steps", type=positive_int, default=3, help="training steps (3)")
    parser.add_argument("--save", help="torch.save the final weights here (to compare)")
    if token:
        parser.add_argument("--token", help="the engines' bearer token")
    add_model_arguments(parser, models)


def add_engines_argument(parser):
    parser.add_argument("--engines", required=True,
                        help="HOST:PORT[,HOST:PORT...] of the engines' control APIs")


def add_group_arguments(parser):
    """What rank 0 of a weight-update group takes besides --engines: where the engines meet it
    and how long it waits for them."""
    parser.add_argument("--master-address", default="127.0.0.1",
                        help="an address of this host the engines reach (127.0.0.1)")
    parser.add_argument("--master-port", type=port_number, default=29500,
                        help="rank 0's rendezvous port on this host (29500)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds for every rank to join, and for each broadcast (120)")


def engines_of(parser, args):
    """--engines as a list of HOST:PORT; a usage error when it names none."""
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines:
        parser.error("--engines names no engine")
    return engines


# ---- the model ---------------------------------------------------------------------------------

def add_model_arguments(parser, models=("tiny",)):
    """The model's shape and seed; trainer and engine must be given the same shape. With more
    than one of MODELS in `models`, --model chooses (tiny by default)."""
    g = parser.add_argument_group("model (the same on both sides)")
    if len(models) > 1:
        g.add_argument("--model", choices=models, default="tiny",
                       help="tiny: a plain-torch TinyLM (default); llama: transformers' "
                            "LlamaForCausalLM from llama_config(), randomly initialised")
    g.add_argument("--vocab", type=positive_int, default=1024, help="vocabulary size (1024)")
    g.add_argument("--hidden", type=positive_int, default=256, help="hidden size (256)")
    g.add_argument("--layers", type=positive_int, default=2, help="layers (2)")
    g.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                   help="parameter dtype (bfloat16)")
    g.add_argument("--seed", type=int, default=0,
                   help="initial weights' seed (0; a llama engine draws from SEED+1)")


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_number(text):
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {value}")
    return value


def import_torch():
    try:
        import torch
    except ImportError as e:
        raise ExampleError(f"PyTorch is not importable ({e}); the examples need torch") from None
    return torch


def torch_device(torch, name):
    """torch.device(name), refused with a reason when it cannot be used here."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ExampleError(f"--device {name!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ExampleError(f"--device {name}: no CUDA device is usable here "
                               "(torch.cuda.is_available() is False)")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ExampleError(f"--device {name}: this machine has "
                               f"{torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise ExampleError(f"--device {name}: only cpu and cuda[:N] are supported")
    return device


MODELS = ("tiny", "llama")


def build_model(torch, args, device, engine=False):
    """The model --model names (tiny without --model), initialised from args.seed, with
    args.dtype parameters on `device`. A llama engine (engine=True) draws its initial weights
    from args.seed + 1, so that they differ from the trainer's until the first push."""
    if getattr(args, "model", "tiny") == "llama":
        transformers = import_transformers()
        torch.manual_seed(args.seed + (1 if engine else 0))
        model = transformers.LlamaForCausalLM(llama_config(transformers, args))
        return model.to(device=device, dtype=getattr(torch, args.dtype))
    return build_tiny_lm(torch, args, device)


def import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ExampleError(f"--model llama: transformers is not importable ({e}): pip install "
                           "transformers, or run the examples with build-venv/examples/bin/python "
                           "(scripts/setup makes it)") from None
    return transformers


def llama_config(transformers, args):
    """The small Llama both sides build from the model arguments: APIs of transformers 4.40 and
    5.x alike. The head is untied (tie_word_embeddings=False), so that named_parameters() (what
    the engine registers) and state_dict() (what the trainer pushes) name the same tensors;
    eager attention is the same code with every torch; no end-of-sequence token, so that
    greedy decoding always yields the tokens asked for."""
    heads = 4
    if args.hidden % (2 * heads):
        raise ExampleError(f"--model llama: --hidden must be a multiple of {2 * heads}, got "
                           f"{args.hidden}")
    return transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, attn_implementation="eager")


def is_transformers_model(model):
    return hasattr(model, "config") and hasattr(model, "generate")


def vocab_size(model):
    if is_transformers_model(model):
        return model.config.vocab_size
    return model.embed.num_embeddings


def logits_of(model, tokens):
    """The logits for a batch of token ids: TinyLM returns them, a transformers model an output
    that holds them."""
    if is_transformers_model(model):
        return model(input_ids=tokens, use_cache=False).logits
    return model(tokens)


def greedy(torch, model, prompt, new_tokens=0):
    """(the greedy next token at every position of `prompt`, `new_tokens` tokens greedily
    continuing it): what an engine's /generate answers and its trainer checks. A transformers
    model continues with model.generate(do_sample=False); TinyLM one token per forward pass."""
    device = next(model.parameters()).device
    with torch.no_grad():
        tokens = torch.tensor([prompt], device=device)
        next_tokens = logits_of(model, tokens).argmax(-1)[0].tolist()
        if not new_tokens:
            return next_tokens, []
        if is_transformers_model(model):
            out = model.generate(tokens, attention_mask=torch.ones_like(tokens),
                                 max_new_tokens=new_tokens, do_sample=False)
        else:
            out = tokens
            for _ in range(new_tokens):
                out = torch.cat([out, model(out)[:, -1:].argmax(-1)], dim=1)
    return next_tokens, out[0, len(prompt):].tolist()


def build_tiny_lm(torch, args, device):
    """A small decoder-style language model (embedding, residual MLP blocks with RMS norms, an
    untied head), initialised from args.seed: plain torch, so that it runs anywhere."""

    class Block(torch.nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.norm = torch.nn.Parameter(torch.ones(hidden))
            self.up = torch.nn.Linear(hidden, 4 * hidden, bias=False)
            self.down = torch.nn.Linear(4 * hidden, hidden, bias=False)

        def forward(self, x):
            h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
            return x + self.down(torch.nn.functional.gelu(self.up(h * self.norm)))

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(args.vocab, args.hidden)
            self.layers = torch.nn.ModuleList(Block(args.hidden) for _ in range(args.layers))
            self.head = torch.nn.Linear(args.hidden, args.vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    torch.manual_seed(args.seed)
    return TinyLM().to(device=device, dtype=getattr(torch, args.dtype))


def train_step(torch, model, optimizer, step, batch=4, seq=32):
    """One next-token step on a random batch drawn from `step`; returns the loss."""
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(1000 + step)
    vocab = vocab_size(model)
    tokens = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    logits = logits_of(model, tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                             tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def flatten(torch, tensors):
    """One 1-D uint8 tensor of the tensors' bytes, one after the other in order: the layout of
    SGLang's FlattenedTensorBucket, which verl and slime send as one bucket."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


# ---- ferry -------------------------------------------------------------------------------------

def import_ferry():
    """The ferry Python package (pip install ./python, or PYTHONPATH=python in a checkout)."""
    try:
        import ferry
    except ImportError as e:
        raise ExampleError(f"the ferry Python package is not importable ({e}): pip install "
                           "./python, or PYTHONPATH=<checkout>/python") from None
    try:
        ferry.library_path()
    except ferry.Error as e:
        raise ExampleError(f"libferry.so was not found: {e.message}") from None
    return ferry


def find_ferry(explicit=None):
    """The `ferry` executable: --ferry, else $FERRY_EXE, else `ferry` on PATH, else this
    checkout's build/host/cli/ferry."""
    for candidate, what in ((explicit, "--ferry"), (os.environ.get("FERRY_EXE"), "FERRY_EXE")):
        if candidate:
            if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
                raise ExampleError(f"{what} {candidate}: not an executable file")
            return candidate
    on_path = shutil.which("ferry")
    if on_path:
        return on_path
    built = CHECKOUT / "build" / "host" / "cli" / "ferry"
    if built.is_file():
        return str(built)
    raise ExampleError("the ferry executable was not found: pass --ferry PATH, set FERRY_EXE, "
                       "put it on PATH, or build this checkout (scripts/build)")


def add_serve_arguments(parser, host="127.0.0.1", port=30000):
    """The `ferry serve` options every engine script passes through."""
    parser.add_argument("--host", default=host, help=f"address to bind ({host})")
    parser.add_argument("--port", type=port_number, default=port,
                        help=f"control API port ({port}; 0 picks a free one)")
    parser.add_argument("--token", help="bearer token the trainer must send")
    parser.add_argument("--ready-file", help="write the bound port here once serving")
    parser.add_argument("--ferry", help="the ferry executable (default: FERRY_EXE, PATH, build/)")


def exec_serve(args, extra, env=None):
    """Replaces this process with `ferry serve` (its log is the engine's log; Ctrl-C stops it)."""
    command = [find_ferry(args.ferry), "serve", "--host", args.host, "--port", str(args.port),
               "--model-family", "identity", *extra]
    if args.token:
        command += ["--token", args.token]
    if args.ready_file:
        command += ["--ready-file", args.ready_file]
    print("engine: " + " ".join(command), file=sys.stderr, flush=True)
    try:
        os.execve(command[0], command, {**os.environ, **(env or {})})
    except OSError as e:
        raise ExampleError(f"cannot run {command[0]}: {e.strerror}") from None


def http_json(url, body=None, token=None, timeout=120):
    """POSTs `body` (or GETs when None) and returns (status, JSON answer); an unreachable
    server is an ExampleError naming the URL."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text or b"{}")
        except ValueError:
            return e.code, {"message": text.decode("utf-8", "replace")}
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ExampleError(f"{url}: {reason} (is the engine running there?)") from None


def post(url, route, body=None, token=None):
    """POSTs `body` to the route and returns the answer; an ExampleError naming the route unless
    it is 200 and not `success: false` (how SGLang's routes report a failure)."""
    status, answer = http_json(f"{url}{route}", body if body is not None else {}, token=token)
    if status != 200 or answer.get("success") is False:
        raise ExampleError(f"{url}{route} answered {status}: {answer.get('message')}")
    return answer


@contextlib.contextmanager
def weight_update_session(urls):
    """What SGLang's RL clients (slime, miles) wrap an update in, on every engine: generation
    paused, the cache flushed and a weight-update session begun; after the body has sent the
    weights, the session ended (the engine's post-load processing runs) and generation
    continued. Yields a list that then holds each engine's /end_weight_update answer. When the
    body fails, the sessions are ended and generation continued all the same (their failures
    unreported), so that the next run finds the engines as this one did."""
    for url in urls:
        post(url, "/pause_generation", {"mode": "abort"})
        post(url, "/flush_cache", {})
        post(url, "/begin_weight_update", {"selector": "all"})
    ended = []
    try:
        yield ended
    except BaseException:
        for url in urls:
            for route in ("/end_weight_update", "/continue_generation"):
                try:
                    post(url, route, {})
                except ExampleError:
                    pass
        raise
    for url in urls:
        ended.append(post(url, "/end_weight_update", {}))
        post(url, "/continue_generation", {})


def base_url(address):
    """HOST:PORT or http://HOST:PORT -> http://HOST:PORT."""
    address = address.rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def check_arrived(url, state, token=None, names=None, values=64):
    """Reads back the first `values` values of each named tensor (every tensor by default) from
    the receiver at `url` (/get_weights_by_name) and compares them with the trainer's. Returns
    the names that differ (empty: the weights arrived)."""
    wrong = []
    for name in names or list(state):
        tensor = state[name]
        status, answer = http_json(f"{url}/get_weights_by_name",
                                   {"name": name, "truncate_size": values}, token=token)
        expect = tensor.detach().flatten()[:values].float().cpu().tolist()
        if status != 200 or answer.get("values") != expect:
            wrong.append(f"{name} ({answer.get('message', 'values differ')})"
                         if status != 200 else name)
    return wrong


def require_arrived(engine, url, state, step, token=None):
    """check_arrived, as an ExampleError naming the engine and the tensors that differ."""
    wrong = check_arrived(url, state, token=token)
    if wrong:
        raise ExampleError(f"{engine}: {len(wrong)} tensor(s) differ from the trainer's after "
                           f"step {step}: {wrong[:5]}")


def require_serves(engine, url, state, label, step, token=None):
    """The engine publishes weight_version `label` and holds `state`'s values (require_arrived),
    else an ExampleError naming it."""
    served, _ = weight_version(url, token)
    if served != label:
        raise ExampleError(f"{engine} serves weight_version {served!r} after step {step}, not "
                           f"{label!r}")
    require_arrived(engine, url, state, step, token)


def require_same_tokens(torch, control_url, model, prompt, label, step, new_tokens=4):
    """The engine's /generate (on its own control server) serves `label` and gives the greedy
    tokens the trainer's `model` gives for `prompt` (greedy: the next token at each position and
    `new_tokens` generated after it), else an ExampleError naming both."""
    status, rollout = http_json(f"{control_url}/generate",
                                {"tokens": prompt, "max_new_tokens": new_tokens})
    if status != 200:
        raise ExampleError(f"{control_url}/generate answered {status}: {rollout.get('message')}")
    mine, generated = greedy(torch, model, prompt, new_tokens)
    if (rollout["weight_version"] != label or rollout["next_tokens"] != mine
            or rollout.get("generated", []) != generated):
        raise ExampleError(f"step {step}: the engine generated {rollout} with {label}'s "
                           f"weights; the trainer's model gives {mine}, generating "
                           f"{generated}")


def weight_version(url, token=None):
    """The receiver's published (label, version number): GET /get_weight_version."""
    status, answer = http_json(f"{url}/get_weight_version", token=token)
    if status != 200:
        raise ExampleError(f"{url}/get_weight_version answered {status}: {answer}")
    return answer.get("weight_version"), int(answer.get("version", 0))


def first_version(urls, token=None):
    """The version number this run's first push takes: one above the highest any receiver
    publishes, so that a trainer started again continues the sequence (0 + 1 on fresh ones)."""
    return 1 + max(weight_version(url, token)[1] for url in urls)


def save_state(torch, path, model):
    """torch.save of the model's weights (CPU copies) to `path` (--save; None: nothing), for
    comparing with the engine's."""
    if path:
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, path)
