"""hatch_build.py: the wheel's build hook. Puts a built ferry into ferry/_native: the `ferry`
executable (bin/), libferry.so, the plugins (lib/ferry/plugins/) and every non-system library
they need (lib/), gathered by the checkout's scripts/bundle with $ORIGIN-relative run paths, and
tags the wheel py3-none-<platform> (ctypes: any CPython 3; the native part: this machine's libc
and architecture).

The build folder is the checkout's FERRY_BUILD_DIR (default build/) above this folder; without a
built libferry.so and ferry executable the build stops and says what to do. FERRY_WHEEL_BINDING_ONLY=1 builds the
binding alone (py3-none-any; libferry.so then comes from a meson install or FERRY_LIBRARY).
Editable installs import the checkout's python/ferry, which finds the build itself.
"""

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def platform_tag():
    """manylinux_X_Y_<arch> for the glibc this machine runs (PEP 600: runs where glibc >= X.Y;
    the native part was linked against this glibc and its C++ runtime), else linux_<arch>."""
    machine = platform.machine()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        libc = ""
    name, _, version = libc.partition(" ")
    parts = version.split(".")
    if name == "glibc" and len(parts) >= 2 and all(p.isdigit() for p in parts[:2]):
        return f"manylinux_{parts[0]}_{parts[1]}_{machine}"
    return f"linux_{machine}"


class NativeBundleHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel" or version == "editable":
            return
        if os.environ.get("FERRY_WHEEL_BINDING_ONLY") == "1":
            return
        checkout = Path(self.root).resolve().parent
        bundle = checkout / "scripts" / "bundle"
        builddir = checkout / os.environ.get("FERRY_BUILD_DIR", "build")
        library = builddir / "host" / "capi" / "libferry.so"
        if not bundle.is_file():
            raise RuntimeError(
                f"ferry wheel: {bundle} not found: the wheel is built from a ferry checkout "
                "(scripts/wheel); FERRY_WHEEL_BINDING_ONLY=1 builds the binding alone")
        executable = builddir / "host" / "cli" / "ferry"
        for built in (library, executable):
            if built.is_file():
                continue
            raise RuntimeError(
                f"ferry wheel: {built} is not built: build ferry first "
                f"(cd {checkout} && scripts/build), then build or install the wheel again; "
                "FERRY_BUILD_DIR names another build folder of the checkout; "
                "FERRY_WHEEL_BINDING_ONLY=1 builds the binding alone")
        self._staging = tempfile.mkdtemp(prefix="ferry-wheel-")
        native = Path(self._staging) / "_native"
        # The bundle's own check (every library resolved inside it, the plugins load from it)
        # runs before anything is packaged.
        subprocess.run(["bash", str(bundle), "--no-build", "--native-only", "--check",
                        "--build", str(builddir), "--out", str(native)],
                       check=True, stdout=sys.stderr)
        build_data["force_include"][str(native)] = "ferry/_native"
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform_tag()}"

    def finalize(self, version, build_data, artifact_path):
        staging = getattr(self, "_staging", None)
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
