#!/usr/bin/env bash
# Commands and claims of docs/getting-started.md, run as written:
#   - the fallback demo block ("To see the same step through the fallback"), with build/ replaced by this build and
#     --allow-run-as-root added as root, as its comment says: the mode line must say fallback;
#   - kvcomm-info's defaults: on 8 ranks --tp 4 gives pcp 2, --pcp 8 gives tp 1, no flags give tp 2 pcp 4.
#   guide_commands.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
status=0
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
block=$(awk '/To see the same step through the fallback/{f=1} f&&/^```bash/{c=1;next} c&&/^```/{exit} c' \
        "$src/docs/getting-started.md")
[ -n "$block" ] || { echo "FAIL: the fallback demo block was not found in the guide"; exit 1; }
script=${block//build\/tools\//$build/tools/}
script=${script//mpirun -np 2/mpirun ${root[*]} --oversubscribe -np 2}
out=$(bash -c "set -e; $script" 2>&1); rc=$?
if [ "$rc" = 0 ] && grep -q "mode: fallback (KVCOMM_DIRECT=0 forces the gather+insert fallback)" <<<"$out"; then
  echo "ok   the guide's fallback demo command"
else
  echo "FAIL the guide's fallback demo command (exit $rc):"; echo "$script"; echo "$out" | tail -8; status=1
fi

info() {  # expected-layout-line flags...
  local want=$1; shift
  local out
  out=$(timeout 120 mpirun "${root[@]}" --oversubscribe --bind-to none -np 8 "$build/tools/kvcomm-info" "$@" 2>&1)
  if grep -q "^$want " <<<"$out"; then echo "ok   kvcomm-info $* on 8 ranks: $want"; else
    echo "FAIL kvcomm-info $* on 8 ranks: want '$want'"; echo "$out" | grep -E "layout|kvcomm-info" | head -3
    status=1
  fi
}
info "layout tp=4 pcp=2 pp=1 dp=1" --tp 4
info "layout tp=1 pcp=8 pp=1 dp=1" --pcp 8
info "layout tp=2 pcp=4 pp=1 dp=1"
exit $status
