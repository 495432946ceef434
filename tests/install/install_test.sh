#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then an outside project built
# against it: find_package(gpufeed) with gpufeed::gpufeed (C++) and
# gpufeed::c_api (C), a C program through pkg-config, and the installed
# Python package finding the installed libgpufeed.so.
#   tests/install/install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
for f in include/gpufeed/c_api.h include/gpufeed/loader.h include/gpufeed/version.h lib/libgpufeed_common.a lib/libgpufeed_hdf5.a lib/libgpufeed_convert.a lib/libgpufeed_loader.a \
         lib/libgpufeed_gpu.a lib/libgpufeed_trainer.a lib/libgpufeed_daemon.a \
         lib/libgpufeed.so lib/cmake/gpufeed/gpufeedConfig.cmake lib/pkgconfig/gpufeed.pc bin/gpufeed \
         lib/gpufeed/hdf5-plugins/libgpufeed_h5zstd.so lib/python3/dist-packages/gpufeed/__init__.py; do
  [ -e "$prefix/$f" ] || { echo "install_test: $f was not installed"; exit 1; }
done

# A system install (prefix /usr, staged with DESTDIR) also puts the zstd
# plugin where HDF5 looks by default, so h5py needs no HDF5_PLUGIN_PATH.
h5dir=$(sed -n 's/^GPUFEED_HDF5_PLUGIN_DIR:PATH=//p' "$build/CMakeCache.txt")
if [ -n "$h5dir" ]; then
  DESTDIR="$tmp/stage" cmake --install "$build" --prefix /usr > "$tmp/stage.log"
  [ -f "$tmp/stage$h5dir/libgpufeed_h5zstd.so" ] ||
    { echo "install_test: a /usr install left no plugin in $h5dir"; cat "$tmp/stage.log"; exit 1; }
  grep -q "gpufeed: not a system prefix" "$tmp/install.log" ||
    { echo "install_test: the prefix install did not say where the plugin is"; exit 1; }
fi

# find_package from an outside tree (no path into the source or build tree).
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/consumer/cpp_app" "$tmp/index.h5"
LD_LIBRARY_PATH="$prefix/lib" "$tmp/consumer/c_app"

# pkg-config: the relocatable .pc points into this prefix.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cc -std=c11 -Wall -Werror "$src/tests/install/consumer/c_app.c" $(pkg-config --cflags --libs gpufeed) \
   -Wl,-rpath,"$prefix/lib" -o "$tmp/c_app_pc"
"$tmp/c_app_pc" > /dev/null
echo "install_test: pkg-config gpufeed $(pkg-config --modversion gpufeed): C program built and ran"

# The installed Python package finds the installed library by itself.
if [ -x /usr/bin/python3 ]; then
  env -u GPUFEED_LIBRARY PYTHONPATH="$prefix/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import gpufeed, sys; l = gpufeed.Loader(sys.argv[1], batch_size=10, output='dlpack'); print('install_test: python', gpufeed.__version__, l.num_samples, 'samples')" \
    "$tmp/index.h5"
fi
