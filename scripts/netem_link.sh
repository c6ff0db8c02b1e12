#!/usr/bin/env bash
# An emulated edge-cloud link on one machine: the cloud lives in network namespace `sc-cloud`
# (address 10.77.0.2), the edge in the root namespace (10.77.0.1), joined by a veth pair whose
# two ends shape traffic with `tc netem` (delay = RTT/2 each way, rate, loss).
#
#   sudo scripts/netem_link.sh up --rtt-ms 50 --up-mbit 20 --down-mbit 100 --loss 0.5
#   sudo ip netns exec sc-cloud env SPECCAP_TOKEN=$SPECCAP_TOKEN speccap serve-cloud --host 10.77.0.2
#   speccap edge --server http://10.77.0.2:8765 clip.wav
#   sudo scripts/netem_link.sh down
#
# Needs root and iproute2. Where the kernel has no netem (some VMs and containers), the link is
# rate-limited with tbf instead and the script says that delay and loss are NOT applied; for those,
# `speccap edge --emulate-link` adds the link model's delays on the client side.
set -euo pipefail

NS=sc-cloud EDGE_IF=sc-edge CLOUD_IF=sc-cloud0 EDGE_IP=10.77.0.1 CLOUD_IP=10.77.0.2
cmd=${1:-}; shift || true
rtt=50 up=20 down=100 loss=0
while [ $# -gt 0 ]; do
  case $1 in
    --rtt-ms) rtt=$2; shift 2 ;;
    --up-mbit) up=$2; shift 2 ;;
    --down-mbit) down=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    *) echo "netem_link.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

shape() {  # shape <netns-exec-prefix> <dev> <rate mbit>
  local run=$1 dev=$2 rate=$3 half
  half=$(python3 -c "print($rtt / 2)")
  if $run tc qdisc add dev "$dev" root netem delay "${half}ms" rate "${rate}mbit" loss "${loss}%" 2>/dev/null; then
    echo "$dev: netem delay ${half}ms rate ${rate}mbit loss ${loss}%"
  else
    $run tc qdisc add dev "$dev" root tbf rate "${rate}mbit" burst 32kbit latency 400ms
    echo "$dev: this kernel has no netem: rate ${rate}mbit only (tbf); delay and loss NOT applied" >&2
  fi
}

case $cmd in
  up)
    [ "$(id -u)" = 0 ] || { echo "netem_link.sh: needs root (network namespaces and tc)" >&2; exit 1; }
    ip netns add "$NS"
    ip link add "$EDGE_IF" type veth peer name "$CLOUD_IF"
    ip link set "$CLOUD_IF" netns "$NS"
    ip addr add "$EDGE_IP/24" dev "$EDGE_IF"
    ip link set "$EDGE_IF" up
    ip netns exec "$NS" ip addr add "$CLOUD_IP/24" dev "$CLOUD_IF"
    ip netns exec "$NS" ip link set "$CLOUD_IF" up
    ip netns exec "$NS" ip link set lo up
    shape "" "$EDGE_IF" "$up"                             # edge -> cloud: the uplink
    shape "ip netns exec $NS" "$CLOUD_IF" "$down"         # cloud -> edge: the downlink
    echo "cloud namespace $NS at $CLOUD_IP, edge at $EDGE_IP"
    ;;
  down)
    ip netns del "$NS" 2>/dev/null || true  # deleting the namespace removes the veth pair
    ip link del "$EDGE_IF" 2>/dev/null || true
    ;;
  *)
    echo "usage: netem_link.sh up [--rtt-ms 50] [--up-mbit 20] [--down-mbit 100] [--loss 0] | down" >&2
    exit 2
    ;;
esac
