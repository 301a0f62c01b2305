"""python/tests/test_real_model_rl.py: an RL weight update as users run it, with real Hugging Face
models on one GPU: a trainer process (Qwen3 dense or Qwen3-MoE, AdamW) pushes model.state_dict()
right after optimizer.step(), with no torch.cuda.synchronize(), into a rollout process whose
engine-owned parameters are registered with a ferry.Receiver() left at its defaults. After every
push the rollout's logits for a fixed input and every one of its parameters must equal the
trainer's bit for bit, written in place (same data_ptr), at the pushed version, through CUDA IPC.
In the `lend` cases the rollout releases and resumes its weights before every step (as a
colocated engine lends its memory to training), and every push still goes through the kept
session, rejoined. In the `vmm` cases the rollout's parameters live in its own VMM allocator
(torch_memory_saver style): each lend unmaps and releases their physical memory (which must
give back that much device memory: no other process, the trainer included, still maps it) and
maps new memory at the same addresses before the resume.
The trainer delays its optimizer's kernels (torch.cuda._sleep queued on torch's current stream
before optimizer.step()), so a push that reads the tensors without ordering itself after that
stream commits stale weights, and this test fails.

Both processes run python/tests/rl_model_process.py. Skipped without PyTorch, a CUDA device,
transformers (with Qwen3 and Qwen3-MoE) or libferry.so.
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HELPER = HERE / "rl_model_process.py"
STEPS = 5
START_TIMEOUT_S = 240  # importing transformers and a first CUDA context can be slow
STEP_TIMEOUT_S = 90


def _requirements(family):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the real-model RL test runs on a GPU machine")
    try:
        import transformers
    except Exception as e:  # ImportError, or a broken install raising anything else
        pytest.skip(f"transformers is not importable: {type(e).__name__}: {e}")
    needed = (("Qwen3Config", "Qwen3ForCausalLM") if family == "dense"
              else ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"))
    for name in needed:
        try:
            getattr(transformers, name)
        except Exception as e:  # AttributeError, or the lazy module failing to import it
            pytest.skip(f"transformers {transformers.__version__} has no {name}: "
                        f"{type(e).__name__}: {e}")
    import ferry
    try:
        ferry.library_path()
    except ferry.NotFoundError as e:
        pytest.skip(f"libferry.so is not available: {e.message}")
    return torch


class PeerError(RuntimeError):
    pass


class Peer:
    """rl_model_process.py in a child process: commands on stdin, JSON answers on stdout (read by
    a thread, so that every wait has a timeout), stderr to a file shown on failure."""

    def __init__(self, name, args, log_dir):
        self.name = name
        self.log_path = log_dir / f"{name}.stderr"
        self._log = open(self.log_path, "w")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")] if p)
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, str(HELPER), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self._lines = queue.Queue()
        self.noise = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def answer(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(0.01, left))
            except queue.Empty:
                raise PeerError(f"the {self.name} gave no answer within {timeout} s") from None
            if line is None:
                self.proc.wait(timeout=10)
                raise PeerError(f"the {self.name} exited (code {self.proc.returncode})")
            line = line.strip()
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if not isinstance(msg, dict):
                self.noise.append(line)
                continue
            if "failure" in msg:
                raise PeerError(f"the {self.name} failed: {msg['failure']}\n"
                                f"{msg.get('traceback', '')}")
            return msg

    def send(self, command):
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise PeerError(f"the {self.name} is gone ({e})") from None

    def ask(self, command, timeout=STEP_TIMEOUT_S):
        self.send(command)
        return self.answer(timeout)

    def log_tail(self, chars=4000):
        try:
            self._log.flush()
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture
def peers(tmp_path):
    started = []

    def start(name, args):
        p = Peer(name, args, tmp_path)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def _with_logs(error, peers):
    """`error` as an AssertionError carrying the tail of every peer's stderr and stray stdout."""
    logs = "\n".join(f"--- {p.name} stderr (tail) ---\n{p.log_tail()}" for p in peers)
    noise = "\n".join(f"--- {p.name} other stdout ---\n" + "\n".join(p.noise[-20:])
                      for p in peers if p.noise)
    return AssertionError(f"{error}\n{logs}\n{noise}")


