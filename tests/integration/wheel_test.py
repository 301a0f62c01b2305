"""tests/integration/wheel_test.py: the wheel as a user gets it. Builds it with scripts/wheel
(from this build, leaving nothing in python/), runs the install commands of README.md's Python
section in a fresh venv with no compiler on PATH, no network index and no FERRY_* variable,
requires every library the installed package needs to resolve inside it (scripts/bundle's
check), starts the wheel's `ferry serve` on a small checkpoint and runs README.md's Python
example, taken from README.md itself, against it: the push commits, the weights change, and
libferry.so and the plugins were loaded from the venv.

Usage: wheel_test.py SOURCE_ROOT BUILD_ROOT   (meson test integration_wheel)
"""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++")


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(args, **kwargs):
    print("+", " ".join(str(a) for a in args), flush=True)
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        fail(f"{args[0]} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def readme_section(readme):
    """The ```sh and ```python blocks of README.md's Python part (from the paragraph naming
    scripts/wheel up to the command-line paragraph)."""
    text = readme.read_text()
    start = text.find("From a trainer, in Python.")
    end = text.find("From the command line:", start)
    if start < 0 or end < 0:
        fail("README.md has no Python section ('From a trainer, in Python.' .. "
             "'From the command line:')")
    blocks = re.findall(r"```(\w+)\n(.*?)```", text[start:end], re.S)
    by_kind = {}
    for kind, body in blocks:
        by_kind.setdefault(kind, body)
    if "sh" not in by_kind or "python" not in by_kind:
        fail("README.md's Python section lacks its ```sh or ```python block")
    return by_kind["sh"], by_kind["python"]


def commands(sh_block):
    """The README's shell lines, comments and a trailing '&' removed, by their first word."""
    found = {}
    for line in sh_block.splitlines():
        line = line.split("#", 1)[0].strip().removesuffix("&").strip()  # comment, background
        if line:
            found[line.split()[0]] = line
    return found


def python_readme_install(readme):
    """The indented command lines under python/README.md's '## Install'."""
    text = readme.read_text()
    start = text.find("## Install")
    if start < 0:
        fail("python/README.md has no '## Install' section")
    section = text[start:text.find("\n## ", start + 1)]
    found = [line.split("#", 1)[0].strip() for line in section.splitlines()
             if line.startswith("    ") and line.strip()]
    if not any(line.startswith("venv/bin/ferry ") for line in found):
        fail("python/README.md's install lines run no venv/bin/ferry")
    return found


def write_safetensors(path, tensors):
    """A safetensors file of torch tensors (little-endian, row-major)."""
    import torch
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        raw = tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


MODEL = """
import torch
def make_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 32, bias=False))
    model[2].to(torch.bfloat16)
    return model
"""

# Runs in the venv: README.md's example with `model` and `step` defined, then reports what the
# process loaded (LD_DEBUG=files writes one line per library it maps).
RUNNER = MODEL + """
import sys
model, step = make_model(seed=1), 7
namespace = {"model": model, "step": step}
exec(compile(open(sys.argv[1]).read(), "README.md (Python example)", "exec"), namespace)
report = namespace["report"]
import ferry
print("RESULT", ferry.__file__, ferry.library_path(), report.all_committed, report.version)
"""


def python_folder(source):
    """What python/ holds (build outputs of a pip run would show here)."""
    return sorted(str(p.relative_to(source / "python")) for p in (source / "python").rglob("*")
                  if "__pycache__" not in p.parts)


def wheel_names(wheel):
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def other_builds(source, build, tmp):
    """`pip install ./python` from the checkout (python/README.md): with the build it installs the
    same package; without one it stops and says what to do; the binding alone on request."""
    pip = [SYSTEM_PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-index",
           "--no-deps", "--disable-pip-version-check"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    run(pip + ["--target", tmp / "from-checkout", source / "python"],
        env=env | {"FERRY_BUILD_DIR": str(build)})
    if not (tmp / "from-checkout" / "ferry" / "_native" / "lib" / "libferry.so").is_file():
        fail("pip install ./python installed no ferry/_native/lib/libferry.so")
    done = subprocess.run(pip + ["--target", tmp / "no-build", source / "python"],
                          capture_output=True, text=True,
                          env=env | {"FERRY_BUILD_DIR": str(tmp / "empty")})
    if done.returncode == 0 or "is not built: build ferry first" not in done.stdout + done.stderr:
        fail(f"pip install ./python without a build did not stop with the message "
             f"(exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    print(run([SYSTEM_PYTHON, "-m", "hatchling", "build", "--target", "wheel", "--directory",
               tmp / "binding"], cwd=source / "python",
              env=env | {"FERRY_WHEEL_BINDING_ONLY": "1"}))
    binding = list((tmp / "binding").glob("*.whl"))
    if len(binding) != 1 or not binding[0].name.endswith("-py3-none-any.whl") or \
            any("_native" in n for n in wheel_names(binding[0])):
        fail(f"FERRY_WHEEL_BINDING_ONLY=1 built {binding}, not one py3-none-any binding")
    # Its `ferry` command says that it carries no executable and what to do.
    with zipfile.ZipFile(binding[0]) as z:
        z.extractall(tmp / "binding" / "unpacked")
    done = subprocess.run([SYSTEM_PYTHON, "-c", "import sys, ferry._cli; sys.exit(ferry._cli.main())",
                           "version"], capture_output=True, text=True, env=env,
                          cwd=tmp / "binding" / "unpacked")
    if done.returncode != 1 or "carries no ferry executable" not in done.stderr:
        fail(f"a binding-only `ferry` did not say it carries no executable: {done}")


