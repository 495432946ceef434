#!/usr/bin/env bash
# The tree stays as clang-format (.clang-format: Google, 120 columns) writes
# it: a file that differs is named, with the command that fixes it.
# One clang-format process per 40 files, one per core (about 1 s for the
# tree; a process per file took 7 s, and much more beside other tests).
#   tests/structure/check_format.sh SOURCE_DIR
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "check_format: clang-format not found (Debian: clang-format; scripts/setup installs it): skipped"
  exit 77
fi
list_sources() {  # NUL-separated: the tracked sources, or every source where this is no git checkout
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z '*.h' '*.cc' '*.cu' '*.cuh' '*.c'
  else
    find include common io codec image hdf5 formats convert loader gpu trainer daemon capi cli bench tests \
      \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.c' \) -print0
  fi
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The file that must not compile (the thread-safety check's) is left as written.
rc=0
list_sources | grep -zv '^tests/structure/thread_safety_violation.cc$' |
  xargs -0 -r -P "$(nproc)" -n 40 "$fmt" --dry-run -Werror >/dev/null 2>"$out" || rc=$?
# clang-format says "FILE:LINE:COL: error: code should be clang-formatted" for each difference.
bad=$(sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' "$out" | sort -u)
if [ -n "$bad" ]; then
  while IFS= read -r f; do echo "check_format: $f is not formatted: $fmt -i $f"; done <<<"$bad"
  exit 1
fi
if [ "$rc" != 0 ]; then  # failed for another reason: say what clang-format said
  cat "$out" >&2
  exit 1
fi
echo "check_format: every source file is as clang-format writes it"
