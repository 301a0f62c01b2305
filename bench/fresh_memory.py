#!/usr/bin/env python3
"""bench/fresh_memory.py: how much slower a device copy into freshly mapped memory is, and what
mapping costs: the question behind a push right after a receiver's resume (docs/benchmarks.md,
"The colocated RL loop"). On one GPU, with torch and the CUDA driver (ctypes): copies of SIZE
bytes into a new cudaMalloc, into one freed and allocated again (in this process, and after
another process used the memory), and into CUDA VMM memory (cuMemCreate + cuMemMap +
cuMemSetAccess, as ferry's store maps its regions) right after mapping and after an idle pause;
the mapping and unmapping times. Prints one line per measurement; exits 2 without a GPU.

usage: python3 bench/fresh_memory.py [--gib 16] [--chunk-gib 2]
"""
import argparse
import ctypes
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--chunk-gib", type=int, default=2)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("fresh_memory: needs a GPU", file=sys.stderr)
        return 2
    size = args.gib << 30
    chunk = args.chunk_gib << 30
    dev = torch.device("cuda:0")
    src = torch.empty(size, dtype=torch.uint8, device=dev)
    src.fill_(7)
    other = [sys.executable, "-c",
             f"import torch; x = torch.empty({size}, dtype=torch.uint8, device='cuda'); "
             "x.fill_(3); torch.cuda.synchronize()"]

    def timed(label, copy):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy()
        end.record()
        end.synchronize()
        print(f"{label}: {start.elapsed_time(end):.2f} ms", flush=True)

    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    timed("copy into a new cudaMalloc", lambda: dst.copy_(src))
    timed("the same again (warm)", lambda: dst.copy_(src))
    del dst
    torch.cuda.empty_cache()
    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    timed("copy after a free and a new malloc in this process", lambda: dst.copy_(src))
    del dst
    torch.cuda.empty_cache()
    subprocess.run(other, check=True)
    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    timed("copy after another process used and freed the memory", lambda: dst.copy_(src))
    del dst
    torch.cuda.empty_cache()

    cu = ctypes.CDLL("libcuda.so.1")

    class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
        _fields_ = [("type", ctypes.c_int), ("requested_handle_types", ctypes.c_int),
                    ("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                    ("win32_metadata", ctypes.c_void_p), ("compression_type", ctypes.c_ubyte),
                    ("gpu_direct_rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                    ("reserved", ctypes.c_ubyte * 4)]

    class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
        _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                    ("flags", ctypes.c_int)]

    # Pinned device memory of GPU 0, exportable as a POSIX fd (what the store asks for).
    prop = AllocationProp(type=1, requested_handle_types=1, location_type=1, location_id=0)
    va = ctypes.c_uint64()
    check(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                 ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")

    def vmm_map():
        handles = []
        t0 = time.perf_counter()
        for i in range(size // chunk):
            h = ctypes.c_uint64()
            check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(chunk), ctypes.byref(prop),
                                 ctypes.c_uint64(0)), "cuMemCreate")
            check(cu.cuMemMap(ctypes.c_uint64(va.value + i * chunk), ctypes.c_size_t(chunk),
                              ctypes.c_size_t(0), h, ctypes.c_uint64(0)), "cuMemMap")
            handles.append(h)
        t1 = time.perf_counter()
        access = AccessDesc(location_type=1, location_id=0, flags=3)  # read-write
        check(cu.cuMemSetAccess(ctypes.c_uint64(va.value), ctypes.c_size_t(size),
                                ctypes.byref(access), ctypes.c_size_t(1)), "cuMemSetAccess")
        t2 = time.perf_counter()
        print(f"VMM: cuMemCreate + cuMemMap of {len(handles)} chunks {(t1 - t0) * 1e3:.2f} ms, "
              f"cuMemSetAccess {(t2 - t1) * 1e3:.2f} ms", flush=True)
        return handles

    def vmm_unmap(handles):
        t0 = time.perf_counter()
        check(cu.cuMemUnmap(ctypes.c_uint64(va.value), ctypes.c_size_t(size)), "cuMemUnmap")
        for h in handles:
            check(cu.cuMemRelease(h), "cuMemRelease")
        print(f"VMM: unmap + release {(time.perf_counter() - t0) * 1e3:.2f} ms", flush=True)

    def vmm_copy():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(cu.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(va.value), ctypes.c_uint64(src.data_ptr()),
                                      ctypes.c_size_t(size), stream), "cuMemcpyDtoDAsync")

    handles = vmm_map()
    timed("VMM: copy right after mapping", vmm_copy)
    timed("VMM: the same again (warm)", vmm_copy)
    vmm_unmap(handles)
    subprocess.run(other, check=True)
    handles = vmm_map()
    timed("VMM: copy right after mapping memory another process used", vmm_copy)
    vmm_unmap(handles)
    handles = vmm_map()
    time.sleep(0.05)
    timed("VMM: copy 50 ms after mapping", vmm_copy)
    vmm_unmap(handles)
    return 0


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


if __name__ == "__main__":
    sys.exit(main())
