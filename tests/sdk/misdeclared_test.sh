#!/usr/bin/env bash
# tests/sdk/misdeclared_test.sh: the transport table template refuses, at compile time, a
# transport whose declared groups and methods disagree (all or none per group) or that claims a
# capability bit directly: each case of transport_plugin_misdeclared.cpp must fail to compile
# with the static_assert message its comment names, and case 0 must compile.
# Arguments: SOURCE INCLUDE_DIR... -- COMPILER...
set -euo pipefail
source=$1; shift
includes=()
while [[ $1 != -- ]]; do includes+=("-I$1"); shift; done
shift
compiler=("$@")
fail() { echo "misdeclared_test: FAILED: $*" >&2; exit 1; }
build() { "${compiler[@]}" -std=c++20 -fsyntax-only "${includes[@]}" -DFERRY_CASE="$1" "$source" 2>&1; }

build 0 >/dev/null || fail "the well-formed baseline (case 0) does not compile: $(build 0)"
while IFS= read -r line; do
  case=${line#*FERRY_CASE == }; case=${case%% *}
  expect=${line#*\"}; expect=${expect%%\"*}
  if out=$(build "$case"); then fail "case $case compiled; expected '$expect'"; fi
  grep -qF "$expect" <<<"$out" || fail "case $case failed without '$expect':"$'\n'"$out"
  echo "case $case refused: $expect"
done < <(grep -E 'FERRY_CASE == [0-9]+ +// "' "$source")