def _bits(t):
    """The tensor's bytes as integers (NaN-safe, exact comparison)."""
    import torch
    t = t.contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def _differences(torch, trainer_snap, rollout_snap):
    """Names of the tensors that differ (state), "logits" first when the logits differ."""
    out = []
    if not torch.equal(_bits(trainer_snap["logits"]), _bits(rollout_snap["logits"])):
        out.append("logits")
    ts, rs = trainer_snap["state"], rollout_snap["state"]
    for name in sorted(set(ts) | set(rs)):
        if name not in ts or name not in rs:
            out.append(f"{name} (only on the {'trainer' if name in ts else 'rollout'})")
        elif ts[name].dtype != rs[name].dtype or ts[name].shape != rs[name].shape:
            out.append(f"{name} ({ts[name].dtype}{list(ts[name].shape)} vs "
                       f"{rs[name].dtype}{list(rs[name].shape)})")
        elif not torch.equal(_bits(ts[name]), _bits(rs[name])):
            out.append(name)
    return out


def _lend(rollout, step, lend):
    """The rollout lends its memory before `step` (release and resume of "weights"): the weights
    come back and it is ready; with `vmm` unmapping its arena gave the memory back to the device
    (nobody else, the trainers' sessions included, still mapped it)."""
    lent = rollout.ask("lend")
    assert lent["restored"], f"step {step}: ferry did not write the weights back"
    assert lent["health"] == "ready", f"step {step}: after the resume: {lent}"
    if lend == "vmm":
        assert lent["freed_bytes"] >= 0.9 * lent["arena_bytes"], (
            f"step {step}: releasing the arena's {lent['arena_bytes']} bytes freed "
            f"only {lent['freed_bytes']}: another process still maps them")


@pytest.mark.parametrize("delivery,lend", [("direct", False), ("staged", False),
                                           ("direct", True), ("direct", "vmm")])
