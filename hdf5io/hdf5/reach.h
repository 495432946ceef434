// What an HDF5 file may reach: the files a dataset names beside its own
// (external raw-data files, virtual-dataset sources, the file an external
// link leads to) must lie, after every symbolic link is resolved, under the
// directory of the file the user named or under a directory the user allowed
// (OpenOptions::allow_paths, GPUFEED_ALLOW_PATHS). A hostile file otherwise
// reads any file this process can (/etc/passwd as "samples"), and a daemon
// serving it hands the bytes to its clients. Checked by gpufeed before a byte
// of the dataset is read (docs/reliability.md, "Security"). Only inside hdf5/.
#ifndef GPUFEED_HDF5_REACH_H_
#define GPUFEED_HDF5_REACH_H_

#include <hdf5.h>

#include <string>
#include <vector>

#include "gpufeed/dataset.h"
#include "gpufeed/status.h"

namespace gpufeed::h5 {

// The directories files named by `file` may lie under: its own directory
// (as named, and that of the file its symbolic link leads to), then
// options.allow_paths and the ':'-separated GPUFEED_ALLOW_PATHS, each
// resolved with realpath (an allowed directory that does not exist is
// dropped).
class Reach {
 public:
  Reach(const std::string& file, const OpenOptions& options);

  // Ok when `target` (a path HDF5 would open) resolves under one of the
  // directories; else InvalidArgument naming `what`, the kind of reference
  // ("external raw-data file", ...), the name as the file stores it, the
  // path it resolves to, and the option that allows it. A target that does
  // not exist is judged by the path it would have (its directory resolved).
  Status Check(const std::string& target, const std::string& name, const std::string& kind,
               const std::string& what) const;

  // Checks every file dataset `dset` (of this file, `what` its
  // "file:/path") would have HDF5 read: the file holding it when an
  // external link led elsewhere, its external raw-data files (where HDF5
  // opens them: an absolute name as is, a relative one under
  // HDF5_EXTFILE_PREFIX as HDF5 read it at its start, "${ORIGIN}" being the
  // file's directory, else under the working directory: HDF5's default,
  // kept, since HDF5 refuses a dataset open under two prefixes at once, as
  // h5py and gpufeed in one process would), and its virtual-dataset sources (every
  // place HDF5 may open one from: VirtualSourceCandidates up to the first
  // HDF5 file; a source not found is left for the caller's own checks).
  // Printf-style source names (%b) are Unsupported: their files are named
  // only as HDF5 reads.
  Status CheckDataset(hid_t dset, const std::string& what) const;

  const std::vector<std::string>& dirs() const { return dirs_; }

 private:
  std::string file_;
  std::vector<std::string> dirs_;  // real paths, without a trailing '/'
};

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_REACH_H_
