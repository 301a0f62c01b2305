#!/usr/bin/env python3
"""examples/colocated/engine.py: the inference engine of the colocated form (trainer and engine
processes share one GPU). It builds its model on --device (--model: the plain-torch TinyLM, or
llama: a transformers LlamaForCausalLM serving model.generate), embeds a ferry.Receiver over the
model's own parameters (updates are written into them in place; a trainer on the same host
pushes through CUDA IPC), and runs a small control server of its own on --control-port:

    POST /release_memory_occupation   frees the engine's KV cache (the GPU memory it can give
                                      the trainer while it trains); the weights stay in place
    POST /resume_memory_occupation    allocates the KV cache again
    POST /generate {"tokens": [...], "max_new_tokens": N}
                                      greedy next tokens for a prompt (and N more generated
                                      after it, 0 by default), with the weight version

The receiver's own SGLang routes (--port) reach the engine through its callbacks, which is how a
trainer written for SGLang (examples/sglang_api/trainer.py) drives it: /pause_generation stops
/generate (it answers 409 until /continue_generation), /release_memory_occupation and
/resume_memory_occupation with the tag "kv_cache" free and allocate the KV cache as the control
server's routes do, /flush_cache and /end_weight_update run the engine's cache flush and its
post-load processing (nothing to do for this model; it says so in its log).

    python3 examples/colocated/engine.py --device cuda:0 --port 30000 --control-port 30001
    python3 examples/colocated/engine.py --model llama --device cuda:0   # needs transformers

Ctrl-C (or SIGTERM) stops it; --dump PATH saves its parameters then (to compare).
"""

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402

MAX_NEW_TOKENS = 64


class Engine:
    """The model, its KV cache and the embedded receiver; one request at a time."""

    def __init__(self, torch, ferry, args, device):
        self.torch = torch
        self.ferry = ferry
        self.device = device
        self.kv_bytes = args.kv_cache_mib << 20
        self.model = ex.build_model(torch, args, device, engine=True).eval()
        self.lock = threading.Lock()
        self.kv_cache = None
        self.resume()
        # The receiver writes into model.named_parameters() in place; by default it waits for
        # the work queued on torch's current stream (this thread's) before it writes.
        self.receiver = ferry.Receiver()
        self.receiver.register(self.model.named_parameters())
        # SGLang's engine routes on the receiver's port (docs/http-api.md, "Engine routes"). The
        # callbacks run on the receiver's threads and must not call it back: they set the flag
        # /generate reads, or free and allocate the KV cache.
        self.paused = None  # the pause mode while generation is paused
        self.receiver.set_engine_callbacks(pause=self.pause, resume=self.unpause,
                                           flush_cache=self.flush_cache,
                                           post_load=self.post_load, memory=self.memory,
                                           memory_tags=["kv_cache"])

    def release(self):
        with self.lock:
            if self.kv_cache is None:
                return 409, {"success": False, "message": "the KV cache is already released"}
            self.kv_cache = None
            answer = {"success": True, "message": f"released {self.kv_bytes} bytes"}
            say(f"KV cache released ({self.kv_bytes} bytes)")
            if self.device.type == "cuda":
                before = self.torch.cuda.memory_reserved(self.device)
                self.torch.cuda.empty_cache()  # back to the driver: the trainer can have it
                answer["freed_bytes"] = before - self.torch.cuda.memory_reserved(self.device)
            return 200, answer

    def resume(self):
        with self.lock:
            if self.kv_cache is not None:
                return 409, {"success": False, "message": "the KV cache is not released"}
            self.kv_cache = self.torch.empty(self.kv_bytes, dtype=self.torch.uint8,
                                             device=self.device)
            say(f"KV cache allocated ({self.kv_bytes} bytes)")
            return 200, {"success": True, "message": f"allocated {self.kv_bytes} bytes"}

    def memory(self, tags, release):
        # Only "kv_cache" is registered; a refusal keeps its 409 on the receiver's port.
        status, answer = self.release() if release else self.resume()
        if status != 200:
            raise self.ferry.FailedPreconditionError(self.ferry.errors.FAILED_PRECONDITION,
                                                     answer["message"])

    def pause(self, mode):
        self.paused = mode
        say(f"generation paused ({mode})")
        return 0  # requests paused: this engine serves one at a time and keeps none waiting

    def unpause(self, torch_empty_cache):
        self.paused = None
        say("generation continued")

    def flush_cache(self, torch_empty_cache):
        # No prefix cache outlives a request here; a real engine drops its radix cache.
        if torch_empty_cache and self.device.type == "cuda":
            self.torch.cuda.empty_cache()
        say("cache flushed")

    def post_load(self):
        # Where a real engine re-packs or re-quantizes the new weights; this model reads them as is.
        say("post-load processing of the new weights: nothing to do")

    def generate(self, body):
        tokens = body.get("tokens")
        new_tokens = body.get("max_new_tokens", 0)
        vocab = ex.vocab_size(self.model)
        if (not isinstance(tokens, list) or not tokens
                or not all(isinstance(t, int) and 0 <= t < vocab for t in tokens)):
            return 400, {"success": False,
                         "message": f"'tokens' must be a non-empty list of ints below {vocab}"}
        if not isinstance(new_tokens, int) or not 0 <= new_tokens <= MAX_NEW_TOKENS:
            return 400, {"success": False, "message": "'max_new_tokens' must be an int from 0 "
                                                      f"to {MAX_NEW_TOKENS}"}
        with self.lock:
            if self.kv_cache is None:
                return 409, {"success": False, "message": "memory released: resume first"}
            if self.paused is not None:
                return 409, {"success": False,
                             "message": f"generation is paused ({self.paused}): "
                                        "/continue_generation first"}
            if self.receiver.health().state == "updating":  # never read half-written weights
                return 409, {"success": False, "message": "an update is being written"}
            version = self.receiver.version
            next_tokens, generated = ex.greedy(self.torch, self.model, tokens, new_tokens)
            return 200, {"success": True, "next_tokens": next_tokens, "generated": generated,
                         "weight_version": version.label}


