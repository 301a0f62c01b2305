#!/usr/bin/env bash
# tests/session/multihost_netns.sh: multi-host push over UCX tcp. Six network namespaces (two
# senders, four receivers) joined by veth pairs, each receiver on its own address; one `ferry push
# --transport ucx` (UCX_TLS=tcp) updates all four, every receiver commits, and every receiver's
# fingerprints equal those of a reference receiver that got the same weights over the inline path.
# Then a sharded trainer of two ranks, one per sender namespace (`ferry push --rank R --world 2`,
# dim-0 row blocks), pushes the next version into the same four receivers over UCX: every
# receiver commits it from both ranks, bit-identical to the reference's unsharded push.
# Needs root (ip netns); exits 77 (skipped) with a message where that is not permitted.
set -u
FERRY=${FERRY_EXE:?FERRY_EXE must name the ferry executable}
TAG="fy$$"
WORK=$(mktemp -d)
PIDS=()
NSES=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 0.2
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for ns in "${NSES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

die() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do echo "--- $f" >&2; tail -n 30 "$f" >&2; done
  exit 1
}

if ! ip netns add "${TAG}probe" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root / CAP_SYS_ADMIN and iproute2)"
  exit 77
fi
ip netns del "${TAG}probe"
if ! "$FERRY" plugins 2>/dev/null | grep -q "ucx"; then
  echo "SKIP: the ucx transport plugin is not built (libucx-dev missing)"
  exit 77
fi

SENDER="${TAG}s"
ip netns add "$SENDER" && NSES+=("$SENDER") || die "ip netns add $SENDER"
ip -n "$SENDER" link set lo up
# The second rank of the sharded push: its own namespace, its own link to every receiver.
SENDER2="${TAG}t"
ip netns add "$SENDER2" && NSES+=("$SENDER2") || die "ip netns add $SENDER2"
ip -n "$SENDER2" link set lo up
# A veth pair between sender namespace $1 (device $3, address $5.1) and receiver namespace $2
# (device $4, address $5.2), subnet $5.0/24.
veth_pair() {  # sender_ns receiver_ns sender_dev receiver_dev subnet
  ip link add "$3" netns "$1" type veth peer name "$4" netns "$2" || die "veth pair $3 - $4"
  ip -n "$1" addr add "$5.1/24" dev "$3"
  ip -n "$2" addr add "$5.2/24" dev "$4"
  ip -n "$1" link set "$3" up
  ip -n "$2" link set "$4" up
}
for i in 1 2 3 4; do
  ns="${TAG}r$i"
  ip netns add "$ns" && NSES+=("$ns") || die "ip netns add $ns"
  ip -n "$ns" link set lo up
  # One veth pair per receiver: 10.77.i.1 (sender side) <-> 10.77.i.2 (receiver).
  veth_pair "$SENDER" "$ns" "${TAG}a$i" "${TAG}b$i" "10.77.$i"
  # Every sender address is reachable from every receiver (as on a real network): UCX offers all
  # of the sender's interfaces in its worker address.
  ip -n "$ns" route add 10.77.0.0/16 via "10.77.$i.1" dev "${TAG}b$i"
  # The second sender: 10.78.i.1 <-> 10.78.i.2, and the receiver's serving address through it.
  veth_pair "$SENDER2" "$ns" "${TAG}c$i" "${TAG}d$i" "10.78.$i"
  ip -n "$SENDER2" route add "10.77.$i.0/24" via "10.78.$i.2" dev "${TAG}c$i"
  ip -n "$ns" route add 10.78.0.0/16 via "10.78.$i.1" dev "${TAG}d$i"
done

start_receiver() {  # ns host name
  local ns=$1 host=$2 name=$3
  local cmd=("$FERRY" --log-level info --set update.apply_threads=1 serve --host "$host" --port 0
             --model-family dense --ready-file "$WORK/$name.ready")
  if [ -n "$ns" ]; then
    ip netns exec "$ns" env UCX_TLS=tcp "${cmd[@]}" >"$WORK/$name.log" 2>&1 &
  else
    "${cmd[@]}" >"$WORK/$name.log" 2>&1 &
  fi
  PIDS+=($!)
}

