#!/usr/bin/env bash
# The tree stays as clang-format (.clang-format: Google, 120 columns) writes
# it: a file that differs is named, with the command that fixes it.
#   tests/structure/check_format.sh SOURCE_DIR
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "check_format: clang-format not found (Debian: clang-format; scripts/setup installs it): skipped"
  exit 77
fi
bad=0
while IFS= read -r f; do
  if ! "$fmt" --dry-run -Werror "$f" > /dev/null 2>&1; then
    echo "check_format: $f is not formatted: $fmt -i $f"
    bad=1
  fi
done < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' '*.c' 2>/dev/null | grep -v '^tests/structure/thread_safety_violation.cc$' ||
         find include common io codec image hdf5 formats convert loader gpu trainer daemon capi cli bench tests \
           \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.c' \) -print)
[ $bad -eq 0 ] && echo "check_format: every source file is as clang-format writes it"
exit $bad
