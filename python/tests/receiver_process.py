"""python/tests/receiver_process.py: an inference engine in miniature for the round-trip tests,
run as a second process: builds a model (PyTorch) or arrays (NumPy) from its own seed, embeds a
ferry.Receiver over them, serves on a free port and answers commands on stdin:
    "dump PATH" -> saves its tensors to PATH (torch.save / numpy.savez), answers "DUMPED N"
    "version"   -> "VERSION number label"
    "quit"      -> exits 0
The first line it prints is "PORT n" (or "ERROR ..." and exit 1).

Usage: receiver_process.py torch|numpy SEED
"""

import sys

import ferry
import models


def main():
    kind, seed = sys.argv[1], int(sys.argv[2])
    if kind == "torch":
        import torch
        model = models.torch_model(seed)
        tensors = dict(model.named_parameters())
    else:
        tensors = models.numpy_arrays(seed)
    try:
        receiver = ferry.Receiver()
        if kind == "torch":
            receiver.register(model.named_parameters())
        else:
            receiver.register_params(tensors)
        port = receiver.serve(port=0)
    except ferry.Error as e:
        print(f"ERROR {e}", flush=True)
        return 1
    print(f"PORT {port}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "version":
            v = receiver.version
            print(f"VERSION {v.number} {v.label}", flush=True)
        elif words[0] == "dump":
            if kind == "torch":
                torch.save({k: v.detach().clone() for k, v in tensors.items()}, words[1])
            else:
                import numpy
                numpy.savez(words[1], **tensors)
            print(f"DUMPED {len(tensors)}", flush=True)
    receiver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
