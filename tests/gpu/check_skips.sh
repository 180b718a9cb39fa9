#!/usr/bin/env bash
# check_skips.sh LOG... — fails (exit 1) when a GoogleTest log shows a skipped CUDA case: a backend-parameterised case
# ".../cuda" or a case of the CUDA graph suites (Graph*) or of EndpointCuda. tests/gpu/run.sh runs it on a GPU machine, where every
# CUDA case must run; skips of host-only cases (say, a 4-rank case in a 2-rank run) are allowed.
set -uo pipefail
skipped=$(grep -hE '^\[  SKIPPED \] ([^ ]*/cuda|(Graph[A-Za-z0-9]*|EndpointCuda)\.[^ ]*)( |$)' "$@" | awk '{print $4}' |
  sort -u)
if [ -n "$skipped" ]; then
  echo "check_skips: CUDA cases were skipped on a machine with a GPU (each must run here):"
  sed 's/^/  /' <<<"$skipped"
  exit 1
fi
echo "check_skips: no CUDA case was skipped"