@pytest.mark.parametrize("family", ["dense", "moe"])
def test_trainer_pushes_right_after_the_optimizer_step(peers, tmp_path, family, delivery, lend):
    # lend: before every step after the first the rollout lends its memory (release and resume
    # of "weights" around freeing its KV cache), as a colocated engine does; the push then
    # rejoins the session the release suspended.
    torch = _requirements(family)
    # Both start at once (different seeds: different initial weights); the trainer connects
    # once the rollout serves.
    rollout = peers("rollout", ["rollout", family, delivery, "1"] + (["vmm"] if lend == "vmm"
                                                                       else []))
    trainer = peers("trainer", ["trainer", family, delivery, "2"])
    try:
        ready_r = rollout.answer(START_TIMEOUT_S)
        ready_t = trainer.answer(START_TIMEOUT_S)
        trainer.ask(f"connect 127.0.0.1:{ready_r['port']}")
        assert ready_t["names"] == ready_r["names"], (
            "the trainer's state_dict names differ from the rollout's named_parameters: "
            f"{sorted(set(ready_t['names']) ^ set(ready_r['names']))[:10]}")
        if family == "moe":
            assert ready_r["experts"] == 8, f"the MoE config has {ready_r['experts']} experts"
        assert ready_r["dtypes"] == ["torch.bfloat16"], ready_r["dtypes"]

        def snapshots(name):
            t_path, r_path = tmp_path / f"trainer-{name}.pt", tmp_path / f"rollout-{name}.pt"
            return t_path, r_path

        t_path, r_path = snapshots("initial")
        trainer.ask(f"logits {t_path}")
        rollout.ask(f"logits {r_path}")
        t_snap = torch.load(t_path)
        r_snap = torch.load(r_path)
        initial = _differences(torch, t_snap, r_snap)
        assert "logits" in initial, "the rollout starts with the trainer's weights: a missed " \
                                    "update would not show"
        previous = t_snap

        for step in range(1, STEPS + 1):
            t_path, r_path = snapshots(f"step{step}")
            if lend and step > 1:
                _lend(rollout, step, lend)
            report = trainer.ask(f"step {step} {t_path}")
            assert report["committed"], f"step {step}: the push did not commit: {report['error']}"
            assert report["version"] == step
            assert report["transport"] == "cuda_ipc", (
                f"step {step}: the push went through {report['transport']!r}; a receiver on this "
                "host whose parameters are CUDA tensors must be updated through CUDA IPC")
            if delivery == "direct":
                assert report["direct"], f"step {step}: delivery direct, but the push was staged"
            else:
                assert not report["direct"], f"step {step}: delivery staged, but went direct"
            if step > 1:
                assert report["reused_session"], f"step {step}: the kept session was not reused"
            seen = rollout.ask(f"logits {r_path}")
            assert seen["version"] == step, f"step {step}: the rollout publishes {seen}"
            assert seen["pointers_unchanged"], (
                f"step {step}: parameters were reallocated, not written in place: {seen['moved']}")
            t_snap = torch.load(t_path)
            r_snap = torch.load(r_path)
            assert not torch.equal(_bits(t_snap["logits"]), _bits(previous["logits"])), (
                f"step {step}: the optimizer step did not change the trainer's logits")
            wrong = _differences(torch, t_snap, r_snap)
            tensors = [n for n in wrong if n != "logits"]
            stale = [n for n in tensors if n in previous["state"] and n in r_snap["state"]
                     and torch.equal(_bits(r_snap["state"][n]), _bits(previous["state"][n]))]
            assert not tensors, (
                f"step {step} ({family}, {delivery}): after a committed push the rollout differs "
                f"from the trainer in {len(tensors)} of {len(t_snap['state'])} tensors, "
                f"{len(stale)} of them still the trainer's previous weights (read before the "
                f"optimizer's kernels wrote them): {tensors[:8]}")
            assert not wrong, (
                f"step {step}: every tensor equals the trainer's, but the logits differ: the "
                "forward pass is not deterministic across the two processes")
            previous = t_snap
            t_path.unlink()
            r_path.unlink()
    except (PeerError, AssertionError) as e:
        raise _with_logs(e, (rollout, trainer)) from None


