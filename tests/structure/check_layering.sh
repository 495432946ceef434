#!/usr/bin/env bash
# The modules' layering (docs/architecture.md): a module includes only its own
# headers and those of the modules below it; include/gpufeed/*.h, the public
# contracts, belong to the module that implements them. An upward include is
# reported with the file and line, and fails this test.
#   common < hdf5io/{io, codec, image} < hdf5io/hdf5 < loader < gpu < trainer
#   io, image < hdf5io/formats;  hdf5, formats < hdf5io/sources < hdf5io/convert
#   loader < loader/remote (the daemon's wire and client);  sources, remote < loader/door (OpenBatchSource)
#   gpu, door < gpu/session (Session: what a consumer iterates)
#   sources, remote < daemon (the server);  capi, cli: anything
#   bench: the public headers (include/gpufeed/) and its own only
#   tests/structure/check_layering.sh SOURCE_DIR
set -euo pipefail
src=${1:-$(dirname "$0")/../..}
cd "$src"

declare -A allowed=(
  [common]="common"
  [io]="common io"
  [codec]="common codec"
  [image]="common image"
  [hdf5]="common io codec image hdf5"
  [formats]="common io image formats"
  [sources]="common io codec image hdf5 formats sources"
  [convert]="common io codec image hdf5 formats sources convert"
  [loader]="common io codec image hdf5 loader"
  [remote]="common io codec image hdf5 loader remote"
  [door]="common io codec image hdf5 formats sources loader remote door"
  [gpu]="common io codec image hdf5 loader gpu"
  [session]="common io codec image hdf5 formats sources loader remote door gpu session"
  [trainer]="common io codec image hdf5 loader gpu trainer"
  [daemon]="common io codec image hdf5 formats sources loader remote daemon"
)
# Each module's folder.
declare -A folder=(
  [common]=common [io]=hdf5io/io [codec]=hdf5io/codec [image]=hdf5io/image [hdf5]=hdf5io/hdf5
  [formats]=hdf5io/formats [sources]=hdf5io/sources [convert]=hdf5io/convert
  [loader]=loader [remote]=loader/remote [door]=loader/door
  [gpu]=gpu [session]=gpu/session [trainer]=trainer [daemon]=daemon
)
# The module an include path (from the source root) names: the module whose
# folder is its longest leading part.
module_of_path() {
  local p=$1 best="" m
  for m in "${!folder[@]}"; do
    case "$p" in "${folder[$m]}"/*)
      [ ${#folder[$m]} -gt ${#best} ] && best=${folder[$m]} && found=$m ;;
    esac
  done
  [ -n "$best" ] && echo "$found" || echo unknown
}
# Which module implements each public header.
owner_of_public() {
  case "$1" in
    status.h|dtype.h|names.h|crop_rect.h|chunk_source.h|sample_decoder.h|field_spec.h|logger.h|version.h) echo common ;;
    page_cache.h|file_list.h) echo io ;;
    decode_options.h) echo image ;;
    dataset.h|fields.h|encoded.h|writer.h|inspect.h|stats.h) echo hdf5 ;;
    sample_source.h) echo formats ;;
    convert.h) echo convert ;;
    local_source.h) echo sources ;;
    loader.h) echo loader ;;
    remote_loader.h) echo remote ;;
    open_source.h) echo door ;;
    gpu_feed.h|device.h|hw_timing.h) echo gpu ;;
    session.h) echo session ;;
    trainer.h) echo trainer ;;
    server.h|daemon_testing.h) echo daemon ;;
    c_api.h) echo capi ;;
    *) echo unknown ;;
  esac
}

bad=0
check() {  # check FILE MODULE
  local file=$1 module=$2 line inc target
  while IFS=: read -r line inc; do
    inc=${inc#*\"}; inc=${inc%\"*}
    case "$inc" in
      gpufeed/*) target=$(owner_of_public "${inc#gpufeed/}") ;;
      */*) target=$(module_of_path "$inc") ;;
      *) continue ;;
    esac
    [ "$target" = "$module" ] && continue
    if [ "$target" = unknown ] || [[ " ${allowed[$module]} " != *" $target "* ]]; then
      echo "$file:$line: $module includes \"$inc\" ($target is not below $module)"
      bad=1
    fi
  done < <(grep -n '^#include "' "$file" || true)
}
for module in "${!allowed[@]}"; do
  for f in "${folder[$module]}"/*.h "${folder[$module]}"/*.cc "${folder[$module]}"/*.cu "${folder[$module]}"/*.cuh; do
    [ -f "$f" ] || continue
    case "$f" in *_test.cc) continue ;; esac
    check "$f" "$module"
  done
done
for f in include/gpufeed/*.h; do
  module=$(owner_of_public "$(basename "$f")")
  [ -n "${allowed[$module]:-}" ] || continue
  check "$f" "$module"
done
# bench/ is a client of the public API (docs/practices.md, 10: thin executables), and of
# the header-only checked locks (common/mutex.h, thread_annotations.h,
# first_error.h: no library internals), so its threads' state is checked too.
for f in bench/*.h bench/*.cc; do
  while IFS=: read -r line inc; do
    inc=${inc#*\"}; inc=${inc%\"*}
    case "$inc" in gpufeed/*|bench/*|common/mutex.h|common/thread_annotations.h|common/first_error.h) ;; *)
      echo "$f:$line: bench includes \"$inc\" (bench uses include/gpufeed/ only: make it API or a testing hook)"
      bad=1 ;;
    esac
  done < <(grep -n '^#include "' "$f" || true)
done
if [ $bad -ne 0 ]; then
  echo "check_layering: upward includes above; move the code down or the contract into the lower module"
  exit 1
fi
echo "check_layering: every include of ${!allowed[*]} points down; bench uses the public API"
