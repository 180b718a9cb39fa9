# Sourced by the network-namespace tests: `netns_hosts N PREFIX` makes N namespaces on one bridge that stand for hosts
# (each its own veth interface and address on $net.0/24, no shared loopback) and sets ns[i] (namespace), ifs[i]
# (interface), net, work (a scratch directory); everything is removed at exit. `skip` exits 77 (CTest: skipped)
# saying why, when namespaces or a bridge cannot be made here (not root, no iproute2).
skip() { echo "SKIPPED: $*"; exit 77; }
netns_hosts() {  # hosts prefix (3 letters: names stay under the 15-byte interface limit)
  local hosts=$1 p=$2 i n
  [ "$(id -u)" = 0 ] || skip "network namespaces need root"
  command -v ip >/dev/null || skip "ip (iproute2) is not installed"
  tag=$$
  sw=${p}s$tag
  net="10.$((100 + tag % 100)).$((tag % 250))"
  work=$(mktemp -d)
  ns=() ifs=()
  trap netns_cleanup EXIT
  err=$(ip netns add "$sw" 2>&1) || skip "ip netns add failed: $err"
  err=$(ip -n "$sw" link add br0 type bridge 2>&1) || skip "a bridge cannot be made here: $err"
  ip -n "$sw" link set br0 up || skip "bridge up failed"
  for ((i = 0; i < hosts; i++)); do
    n=${p}h$i$tag; ns+=("$n"); ifs+=("${p}e$i$tag")
    ip netns add "$n" || skip "namespace $n failed"
    err=$(ip link add "${p}e$i$tag" type veth peer name "${p}p$i$tag" 2>&1) || skip "veth pair failed: $err"
    ip link set "${p}e$i$tag" netns "$n" && ip link set "${p}p$i$tag" netns "$sw" || skip "moving veth ends failed"
    ip -n "$sw" link set "${p}p$i$tag" master br0 && ip -n "$sw" link set "${p}p$i$tag" up || skip "bridge port failed"
    ip -n "$n" addr add "$net.$((i + 1))/24" dev "${p}e$i$tag" || skip "address failed"
    ip -n "$n" link set lo up && ip -n "$n" link set "${p}e$i$tag" up || skip "link up failed"
  done
}
netns_cleanup() {
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null; done
  ip netns del "$sw" 2>/dev/null
  rm -rf "$work"
}
