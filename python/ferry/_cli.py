"""ferry._cli: the `ferry` command a wheel installs: runs the ferry executable the wheel carries
(ferry/_native/bin/ferry) with the same arguments, in this process's place."""

import os
import sys
from pathlib import Path


def executable():
    """The path of the carried ferry executable (it may be missing: a binding-only build)."""
    return Path(__file__).resolve().parent / "_native" / "bin" / "ferry"


def main():
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(
            f"ferry: this installation of the Python package carries no ferry executable ({exe} "
            "is missing; it was built with FERRY_WHEEL_BINDING_ONLY=1): install a wheel built "
            "by scripts/wheel, or run the ferry of your build (build/host/cli/ferry)\n")
        return 1
    os.execv(exe, ["ferry"] + sys.argv[1:])
    return 1  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())
