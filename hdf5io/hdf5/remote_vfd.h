// HDF5 over an object (s3://, http(s)://): a virtual file driver that reads
// through gpufeed's transport (hdf5io/io/http_file.h) with a page cache, so
// that HDF5's metadata reads — a few hundred bytes each, one after another
// under its lock — become a few large ranged GETs: the object's first MiB at
// open, then 64 KiB pages, kept. Reads of a page or more (raw data on the
// hdf5 path) go straight to the object. Read-only; a name that is not an
// object URL does not open (an external link in a remote file never reaches a
// local file through it). Only inside hdf5/.
#ifndef GPUFEED_HDF5_REMOTE_VFD_H_
#define GPUFEED_HDF5_REMOTE_VFD_H_

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/status.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/io/file.h"

namespace gpufeed::h5 {

// The file access property list to open `file` with: the remote driver for
// an object URL, HDF5's default (a copy of it) otherwise.
Result<Id> FileAccessFor(const std::string& file);

// Why the last remote open on this thread failed (the transport's Status:
// HTTP status, object, credentials' source), taken; "" when none did. HDF5
// reports only that its driver failed.
std::string TakeRemoteOpenError();

// The object (its size and version) the driver read `file`'s metadata from,
// as io::RemoteIdentity gives it; nullopt when `file` is not open through
// the remote driver.
std::optional<io::FileIdentity> RemoteIdentityOf(hid_t file);

// Reads of `file`'s bytes at absolute addresses through the driver's page
// cache (the first MiB kept from the open, then 64 KiB pages, each one
// ranged GET): what the chunk index walk (chunk_btree.h) reads an object
// with instead of a local file's pread. False past the object's end or when
// a request failed. Empty when `file` is not open through the remote driver.
// Valid while `file` is open; any thread (the cache has its own lock).
using RemoteBytes = std::function<bool(uint64_t at, uint64_t n, std::vector<uint8_t>* out)>;
RemoteBytes RemoteBytesOf(hid_t file);

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_REMOTE_VFD_H_
