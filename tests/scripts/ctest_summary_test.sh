#!/usr/bin/env bash
# scripts/ctest_summary.py (the end of test.sh's ctest job) over a real CTest run of a tiny project: a test that
# passes, one that fails, one CTest cannot start, one skipped by its exit code and one by its output. The counts line
# must count each where it belongs (a test that could not start is a failure, never a skip), name every failed and
# skipped test, and give each skipped one the reason its output states.
#   ctest_summary_test.sh SOURCE_DIR
set -uo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/p"
cat >"$work/p/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(summary NONE)
enable_testing()
add_test(NAME t.passes COMMAND sh -c "echo fine")
add_test(NAME t.fails COMMAND sh -c "echo broken; exit 1")
add_test(NAME t.missing COMMAND /nonexistent/kvcomm-no-such-program)
add_test(NAME t.skips_by_code COMMAND sh -c "echo 'SKIPPED: no widget on this machine'; exit 77")
set_tests_properties(t.skips_by_code PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME t.skips_by_output COMMAND sh -c "printf 'x.cpp:7: Skipped\\nneeds a GPU\\n[  SKIPPED ] T.t (0 ms)\\n'")
set_tests_properties(t.skips_by_output PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED")
CM
cmake -S "$work/p" -B "$work/b" >/dev/null || { echo "FAIL: configure"; exit 1; }
ctest --test-dir "$work/b" --output-junit "$work/j.xml" >/dev/null 2>&1
out=$(python3 "$src/scripts/ctest_summary.py" "$work/j.xml")
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ "$(echo "$out" | tail -1)" = "ctest: 1 passed, 2 failed, 2 skipped" ] || fail "wrong counts line"
echo "$out" | grep -q "^  t.fails$" || fail "the failed test is not named"
echo "$out" | grep -q "^  t.missing (not run: " || fail "a test CTest could not start is not a failure"
echo "$out" | grep -Eq "^  t.skips_by_code +no widget on this machine$" || fail "skip reason (exit code) missing"
echo "$out" | grep -Eq "^  t.skips_by_output +needs a GPU$" || fail "skip reason (output) missing"
echo "ok"
