"""python/tests/models.py: the model and arrays both sides of the round-trip tests build: the
same names, dtypes and shapes, different values per seed."""


def torch_model(seed):
    import torch
    torch.manual_seed(seed)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 16)
            self.norm = torch.nn.LayerNorm(16)
            self.up = torch.nn.Linear(16, 48)
            self.down = torch.nn.Linear(48, 16, bias=False).to(torch.bfloat16)
            self.head = torch.nn.Linear(16, 64).to(torch.float16)
            self.big = torch.nn.Linear(512, 512, bias=False)  # 1 MiB

    return Tiny()


def numpy_arrays(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    return {
        "w.f32": rng.standard_normal((32, 24)).astype(np.float32),
        "w.f64": rng.standard_normal((5, 7)).astype(np.float64),
        "w.f16": rng.standard_normal((9,)).astype(np.float16),
        "ids.i64": rng.integers(-1 << 40, 1 << 40, size=(4, 3), dtype=np.int64),
        "ids.i32": rng.integers(-1000, 1000, size=(6,), dtype=np.int32),
        "bytes.u8": rng.integers(0, 255, size=(3, 3, 3), dtype=np.uint8),
        "mask.bool": rng.integers(0, 2, size=(10,)).astype(np.bool_),
        "scalar": np.array(rng.standard_normal(), dtype=np.float32),
    }
