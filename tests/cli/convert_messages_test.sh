#!/usr/bin/env bash
# What `gpufeed convert` (and inspect, bench loader) say to a new user's mistakes: a .h5 that is not
# HDF5, an empty folder, a folder without --size or --keep-encoded; and
# --keep-encoded --skip-corrupt leaving out (and counting) a file that is no
# image where --keep-encoded alone fails naming it.
# Usage: convert_messages_test.sh GPUFEED_CLI
set -euo pipefail
cli="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
expect_fail() {  # expect_fail TEXT ARGS...: the command fails and says TEXT
  local text=$1; shift
  local out
  if out=$("$cli" "$@" 2>&1); then echo "expected a failure: $*"; exit 1; fi
  grep -qF -- "$text" <<<"$out" || { echo "'$*' said: $out"; echo "expected: $text"; exit 1; }
}
echo "hello" >"$dir/not.h5"
expect_fail "named like an HDF5 file but it has no HDF5 signature" convert "$dir/not.h5" -o "$dir/o.h5"
mkdir -p "$dir/empty"
expect_fail "no class subfolders" convert "$dir/empty" -o "$dir/o.h5"
mkdir -p "$dir/imgs/a"
# A 1x1 grey PNG and a file that is no image.
printf '\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00\x00:~\x9bU\x00\x00\x00\nIDATx\x9cc`\x00\x00\x00\x02\x00\x01H\xaf\xa4q\x00\x00\x00\x00IEND\xaeB`\x82' \
  >"$dir/imgs/a/one.png"
echo "junk" >"$dir/imgs/a/bad.jpg"
expect_fail "needs --size HxW (the images are decoded and resized to it), or --keep-encoded" \
  convert "$dir/imgs" -o "$dir/o.h5"
expect_fail "bad.jpg: neither a JPEG nor a PNG" convert "$dir/imgs" -o "$dir/o.h5" --keep-encoded
[ ! -e "$dir/o.h5" ] || { echo "a failed conversion left $dir/o.h5"; exit 1; }
out=$("$cli" convert "$dir/imgs" -o "$dir/o.h5" --keep-encoded --skip-corrupt --json 2>"$dir/err")
grep -q "skipped .*bad.jpg" "$dir/err" || { cat "$dir/err"; exit 1; }
/usr/bin/python3 -c 'import json, sys; j = json.loads(sys.argv[1]); assert j["samples"] == 1 and j["skipped"] == 1, j' "$out"
# inspect and bench loader meet what only convert reads (no HDF5 signature, a
# folder) with the convert command, not a crash (the corpus's files without
# a signature once reached inspect's open unprobed).
printf 'not a dataset' >"$dir/noext"
expect_fail "not an HDF5 file (no HDF5 signature" inspect "$dir/noext" --sample 0 --out "$dir/x.npy"
expect_fail "convert it first: gpufeed convert" inspect "$dir/noext"
# A folder is read as it is: inspect describes it, the loader names the file that does not decode.
"$cli" inspect "$dir/imgs" | grep -q "image folder, 2 files (JPEG/PNG) in 1 classes" || { echo "inspect of a folder"; exit 1; }
expect_fail "bad.jpg" bench loader --data "$dir/imgs" --batches 1
expect_fail "convert it first" bench loader --data "$dir/noext" --batches 1
echo "convert messages: ok"
