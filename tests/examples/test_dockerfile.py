"""tests/examples/test_dockerfile.py: the Dockerfile's steps are the scripts the suite itself
runs, so the image builds what CI builds (no Docker daemon runs here): its base is Debian 12,
every RUN is one of scripts/test's steps (scripts/setup, scripts/build; not scripts/examples-venv,
a test dependency the image has no use for) in the same order, with
arguments those scripts accept, each script is copied in before it runs, .dockerignore keeps the
host's build folders out (scripts/build would reuse their build.ninja), and the CMD is the ferry
that scripts/build produces, whose arguments `ferry demo` accepts: run here as the container runs
it, with an empty home folder, it completes a verified demo."""

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def instructions():
    """(KEYWORD, text) of the Dockerfile, comments dropped, continuation lines joined."""
    out, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def suite_steps():
    """The scripts scripts/test runs before the tests, in order."""
    return [line.split()[0] for line in (ROOT / "scripts" / "test").read_text().splitlines()
            if re.match(r"^scripts/[\w-]+(\s|$)", line)]


def meson_options():
    text = (ROOT / "meson_options.txt").read_text()
    return set(re.findall(r"option\(\s*'([^']+)'", text))


def test_base_is_debian_12():
    froms = [rest for keyword, rest in instructions() if keyword == "FROM"]
    assert len(froms) == 1, froms
    assert re.fullmatch(r"debian:(12|bookworm)(-slim)?", froms[0]), froms[0]


# What scripts/test installs for the tests alone (transformers for one example), not in the image.
TEST_ONLY = {"scripts/examples-venv"}


def test_every_run_is_a_suite_step_in_order_with_valid_arguments():
    assert suite_steps() == ["scripts/setup", "scripts/examples-venv", "scripts/build"]
    steps = [s for s in suite_steps() if s not in TEST_ONLY]
    runs = []
    copied = []
    for keyword, rest in instructions():
        if keyword == "COPY":
            *sources, _ = shlex.split(rest)
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            copied += sources
        elif keyword == "RUN":
            words = shlex.split(rest)
            assert words and words[0] in steps, f"RUN {rest}: not one of scripts/test's {steps}"
            script = ROOT / words[0]
            assert os.access(script, os.X_OK), f"{words[0]} is not executable"
            assert "." in copied or words[0] in copied, f"RUN {words[0]} before it was copied"
            if words[0] == "scripts/setup":  # extra Debian packages, if any
                for arg in words[1:]:
                    assert re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", arg), f"scripts/setup {arg}"
            else:  # scripts/build passes its arguments to meson setup
                for arg in words[1:]:
                    m = re.fullmatch(r"-D([\w-]+)=\S+", arg)
                    assert m and m.group(1) in meson_options(), f"scripts/build {arg}"
            runs.append(words[0])
    assert runs == steps, f"the Dockerfile runs {runs}; the suite runs {steps}"


def test_dockerignore_keeps_host_builds_out():
    patterns = (ROOT / ".dockerignore").read_text().split()
    for folder in ("build", ".git"):
        assert folder in patterns, f".dockerignore does not exclude {folder}/"
    assert "build-*" in patterns


def test_cmd_is_the_built_ferry_demo_and_it_runs(tmp_path):
    cmds = [rest for keyword, rest in instructions() if keyword == "CMD"]
    assert len(cmds) == 1, cmds
    command = json.loads(cmds[0])  # the exec form: no shell in between
    assert isinstance(command, list) and all(isinstance(w, str) for w in command), command
    builddir = re.search(r'builddir="\$\{FERRY_BUILD_DIR:-(\w+)\}"',
                         (ROOT / "scripts" / "build").read_text()).group(1)
    assert command[0] == f"{builddir}/host/cli/ferry", command
    assert command[1] == "demo", command
    ferry = os.environ.get("FERRY_EXE")
    if not ferry:
        pytest.skip("FERRY_EXE is not set (meson test sets it)")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    # The CMD, then the guide's other demo (docs/guides/container.md).
    for args in (command[1:], ["demo", "--steps", "3", "--transport", "inline"]):
        result = subprocess.run([ferry, *args], capture_output=True, text=True, env=env,
                                timeout=240, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "verified" in result.stdout, result.stdout
