#!/usr/bin/env bash
# scripts/run.sh on a copy of the source tree with an injected configure error, then an injected compile error: each
# must be printed, stop the job before anything runs under mpirun, and exit non-zero.
#   run_shows_build_errors.sh SOURCE_DIR
set -uo pipefail
src=$1
git -C "$src" rev-parse --git-dir >/dev/null 2>&1 || { echo "SKIPPED: $src is not a git checkout"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The copy: what a fresh clone has, plus this checkout's uncommitted edits (tracked and new files).
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 tar cf - 2>/dev/null) | tar xf - -C "$work"
fail() { echo "FAIL: $*"; echo "--- run.sh output:"; cat "$work/out.txt"; exit 1; }

check() {  # name marker
  local name=$1 marker=$2 rc
  echo "== $name"
  (cd "$work" && KVCOMM_BUILD_DIR="$work/build" timeout 600 ./scripts/run.sh) >"$work/out.txt" 2>&1
  rc=$?
  [ "$rc" != 0 ] || fail "$name: run.sh exited 0"
  [ "$rc" != 124 ] || fail "$name: run.sh did not stop within 600 s"
  grep -q "$marker" "$work/out.txt" || fail "$name: the error ('$marker') is not in run.sh's output"
  ! grep -q "^== \[1/" "$work/out.txt" || fail "$name: run.sh went on to run its steps after the error"
  grep -q "run.sh: FAILED: the build" "$work/out.txt" || fail "$name: run.sh's last line does not say the build failed"
  echo "ok: exit $rc, the error is shown:"
  grep -m3 "$marker" "$work/out.txt"
}

cp "$work/CMakeLists.txt" "$work/CMakeLists.txt.orig"
sed -i '/^project(/a message(FATAL_ERROR "kvcomm-injected-configure-error")' "$work/CMakeLists.txt"
check "injected configure error" "kvcomm-injected-configure-error"

mv "$work/CMakeLists.txt.orig" "$work/CMakeLists.txt"
rm -rf "$work/build"
echo '#error "kvcomm-injected-compile-error"' >>"$work/src/common/error.cpp"
check "injected compile error" "kvcomm-injected-compile-error"
