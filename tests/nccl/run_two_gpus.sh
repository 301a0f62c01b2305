#!/usr/bin/env bash
# tests/nccl/run_two_gpus.sh: the NCCL checks on a two-GPU machine, run from a bundle made with
# `scripts/bundle --tests --out DIR` and copied to DIR/run.sh: comm smoke, the two-rank tests
# (serve logs to $OUT), `ferry bench nccl`, the Python NCCL test.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
nccl_lib=$(dirname "$(find /opt /usr -name libnccl.so.2 -path '*nvidia*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$nccl_lib:/usr/local/cuda/lib64"
B="$(cd "$(dirname "$0")" && pwd)"
nvidia-smi --query-gpu=index,name --format=csv,noheader
echo "NCCL from $nccl_lib"
export FERRY_EXE=$B/bin/ferry FERRY_TEST_PLUGIN_DIRS=$B/lib/ferry/plugins
export FERRY_NCCL_PLUGIN=$B/lib/ferry/plugins/libferry_transport_nccl.so
export FERRY_NCCL_TRAINER_PEER=$B/tests/nccl_trainer_peer FERRY_NCCL_LOG_DIR=$OUT
echo "== nccl_comm_smoke_test"
timeout 60 "$B/tests/nccl_comm_smoke_test" > "$OUT/comm_smoke.log" 2>&1; echo "exit $?"
grep -E "^\[ *(OK|FAILED|PASSED) " -A0 "$OUT/comm_smoke.log"; grep -A8 "Failure" "$OUT/comm_smoke.log" | head -30
echo "== nccl_two_rank_test"
start=$(date +%s)
timeout 240 "$B/tests/nccl_two_rank_test" --gtest_repeat=2 > "$OUT/two_rank.log" 2>&1; echo "exit $? after $(( $(date +%s) - start )) s"
grep -E "^\[ *(OK|FAILED|PASSED) |destroyed|failed|left the group" "$OUT/two_rank.log" | cut -c1-300 | tail -40
grep -A10 "Failure" "$OUT/two_rank.log" | cut -c1-400 | head -60
echo "== ferry bench nccl"
timeout 150 "$B/bin/ferry" bench nccl --json "$OUT/nccl.json" 2>&1 | tail -22
echo "== python test_nccl"
for py in /opt/torch/.venv/bin/python python3; do
  if $py -c "import pytest, numpy" 2>/dev/null; then
    (cd "$B/python" && FERRY_LIBRARY=$B/lib/libferry.so timeout 60 $py -m pytest -q tests/test_nccl.py 2>&1 | tail -5)
    break
  fi
  echo "$py: no pytest/numpy"
done
