#!/usr/bin/env bash
# tests/conformance/staged_install_test.sh: what a vendor does with an installed ferry, against a
# staged install (meson install --destdir): pkg-config ferry-plugin from the stage (paths relative
# to the .pc file, Version = the plugin ABI), the README's hello.c built out of tree with its
# exact command line, `ferry conformance` on it with the staged ferry, then installed into the
# plugindir and found by the staged `ferry plugins` (the multiarch libdir beside the executable).
# Arguments: BUILD_DIR SOURCE_DIR PREFIX LIBDIR
set -euo pipefail
build=$1 source=$2 prefix=$3 libdir=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/stage
fail() { echo "staged_install_test: FAILED: $*" >&2; exit 1; }

meson install -C "$build" --no-rebuild --quiet --destdir "$stage" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "meson install --destdir"; }
root=$stage$prefix
export PKG_CONFIG_PATH="$root/$libdir/pkgconfig" PKG_CONFIG_LIBDIR="$root/$libdir/pkgconfig"

# The ABI version, from the header the stage holds.
major=$(sed -n 's/^#define FERRY_PLUGIN_ABI_MAJOR \([0-9]*\)$/\1/p' "$root/include/ferry/plugin.h")
minor=$(sed -n 's/^#define FERRY_PLUGIN_ABI_MINOR \([0-9]*\)$/\1/p' "$root/include/ferry/plugin.h")
[[ "$(pkg-config --modversion ferry-plugin)" == "$major.$minor" ]] ||
  fail "ferry-plugin Version is $(pkg-config --modversion ferry-plugin), the ABI is $major.$minor"
[[ "$(pkg-config --variable=abi_minor ferry-plugin)" == "$minor" ]] || fail "abi_minor variable"
pkg-config --atleast-version="$major.$minor" ferry-plugin || fail "--atleast-version"
cflags=$(pkg-config --cflags ferry-plugin)
[[ "$cflags" == *"$stage"* ]] || fail "cflags '$cflags' do not point into the stage"
plugindir=$(pkg-config --variable=plugindir ferry-plugin)
script=$(pkg-config --variable=versionscript ferry-plugin)
[[ -f "$script" ]] || fail "versionscript $script is not in the stage"
[[ "$(realpath "$plugindir")" == "$(realpath "$root/$libdir/ferry/plugins")" ]] ||
  fail "plugindir $plugindir is not the stage's $root/$libdir/ferry/plugins"

# hello.c and its build command, exactly as plugin_api/README.md has them.
readme=$source/plugin_api/README.md
awk '/^```c$/{inside=1; next} /^```$/{if (inside) exit} inside' "$readme" >"$work/hello.c"
grep -q 'libferry_transport_hello.so, the smallest conforming transport' "$work/hello.c" ||
  fail "no hello.c in $readme"
build_cmd=$(awk '/^```sh$/{inside=1; next} /^```$/{inside=0} inside' "$readme" |
  sed -n '/^cc /,/hello.c$/p' | sed 's/\\$//' | tr '\n' ' ')
[[ "$build_cmd" == cc* ]] || fail "no cc command line in $readme"
(cd "$work" && eval "$build_cmd") || fail "building hello.c: $build_cmd"

ferry=$root/bin/ferry
out=$("$ferry" conformance "$work/libferry_transport_hello.so") || { echo "$out" >&2; fail "conformance"; }
[[ "$out" == *"-> CONFORMS"* ]] || fail "conformance: $out"
count=$("$ferry" conformance --list | wc -l)
[[ "$out" == *"$count requirements: 11 passed, 0 failed, 0 skipped, 3 not applicable"* ]] ||
  fail "expected the README's '$count requirements: 11 PASS, 3 N/A': $out"

install -m 0755 "$work/libferry_transport_hello.so" "$plugindir"
listed=$(env -u FERRY_PLUGIN_PATH "$ferry" plugins 2>"$work/plugins.log")
line=$(grep '^hello ' <<<"$listed") || { echo "$listed" >&2; fail "staged ferry plugins lists no hello"; }
[[ "$line" == *"transport"*"$major.$minor"*"source"*"host"*"$(realpath "$plugindir")/libferry_transport_hello.so" ]] ||
  fail "hello line: $line"
grep -q "without vetting" "$work/plugins.log" && fail "the staged ferry did not find its vetting helper"
echo "staged_install_test: ok ($("$ferry" version | head -1), plugin ABI $major.$minor)"
