// HDF5 virtual datasets (VDS): the mapping of a virtual dataset resolved to
// the source datasets gpufeed reads directly, each a range of the sample
// axis (docs/format.md, "Virtual datasets"). Used by Dataset::Open; only
// inside hdf5io/.
#ifndef GPUFEED_HDF5_VIRTUAL_H_
#define GPUFEED_HDF5_VIRTUAL_H_

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpufeed/dataset.h"
#include "gpufeed/status.h"

namespace gpufeed::h5 {

// Resolves the virtual dataset whose creation property list is `dcpl`, file
// type `ftype` and extent `dims` (read from `vds_file`; `what` is
// "vds_file:/path" for messages) into its sources, sorted by sample.
// Supported: each mapping selects a solid box of the virtual dataset that is
// a range of axis 0 and whole along every other axis, from a solid box of
// the source that is a range of its axis 0 and whole along the others (or,
// stacked, the whole source of rank one less as one sample); the ranges tile
// [0, dims[0]) with no gap and no overlap. Every source file must exist and
// hold its dataset with the same type, the same sample shape and at least
// the samples mapped. Errors: Unsupported (strided, unlimited, printf-named
// or partial-axis mappings; overlaps; a source that is itself virtual),
// InvalidArgument (a gap, a source whose type or shape disagrees), NotFound
// (a missing source file or dataset: names it and the virtual dataset),
// Corrupt (a selection outside its extent, a source HDF5 cannot open).
Result<std::vector<VirtualSource>> ResolveVirtualSources(hid_t dcpl, hid_t ftype, const std::vector<uint64_t>& dims,
                                                         const std::string& vds_file, const std::string& what);

// The file HDF5 opens for source file name `name` of a virtual dataset in
// `vds_file`: "." is vds_file; otherwise, in HDF5's order, the name itself
// when absolute and present, each entry of HDF5_VDS_PREFIX ("${ORIGIN}" is
// vds_file's directory) joined with the name (its base name when absolute),
// vds_file's directory joined with it, and the name as given (relative to
// the working directory). NotFound lists the places tried.
// Every path HDF5 may try for source file name `name`, in that order (it
// opens the first that is an HDF5 file): what ResolveVirtualSourceFile
// picks from, and what Reach (hdf5io/hdf5/reach.h) judges.
std::vector<std::string> VirtualSourceCandidates(const std::string& name, const std::string& vds_file);
Result<std::string> ResolveVirtualSourceFile(const std::string& name, const std::string& vds_file,
                                             const std::string& what);

// "src.h5:/data [0, 100) -> samples [200, 300)", for messages and inspect.
std::string DescribeVirtualSource(const VirtualSource& s);

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_VIRTUAL_H_
