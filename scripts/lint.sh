#!/usr/bin/env bash
# Formatting check (clang-format, the project's .clang-format) over every C++/CUDA source; exit 1 on a diff.
#   scripts/lint.sh          check
#   scripts/lint.sh --fix    rewrite in place
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "lint: clang-format not installed (scripts/install-deps.sh)"; exit 1; }
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.hpp' '*.cpp' '*.cu' '*.cuh' '*.h' | sort -u)
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run --Werror "${files[@]}"
echo "lint: ${#files[@]} files formatted"