for i in 1 2 3 4; do start_receiver "${TAG}r$i" "10.77.$i.2" "r$i"; done
start_receiver "" 127.0.0.1 ref
for name in r1 r2 r3 r4 ref; do
  for _ in $(seq 1 300); do [ -s "$WORK/$name.ready" ] && break; sleep 0.1; done
  [ -s "$WORK/$name.ready" ] || die "receiver $name did not start"
done
port() { tr -d '\n' <"$WORK/$1.ready"; }

TO="10.77.1.2:$(port r1),10.77.2.2:$(port r2),10.77.3.2:$(port r3),10.77.4.2:$(port r4)"
SYN=(--synthetic --hidden 128 --layers 2 --vocab 512 --version 5 --bucket-mb 1)
ip netns exec "$SENDER" env UCX_TLS=tcp "$FERRY" --log-level info push --to "$TO" \
  --transport ucx "${SYN[@]}" >"$WORK/push.log" 2>&1 || die "ferry push over ucx failed"
[ "$(grep -c 'committed version 5 via ucx' "$WORK/push.log")" = 4 ] ||
  die "not every receiver committed over ucx"
"$FERRY" --log-level warn push --to "127.0.0.1:$(port ref)" --transport inline "${SYN[@]}" \
  >"$WORK/push-ref.log" 2>&1 || die "reference push failed"

fingerprints() {  # ns host port
  local ns=$1 host=$2 p=$3
  if [ -n "$ns" ]; then
    ip netns exec "$ns" curl -sf "http://$host:$p/get_fingerprints"
  else
    curl -sf "http://$host:$p/get_fingerprints"
  fi | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["weight_version"], json.dumps(d["fingerprints"], sort_keys=True))'
}
REF=$(fingerprints "" 127.0.0.1 "$(port ref)") || die "reference fingerprints"
[ -n "$REF" ] || die "reference has no fingerprints"
for i in 1 2 3 4; do
  GOT=$(fingerprints "${TAG}r$i" "10.77.$i.2" "$(port "r$i")") || die "fingerprints of r$i"
  [ "$GOT" = "$REF" ] || die "receiver r$i (10.77.$i.2) differs from the reference"
done
echo "PASS: 4 receivers in 4 namespaces committed version 5 over UCX tcp, bit-identical"
grep 'pushed' "$WORK/push.log"

# A sharded trainer: rank 0 in the first sender namespace, rank 1 in the second, side by side.
SYN6=(--synthetic --hidden 128 --layers 2 --vocab 512 --version 6 --bucket-mb 1)
ip netns exec "$SENDER" env UCX_TLS=tcp "$FERRY" --log-level info push --to "$TO" \
  --transport ucx "${SYN6[@]}" --rank 0 --world 2 >"$WORK/rank0.log" 2>&1 &
RANK0=$!
ip netns exec "$SENDER2" env UCX_TLS=tcp "$FERRY" --log-level info push --to "$TO" \
  --transport ucx "${SYN6[@]}" --rank 1 --world 2 >"$WORK/rank1.log" 2>&1 &
RANK1=$!
wait "$RANK0" || die "rank 0 of the sharded push over ucx failed"
wait "$RANK1" || die "rank 1 of the sharded push over ucx failed"
for r in 0 1; do
  [ "$(grep -c 'committed version 6 via ucx' "$WORK/rank$r.log")" = 4 ] ||
    die "rank $r: not every receiver committed the sharded version over ucx"
done
"$FERRY" --log-level warn push --to "127.0.0.1:$(port ref)" --transport inline "${SYN6[@]}" \
  >"$WORK/push-ref6.log" 2>&1 || die "reference push of version 6 failed"
REF=$(fingerprints "" 127.0.0.1 "$(port ref)") || die "reference fingerprints of version 6"
for i in 1 2 3 4; do
  GOT=$(fingerprints "${TAG}r$i" "10.77.$i.2" "$(port "r$i")") || die "fingerprints of r$i"
  [ "$GOT" = "$REF" ] || die "receiver r$i differs from the reference after the sharded push"
done
echo "PASS: 2 sender ranks in 2 namespaces pushed version 6 into 4 receivers over UCX tcp, bit-identical"
grep 'sharded update' "$WORK/rank0.log" | head -1
exit 0
