#!/usr/bin/env bash
# Every tool and benchmark parses its command line strictly: --help prints the options and exits 0; an unknown option,
# a missing, non-numeric or out-of-range value is a usage error (exit 2, a message naming the option) before MPI or
# any allocation starts.
#   tools_usage.sh BUILD_DIR
set -uo pipefail
b=$1
status=0
expect() {  # exit-code pattern binary args...
  local code=$1 pattern=$2 bin=$3; shift 3
  local out rc
  out=$(timeout 30 "$b/$bin" "$@" 2>&1); rc=$?
  if [ "$rc" = "$code" ] && grep -qE -- "$pattern" <<<"$out"; then
    echo "ok   $bin $* -> $rc"
  else
    echo "FAIL $bin $* -> exit $rc (want $code and /$pattern/):"; echo "$out" | head -5; status=1
  fi
}
for bin in tools/kvcomm-info tools/kvcomm-demo perf/perf_publish perf/perf_symm_rendezvous perf/perf_fetch; do
  [ -x "$b/$bin" ] || { echo "FAIL $b/$bin is not built"; status=1; continue; }
  expect 0 "^usage: " "$bin" --help
  expect 0 "^options:" "$bin" -h
  expect 2 "unknown option --no-such-option" "$bin" --no-such-option
  expect 2 "unexpected argument 'stray'" "$bin" stray
done
expect 2 "--pp 0 is out of range" tools/kvcomm-info --pp 0
expect 2 "--dp 0 is out of range" tools/kvcomm-info --dp 0
expect 2 "--tp 'two' is not an integer" tools/kvcomm-info --tp two
expect 2 "option --pcp needs a value" tools/kvcomm-info --pcp
expect 2 "option --tp is given twice" tools/kvcomm-info --tp 2 --tp 2
# Alone (1 rank, no mpirun) the demo says nothing crossed processes and how to run it; never "1 ranks".
expect 0 "nothing crosses processes" tools/kvcomm-demo --tokens 16
! timeout 30 "$b/tools/kvcomm-demo" --tokens 16 2>&1 | grep -q "1 ranks" || { echo "FAIL kvcomm-demo alone says '1 ranks'"; status=1; }
expect 0 "[Ff]etch" tools/kvcomm-demo --help
expect 2 "--tokens -1 is out of range \(accepted: \[1, 65536\]\)" tools/kvcomm-demo --tokens -1
expect 2 "--tokens 10000000 is out of range" tools/kvcomm-demo --tokens 10000000
expect 2 "--tokens '' is not an integer" tools/kvcomm-demo --tokens=
expect 2 "--kind 'gpu' is not one of: cuda, host" perf/perf_publish --kind gpu
expect 2 "--tokens item '' is not an integer" perf/perf_publish --tokens 1,,2
expect 2 "--row-bytes 0 is out of range" perf/perf_publish --row-bytes 0
expect 2 "--iters 'many' is not an integer" perf/perf_publish -n many
expect 2 "--warmup_iters -1 is out of range" perf/perf_publish -w -1
expect 2 "-e 1K is smaller than -b 2K" perf/perf_publish -b 2K -e 1K
expect 2 "--minbytes '2X' is not a byte count" perf/perf_publish -b 2X
expect 2 "--stepfactor 1 is out of range" perf/perf_publish -b 1K -e 1M -f 1
expect 2 "give --tokens or -b/-e, not both" perf/perf_publish --tokens 1 -b 1K
expect 2 "--reps 0 is out of range" perf/perf_fetch --reps 0
expect 2 "--kind 'gpu' is not one of: cuda, host" perf/perf_fetch --kind gpu
expect 2 "--net-rank needs --id-file" perf/perf_fetch --net-rank 0
expect 2 "--net-rank 2 is out of range" perf/perf_fetch --net-rank 2 --id-file /tmp/x
expect 2 "--sizes-gib item 0 is out of range" perf/perf_symm_rendezvous --sizes-gib 0
expect 2 "--iters 99999999999999999999 is out of range" perf/perf_symm_rendezvous --iters 99999999999999999999
expect 2 "give --sizes-gib or -b/-e, not both" perf/perf_symm_rendezvous --sizes-gib 1 -e 2G
# A layout that does not fit the rank count is known only under mpirun: reported once, before any group is formed.
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
out=$(OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 60 mpirun "${flags[@]}" -np 4 "$b/tools/kvcomm-info" \
      --pp 3 2>&1); rc=$?
if [ "$rc" != 0 ] && [ "$(grep -c "does not fit 4 ranks" <<<"$out")" = 1 ]; then
  echo "ok   mpirun -np 4 kvcomm-info --pp 3 -> $rc, reported once"
else
  echo "FAIL mpirun -np 4 kvcomm-info --pp 3 -> exit $rc:"; echo "$out" | head -5; status=1
fi
exit $status