def say(event):
    print(f"engine: {event}", flush=True)


def control_server(engine, host, port):
    routes = {"/release_memory_occupation": lambda body: engine.release(),
              "/resume_memory_occupation": lambda body: engine.resume(),
              "/generate": engine.generate}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            route = routes.get(self.path)
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, answer = (route(body) if route else
                                  (404, {"success": False, "message": f"no route {self.path}"}))
            except ValueError as e:
                status, answer = 400, {"success": False, "message": f"bad JSON: {e}"}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main():
    parser = ex.argument_parser(__doc__)
    parser.add_argument("--device", default="cuda:0", help="the GPU (cuda:0); cpu to try it out")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=ex.port_number, default=30000,
                        help="the embedded receiver's port, trainers push here (30000; 0: free)")
    parser.add_argument("--control-port", type=ex.port_number, default=30001,
                        help="this engine's own control server (30001; 0: free)")
    parser.add_argument("--kv-cache-mib", type=ex.positive_int, default=256,
                        help="the KV cache's size in MiB (256)")
    parser.add_argument("--ready-file", help="write {port, control_port} as JSON once serving")
    parser.add_argument("--dump", help="torch.save the parameters here when stopping")
    ex.add_model_arguments(parser, ex.MODELS)
    args = parser.parse_args()

    torch = ex.import_torch()
    ferry = ex.import_ferry()
    device = ex.torch_device(torch, args.device)
    engine = Engine(torch, ferry, args, device)
    try:
        port = engine.receiver.serve(port=args.port, host=args.host)
        control = control_server(engine, args.host, args.control_port)
    except (ferry.Error, OSError) as e:
        engine.receiver.close()
        raise ex.ExampleError(f"cannot serve on {args.host}: {e}") from None
    threading.Thread(target=control.serve_forever, daemon=True).start()
    control_port = control.server_address[1]
    print(f"engine: receiver on {args.host}:{port}, control server on "
          f"{args.host}:{control_port}, {len(list(engine.model.parameters()))} parameters of "
          f"{type(engine.model).__name__} on {device}", flush=True)
    if args.ready_file:
        Path(args.ready_file).write_text(json.dumps({"port": port,
                                                     "control_port": control_port}))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    last = None
    while not stop.wait(0.5):
        version = engine.receiver.version
        if version != last and version.number:
            print(f"engine: now serving weight version {version.label} "
                  f"(health {engine.receiver.health().state})", flush=True)
        last = version
    control.shutdown()
    engine.receiver.close()
    if args.dump:
        ex.save_state(torch, args.dump, engine.model)
    print("engine: stopped", flush=True)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
