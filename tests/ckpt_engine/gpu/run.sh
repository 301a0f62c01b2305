#!/usr/bin/env bash
# tests/ckpt_engine/gpu/run.sh: on the GPU machine: makes checkpoint-engine 0.4.2 importable from
# the carried wheels (only the packages the machine lacks; wheels are unpacked, no network), then
# runs ckpt_engine_gpu.py against the carried ferry bundle. Usage: run.sh CARRIED_DIR OUT [GiB]
set -uo pipefail
carried="$1"; out="$2"; gib="${3:-1}"
site="$(mktemp -d)"
python3 - "$carried/wheels" "$site" <<'PY'
import importlib, sys, zipfile, glob, os
wheels, site = sys.argv[1], sys.argv[2]
need = {"zmq": "pyzmq", "pydantic": "pydantic", "pydantic_core": "pydantic_core",
        "typing_extensions": "typing_extensions", "annotated_types": "annotated_types",
        "typing_inspection": "typing_inspection", "fastapi": "fastapi", "starlette": "starlette",
        "anyio": "anyio", "sniffio": "sniffio", "idna": "idna", "safetensors": "safetensors",
        "uvicorn": "uvicorn", "click": "click", "h11": "h11", "loguru": "loguru", "httpx": "httpx",
        "httpcore": "httpcore", "certifi": "certifi", "numpy": "numpy"}
missing = []
for module, dist in need.items():
    try:
        importlib.import_module(module)
    except Exception:
        missing.append(dist)
print("python", sys.version.split()[0], "missing:", missing)
for dist in missing + ["checkpoint_engine"]:
    found = [w for w in glob.glob(os.path.join(wheels, "*.whl"))
             if os.path.basename(w).lower().startswith(dist.lower().replace("-", "_") + "-")]
    if not found:
        print("no wheel for", dist); continue
    zipfile.ZipFile(found[0]).extractall(site)
PY
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, checkpoint_engine; print('torch', torch.__version__, 'checkpoint_engine', checkpoint_engine.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi -L
python3 "$(dirname "$0")/ckpt_engine_gpu.py" "$carried" "$out" "$gib"