def fingerprints(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_fingerprints", timeout=10) as r:
        return json.load(r)


def require_tools():
    """What building and installing the wheel here needs (scripts/setup installs all of it)."""
    missing = [f"{module} (apt-get install {package})"
               for module, package in (("hatchling", "python3-hatchling"),
                                       ("ensurepip", "python3-venv"), ("torch", "python3-torch"))
               if subprocess.run([SYSTEM_PYTHON, "-c", f"import {module}"],
                                 capture_output=True).returncode != 0]
    if missing:
        fail(f"{SYSTEM_PYTHON} lacks {', '.join(missing)}: run scripts/setup")


def main():
    source, build = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    require_tools()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="ferry-wheel-test-"))
    server = None
    try:
        # 1. The wheel, from this build; python/ is left as it was.
        before = python_folder(source)
        wheel = Path(run([source / "scripts" / "wheel", "--no-build", "--build", build,
                          "--out", tmp / "dist"]).strip().splitlines()[-1])
        sh_block, example = readme_section(source / "README.md")
        lines = commands(sh_block)
        named = re.search(r"prints dist/(\S+\.whl)", sh_block)
        if not named or named.group(1) != wheel.name:
            fail(f"README.md says scripts/wheel prints {named and named.group(1)}; "
                 f"it built {wheel.name}")

        # 2. A PATH with python and nothing that compiles; an environment with no FERRY_*.
        tools = tmp / "tools"
        tools.mkdir()
        (tools / "python3").symlink_to(SYSTEM_PYTHON)
        (tools / "bash").symlink_to(shutil.which("bash"))  # runs the README's lines
        venv_bin = tmp / "venv" / "bin"
        path = f"{venv_bin}:{tools}"
        for compiler in COMPILERS:
            if shutil.which(compiler, path=path):
                fail(f"the test's PATH reaches a compiler: {compiler}")
        env = {"PATH": path, "HOME": str(tmp), "LANG": "C.UTF-8", "PIP_NO_CACHE_DIR": "1",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}

        # 3. README's install lines, as written (run in a folder holding dist/).
        for first in ("python3", "venv/bin/pip"):
            if first not in lines:
                fail(f"README.md's Python section has no '{first} ...' line")
            line = lines[first]
            if first == "venv/bin/pip" and "--no-index" not in line:
                fail(f"README.md's install line does not use --no-index: {line}")
            run(["bash", "-c", line], cwd=tmp, env=env)
        site = Path(run([venv_bin / "python", "-c",
                         "import ferry, os; print(os.path.dirname(ferry.__file__))"],
                        cwd=tmp, env=env).strip())
        if not site.is_relative_to(tmp / "venv"):
            fail(f"ferry is imported from {site}, not from the venv")

        # 4. Every library the installed package needs is in it (or the system's), and its
        #    ferry runs with PATH only, loading its plugins from itself.
        run(["bash", source / "scripts" / "bundle", "--check-only", "--out", site / "_native"])

        # python/README.md's install lines: the same as README.md's, then its `ferry version`.
        for line in python_readme_install(source / "python" / "README.md"):
            first = line.split()[0]
            if first in ("python3", "venv/bin/pip") and line != lines.get(first):
                fail(f"python/README.md's '{line}' differs from README.md's '{lines.get(first)}'")
            if first == "venv/bin/ferry":
                print(run(["bash", "-c", line], cwd=tmp, env=env))

        # 5. A small checkpoint, served by the README's serve line with the wheel's ferry.
        model_code = {}
        exec(MODEL, model_code)
        (tmp / "ckpt").mkdir()
        write_safetensors(tmp / "ckpt" / "model.safetensors",
                          model_code["make_model"](seed=0).state_dict())
        if "venv/bin/ferry" not in lines:
            fail("README.md's Python section has no 'venv/bin/ferry serve ...' line")
        serve = lines["venv/bin/ferry"].split()
        if "DIR" not in serve or "30000" not in serve:
            fail(f"README.md's serve line names no DIR or port 30000: {' '.join(serve)}")
        serve = [str(tmp / "ckpt") if a == "DIR" else "0" if a == "30000" else a for a in serve]
        ready = tmp / "port"
        log = open(tmp / "serve.log", "w")
        server = subprocess.Popen(["bash", "-c", 'exec "$@"', "serve"] + serve +
                                  ["--ready-file", str(ready)],
                                  cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().strip()):
            if server.poll() is not None or time.monotonic() > deadline:
                fail(f"ferry serve did not start:\n{(tmp / 'serve.log').read_text()}")
            time.sleep(0.1)
        port = int(ready.read_text())
        initial = fingerprints(port)

        # 6. README's Python example against it, its address pointed at the served port.
        if '"localhost:30000"' not in example:
            fail("README.md's Python example does not push to \"localhost:30000\"")
        (tmp / "example.py").write_text(example.replace('"localhost:30000"',
                                                        f'"localhost:{port}"'))
        (tmp / "runner.py").write_text(RUNNER)
        out = run([venv_bin / "python", "runner.py", "example.py"], cwd=tmp,
                  env=env | {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(tmp / "ld")})
        print(out)
        result = [line.split() for line in out.splitlines() if line.startswith("RESULT ")]
        if not result:
            fail("the example's runner printed no RESULT line")
        _, module, library, committed, version = result[-1]
        if not Path(module).is_relative_to(site) or not Path(library).is_relative_to(site):
            fail(f"ferry ({module}) or libferry.so ({library}) is not the venv's ({site})")
        if committed != "True" or version != "7":
            fail(f"the push did not commit version 7: all_committed={committed} "
                 f"version={version}")
        loaded = set()
        for trace in tmp.glob("ld.*"):
            loaded |= set(re.findall(r"file=(\S*libferry\S*\.so\S*)\s", trace.read_text()))
        if not any("libferry_transport_" in f for f in loaded):
            fail(f"the example loaded no transport plugin: {sorted(loaded)}")
        outside = sorted(f for f in loaded if not Path(f).resolve().is_relative_to(site))
        if outside:
            fail(f"the example loaded ferry libraries from outside the venv: {outside}")
        served = fingerprints(port)
        if served.get("weight_version") in (None, initial.get("weight_version")) or \
                served["fingerprints"] == initial["fingerprints"]:
            fail(f"the served weights did not change: {initial} -> {served}")
        other_builds(source, build, tmp)
        if python_folder(source) != before:
            fail(f"building the wheels changed python/: {before} -> {python_folder(source)}")
        print(f"wheel_test: {wheel.name} ({wheel.stat().st_size >> 20} MiB) installed without a "
              f"compiler or index; README's example committed version 7 through "
              f"{sorted(Path(f).name for f in loaded if 'transport' in f)}; "
              f"{time.monotonic() - started:.1f} s")
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
