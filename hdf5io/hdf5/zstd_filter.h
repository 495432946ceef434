// HDF5 filter class for zstd (filter id 32015, the id hdf5plugin and h5py
// use): one zstd frame per chunk, client data [level]. Registered in-process
// by gpufeed (so its own hdf5-path reads and writes work) and exported as a
// plugin library (libgpufeed_h5zstd.so, see h5z_zstd_plugin.cc) so h5dump,
// h5py and any HDF5 program read gpufeed's zstd files via HDF5_PLUGIN_PATH.
#ifndef GPUFEED_HDF5_ZSTD_FILTER_H_
#define GPUFEED_HDF5_ZSTD_FILTER_H_

#include <hdf5.h>

namespace gpufeed::h5 {

inline constexpr H5Z_filter_t kZstdFilterId = 32015;
extern const H5Z_class2_t kZstdFilterClass;

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_ZSTD_FILTER_H_
