#!/usr/bin/env bash
# Nodes on hosts of their own: each node of a job in its own network namespace, joined by veth
# pairs (iproute2). A link with 20 ms latency and 1 % loss (tc netem) gives the bytes of a job
# on loopback; a stranger in a third namespace cannot join, crash or stop it, nor do its idle
# connections and connect-and-hang-up floods during the join; a partition (link down) mid-job
# ends it on every node, naming the lost node, within the heartbeat timeout.
# Usage: netns_job.sh ZMUON_LAUNCH. Exit 77 (ctest: skipped) where namespaces cannot be made.
set -u
launch=$1
skip() { echo "SKIPPED: $* (the namespace tests did not run)"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no ip command (iproute2)"
tag="zm$$"
a="${tag}a" b="${tag}b" c="${tag}c"
work=$(mktemp -d)
cleanup() {
  for ns in "$a" "$b" "$c"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a" 2>"$work/err" || skip "cannot create a network namespace: $(cat "$work/err")"
ip netns add "$b" && ip netns add "$c" || skip "cannot create network namespaces"
# a (node 0, 10.91.0.1) <-> b (node 1, 10.91.0.2); a (10.92.0.1) <-> c (the stranger, 10.92.0.2)
ip link add "${tag}ab" netns "$a" type veth peer name "${tag}ba" netns "$b" \
  || skip "cannot create veth pairs"
ip link add "${tag}ac" netns "$a" type veth peer name "${tag}ca" netns "$c" || skip "no veth"
ip -n "$a" addr add 10.91.0.1/24 dev "${tag}ab"
ip -n "$b" addr add 10.91.0.2/24 dev "${tag}ba"
ip -n "$a" addr add 10.92.0.1/24 dev "${tag}ac"
ip -n "$c" addr add 10.92.0.2/24 dev "${tag}ca"
for ns in "$a" "$b" "$c"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${tag}ab" up; ip -n "$b" link set "${tag}ba" up
ip -n "$a" link set "${tag}ac" up; ip -n "$c" link set "${tag}ca" up
ip -n "$c" route add 10.91.0.0/24 via 10.92.0.1
netem=yes
if ! ip netns exec "$a" tc qdisc add dev "${tag}ab" root netem delay 20ms loss 1% 2>"$work/err" \
   || ! ip netns exec "$b" tc qdisc add dev "${tag}ba" root netem delay 20ms loss 1% 2>>"$work/err"; then
  netem=no
  echo "NOTE: no tc netem here ($(head -1 "$work/err")): the link runs without latency and loss"
fi

cd "$work"
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
job="--steps 5 --ranks-per-node 1 --seed 5 --set zmuon.timeout_ms=30000"
echo "== reference: the same job on loopback"
"$launch" --local-nodes 2 $job --save-params ref.safetensors > ref.log 2>&1 \
  || fail "the loopback job: $(tail -3 ref.log)"

echo "== two namespaces (netem: $netem), a stranger in a third"
ip netns exec "$a" env ZMUON_JOB_SECRET="$secret" timeout 120 "$launch" --nodes 2 --node-rank 0 \
  --master 10.91.0.1:29651 $job --save-params ns.safetensors > node0.log 2>&1 &
n0=$!
sleep 1
# The stranger: another secret, then junk and a 4 GiB header before any handshake.
ip netns exec "$c" env ZMUON_JOB_SECRET="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" timeout 60 "$launch" \
  --nodes 2 --node-rank 1 --master 10.91.0.1:29651 $job --set zmuon.timeout_ms=3000 \
  > stranger.log 2>&1 && fail "the stranger joined: $(cat stranger.log)"
ip netns exec "$c" bash -c 'exec 3<>/dev/tcp/10.91.0.1/29651; printf "\0\0\0\0\377\377\377\377%024d" 0 >&3; exec 3>&-' 2>/dev/null
ip netns exec "$c" bash -c 'exec 3<>/dev/tcp/10.91.0.1/29651; head -c 4096 /dev/urandom >&3; exec 3>&-' 2>/dev/null
ip netns exec "$b" env ZMUON_JOB_SECRET="$secret" timeout 120 "$launch" --nodes 2 --node-rank 1 \
  --master 10.91.0.1:29651 $job > node1.log 2>&1
rc1=$?
wait $n0
rc0=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "the job: node 0 $rc0, node 1 $rc1: $(tail -3 node0.log node1.log)"
grep -q "refused a connection from 10.92.0.2" node0.log || fail "no refusal logged: $(cat node0.log)"
cmp -s ref.safetensors ns.safetensors || fail "the weights differ from the loopback job's"
echo "ok: bit-identical to loopback; the stranger was refused ($(grep -c 'refused a connection' node0.log) connections)"

echo "== floods during the join: 300 idle connections and ~1,000 hang-ups a second from the stranger"
if command -v python3 >/dev/null; then
  ip netns exec "$a" env ZMUON_JOB_SECRET="$secret" timeout 120 "$launch" --nodes 2 --node-rank 0 \
    --master 10.91.0.1:29653 $job > flood0.log 2>&1 &
  f0=$!
  sleep 1
  ip netns exec "$c" timeout 60 python3 - 10.91.0.1 29653 > flood.log 2>&1 <<'PY' &
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
idle = []
for _ in range(300):
    try:
        idle.append(socket.create_connection((host, port), timeout=2))
    except OSError:
        pass
open("flood.ready", "w").close()
sent, until = 0, time.time() + 8
while time.time() < until:
    try:
        socket.create_connection((host, port), timeout=2).close()
        sent += 1
    except OSError:
        pass
    time.sleep(0.001)
still = 0
for s in idle:
    s.settimeout(0.5)
    try:
        still += s.recv(1) != b""
    except socket.timeout:
        still += 1
    except OSError:
        pass
print("idle", len(idle), "still open", still, "hang-ups", sent)
PY
  fl=$!
  for _ in $(seq 200); do [ -e flood.ready ] && break; sleep 0.1; done  # idle ones in, flood on
  ip netns exec "$b" env ZMUON_JOB_SECRET="$secret" timeout 120 "$launch" --nodes 2 --node-rank 1 \
    --master 10.91.0.1:29653 $job > flood1.log 2>&1
  r1=$?
  wait $f0; r0=$?
  wait $fl
  [ $r0 = 0 ] && [ $r1 = 0 ] || fail "the flooded job: node 0 $r0, node 1 $r1: $(tail -3 flood0.log flood1.log)"
  grep -q "was lost" flood0.log flood1.log && fail "a node was called lost: $(grep 'was lost' flood0.log flood1.log)"
  grep -q "from: 10.92.0.2" flood0.log || fail "node 0 does not name the stranger: $(tail -5 flood0.log)"
  grep -q "still open 0 " flood.log || fail "stranger connections outlived the join: $(cat flood.log)"
  echo "ok: the job finished under the floods ($(cat flood.log)); $(grep -o 'refused [0-9]* connections.*' flood0.log)"
else
  echo "NOTE: no python3: the floods did not run"
fi

echo "== a partition mid-job"
long="--steps 100000 --ranks-per-node 1 --seed 5 --set zmuon.heartbeat_timeout_ms=2000"
ip netns exec "$a" env ZMUON_JOB_SECRET="$secret" timeout 120 "$launch" --nodes 2 --node-rank 0 \
  --master 10.91.0.1:29652 $long > part0.log 2>&1 &
p0=$!
ip netns exec "$b" env ZMUON_JOB_SECRET="$secret" timeout 120 "$launch" --nodes 2 --node-rank 1 \
  --master 10.91.0.1:29652 $long > part1.log 2>&1 &
p1=$!
for _ in $(seq 300); do grep -q "^step    3 " part0.log && break; sleep 0.1; done
grep -q "^step    3 " part0.log || fail "the job did not reach step 3: $(tail -3 part0.log part1.log)"
start=$(date +%s%N)
ip -n "$a" link set "${tag}ab" down
wait $p0; r0=$?
wait $p1; r1=$?
took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $r0 != 0 ] && [ $r1 != 0 ] || fail "a node exited 0 after the partition ($r0, $r1)"
grep -q "node 1 (rank 1) lost" part0.log || fail "node 0 does not name node 1: $(tail -3 part0.log)"
grep -q "node 0 (rank 0) lost" part1.log || fail "node 1 does not name node 0: $(tail -3 part1.log)"
[ "$took_ms" -lt 10000 ] || fail "the nodes took ${took_ms} ms to stop (heartbeat timeout 2000 ms)"
echo "ok: both nodes stopped ${took_ms} ms after the link went down (exit $r0 and $r1), each naming the other"
