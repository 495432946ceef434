#!/usr/bin/env bash
# The thread-safety annotations are checked, not decoration: with clang's
# -Wthread-safety -Werror=thread-safety the annotated snippet compiles, and the
# same snippet with a guarded field written unlocked does not.
#   usage: check_thread_safety.sh SOURCE_DIR
set -uo pipefail
src=$1
clang=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$clang" ]; then echo "SKIP: no clang++ (scripts/setup installs clang)"; exit 77; fi
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety -I "$src")
"$clang" "${flags[@]}" "$src/tests/structure/thread_safety_violation.cc" || { echo "FAIL: the correct snippet was refused"; exit 1; }
if "$clang" "${flags[@]}" -DGPUFEED_VIOLATE "$src/tests/structure/thread_safety_violation.cc" 2>/tmp/tsa.$$; then
  echo "FAIL: an unlocked write to a GUARDED_BY field compiled"; exit 1
fi
grep -q "requires holding mutex" /tmp/tsa.$$ && rm -f /tmp/tsa.$$ && echo "thread-safety analysis: violation refused" && exit 0
cat /tmp/tsa.$$; rm -f /tmp/tsa.$$; exit 1
