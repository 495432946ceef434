// Entry points of the HDF5 zstd filter plugin (libgpufeed_h5zstd.so). Point
// HDF5_PLUGIN_PATH at its folder and any HDF5 program reads filter 32015.
#include <H5PLextern.h>

#include "hdf5io/hdf5/zstd_filter.h"

extern "C" {
H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
const void* H5PLget_plugin_info(void) { return &gpufeed::h5::kZstdFilterClass; }
}
