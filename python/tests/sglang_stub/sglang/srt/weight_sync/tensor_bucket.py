"""python/tests/sglang_stub/sglang/srt/weight_sync/tensor_bucket.py: SGLang's flattened bucket
layout and metadata dataclass, as its trainers build them (see ../../../__init__.py)."""

from dataclasses import dataclass

import torch


@dataclass
class FlattenedTensorMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


class FlattenedTensorBucket:
    supports_multi_dtypes = True

    def __init__(self, named_tensors):
        parts, self.metadata, start = [], [], 0
        for name, tensor in named_tensors:
            flat = tensor.flatten().view(torch.uint8)
            parts.append(flat)
            self.metadata.append(FlattenedTensorMetadata(
                name=name, shape=tensor.shape, dtype=tensor.dtype, start_idx=start,
                end_idx=start + flat.numel(), numel=flat.numel()))
            start += flat.numel()
        self.flattened_tensor = torch.cat(parts, dim=0)

    def get_flattened_tensor(self):
        return self.flattened_tensor

    def get_metadata(self):
        return self.metadata