@pytest.mark.parametrize("family,lend", [("dense", True), ("moe", True), ("dense", "vmm")])
def test_sharded_trainer_ranks_push_right_after_the_optimizer_step(peers, tmp_path, family, lend):
    """Two trainer processes are the ranks of one FSDP-style trainer: each trains the same model on
    the same batches (AdamW, its kernels delayed as above) and pushes right after
    optimizer.step() only its dim-0 rows of every tensor (ferry.sharding.Block views, rank=r,
    world=2; the MoE's stacked experts split between the ranks) into one rollout with the
    defaults (update.delivery "auto": each rank's rows straight into the engine's parameters).
    Before every step after the first the rollout lends its memory (release and resume of
    "weights"; with `vmm` its own VMM arena unmaps and remaps): each rank's kept session is
    suspended and the next push rejoins it. After every push the rollout holds each rank's rows
    bit for bit, written in place, at the pushed version, every rank moved only its rows, and
    the rollout's logits equal the trainer's."""
    torch = _requirements(family)
    world = 2
    rollout = peers("rollout", ["rollout", family, "auto", "1"] + (["vmm"] if lend == "vmm"
                                                                     else []))
    ranks = [peers(f"trainer rank {r}", ["trainer", family, "auto", "2", f"rank={r}/{world}"])
             for r in range(world)]
    everyone = [rollout] + ranks
    try:
        ready_r = rollout.answer(START_TIMEOUT_S)
        for t in ranks:
            ready_t = t.answer(START_TIMEOUT_S)
            assert ready_t["names"] == ready_r["names"], "the trainer's names differ"
            t.ask(f"connect 127.0.0.1:{ready_r['port']}")
        r_path = tmp_path / "rollout-initial.pt"
        rollout.ask(f"logits {r_path}")
        previous_r = torch.load(r_path)
        for step in range(1, STEPS + 1):
            if lend and step > 1:
                _lend(rollout, step, lend)
            t_paths = [tmp_path / f"rank{r}-step{step}.pt" for r in range(world)]
            for t, path in zip(ranks, t_paths):  # every rank steps and pushes at once
                t.send(f"step {step} {path}")
            reports = [t.answer(STEP_TIMEOUT_S) for t in ranks]
            for r, report in enumerate(reports):
                assert report["committed"], f"step {step}, rank {r}: {report['error']}"
                assert report["version"] == step
                assert report["transport"] == "cuda_ipc", (r, report["transport"])
                assert report["direct"], (
                    f"step {step}, rank {r}: delivery auto, but the rank's rows were staged")
                if step > 1:  # a release suspends a rank's kept session; the push rejoins it
                    assert report["reused_session"], (
                        f"step {step}, rank {r}: the kept session was not reused")
            # Bytes moved per rank: its rows, none twice, the model's bytes in all.
            assert all(rep["rank_bytes"] == reports[0]["rank_bytes"] for rep in reports), reports
            assert all(b > 0 for b in reports[0]["rank_bytes"]), reports[0]["rank_bytes"]
            assert sum(reports[0]["rank_bytes"]) == reports[0]["needed_bytes"] == \
                ready_r["bytes"], reports[0]
            r_path = tmp_path / f"rollout-step{step}.pt"
            seen = rollout.ask(f"logits {r_path}")
            assert seen["version"] == step, f"step {step}: the rollout publishes {seen}"
            assert seen["pointers_unchanged"], (
                f"step {step}: parameters were reallocated, not written in place: {seen['moved']}")
            snaps = [torch.load(p) for p in t_paths]
            r_snap = torch.load(r_path)
            wrong, stale = [], []
            for name, rows in reports[0]["rows"].items():
                for r, snap in enumerate(snaps):
                    first, end = reports[r]["rows"][name]
                    got = r_snap["state"][name][first:end]
                    if not torch.equal(_bits(got), _bits(snap["state"][name][first:end])):
                        wrong.append(f"{name} rows {first}:{end} (rank {r})")
                        if torch.equal(_bits(got), _bits(previous_r["state"][name][first:end])):
                            stale.append(name)
            assert not wrong, (
                f"step {step} ({family}): after a committed push the rollout differs from the "
                f"ranks in {len(wrong)} blocks, {len(stale)} of them still the previous "
                f"version (read before the optimizer's kernels wrote them): {wrong[:8]}")
            assert not _differences(torch, snaps[0], snaps[1]), (
                f"step {step}: the two ranks' models differ: training is not deterministic "
                "across the processes, so their rows are not one model")
            assert not _differences(torch, snaps[0], r_snap), (
                f"step {step}: every block equals its rank's, but the logits differ")
            assert not torch.equal(_bits(r_snap["logits"]), _bits(previous_r["logits"])), (
                f"step {step}: the rollout's logits did not change")
            previous_r = r_snap
            for p in t_paths + [r_path]:
                p.unlink()
    except (PeerError, AssertionError) as e:
        raise _with_logs(e, everyone) from None


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "rank-0-of-1"])
def test_trainer_pushes_into_tensor_parallel_ranks_after_every_lend(peers, tmp_path, pieces):
    """One trainer (dense Qwen3, AdamW, its kernels delayed as above) pushes its whole
    state_dict right after optimizer.step() into the two tensor-parallel ranks of one engine
    (rollout processes with tp=r/2: the dense family's "hf" layout, each registering only its
    slices). A rank's plan is slices, not one copy per tensor: with the defaults the first push
    reads the trainer's tensors in place (each rank applies its slices from them), and each
    rank's Welcome says it takes only parts, so from the second push on the Sender pushes as
    rank 0 of a 1-rank sharded update: each rank is sent only its parts, written straight into
    its parameters. `rank-0-of-1` pushes that way from the first step (push(rank=0, world=1)).
    Before every step after the first both ranks lend their memory (release and resume of
    "weights"): the pushes still go through the kept sessions (once both are sharded ones).
    After every push each rank holds exactly its slices of the trainer's weights, bit for bit,
    written in place, at the pushed version, and a rank sent only its parts moved only those."""
    torch = _requirements("dense")
    sys.path.insert(0, str(HERE))
    from rl_model_process import tp_slice
    world = 2
    ranks = [peers(f"rollout tp rank {r}", ["rollout", "dense", "auto", str(1 + r),
                                            f"tp={r}/{world}"]) for r in range(world)]
    trainer = peers("trainer", ["trainer", "dense", "auto", "3"] +
                    (["rank=0/1"] if pieces else []))
    everyone = ranks + [trainer]
    try:
        ready = [r.answer(START_TIMEOUT_S) for r in ranks]
        ready_t = trainer.answer(START_TIMEOUT_S)
        assert all(x["names"] == ready_t["names"] for x in ready), "the ranks' names differ"
        trainer.ask("connect " + ",".join(f"127.0.0.1:{x['port']}" for x in ready))
        previous = None
        for step in range(1, STEPS + 1):
            if step > 1:
                for r in ranks:
                    _lend(r, step, True)
            t_path = tmp_path / f"trainer-step{step}.pt"
            report = trainer.ask(f"step {step} {t_path}")
            outcomes = report["receivers"]
            assert len(outcomes) == world, report
            as_rank = pieces or step > 1  # the parts alone, as rank 0 of 1
            for r, x in enumerate(outcomes):
                assert x["committed"], f"step {step}, rank {r}: {x['error']}"
                assert x["transport"] == "cuda_ipc", (step, r, x)
                if as_rank:
                    assert x["direct"], (
                        f"step {step}, rank {r}: the rank's parts were not written in place: {x}")
                    assert x["rank_bytes"] == [x["needed_bytes"]], (step, r, x)
                    assert 0 < x["needed_bytes"] < ready_t["bytes"], (
                        f"step {step}, rank {r}: sent {x['needed_bytes']} bytes of a model of "
                        f"{ready_t['bytes']}: not only its parts")
                else:
                    assert x["reads_in_place"], (
                        f"step {step}, rank {r}: a rank's slices from a whole trainer are read "
                        f"in place with the defaults: {x}")
                # The second push of a whole trainer opens its sessions as rank 0 of 1.
                if step > (1 if pieces else 2):
                    assert x["reused_session"], (
                        f"step {step}, rank {r}: the kept session was not reused after the lend")
            t_state = torch.load(t_path)["state"]
            if previous is not None:
                assert any(not torch.equal(_bits(t_state[n]), _bits(previous[n]))
                           for n in t_state), f"step {step}: the optimizer changed nothing"
            for r, rank in enumerate(ranks):
                r_path = tmp_path / f"rank{r}-step{step}.pt"
                seen = rank.ask(f"logits {r_path}")
                assert seen["version"] == step, f"step {step}, rank {r}: publishes {seen}"
                assert seen["pointers_unchanged"], (step, r, seen["moved"])
                r_state = torch.load(r_path)["state"]
                wrong = [n for n, t in t_state.items()
                         if not torch.equal(_bits(r_state[n]), _bits(tp_slice(n, t, r, world)))]
                stale = [n for n in wrong if previous is not None and torch.equal(
                    _bits(r_state[n]), _bits(tp_slice(n, previous[n], r, world)))]
                assert not wrong, (
                    f"step {step}, rank {r}: after a committed push the rank's slices differ "
                    f"from the trainer's in {len(wrong)} of {len(t_state)} tensors, "
                    f"{len(stale)} of them still the previous step's: {wrong[:8]}")
                r_path.unlink()
            previous = t_state
            t_path.unlink()
    except (PeerError, AssertionError) as e:
        raise _with_logs(e, everyone) from None
