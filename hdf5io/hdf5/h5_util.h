// Small RAII and error helpers around the HDF5 C API, used only inside hdf5io/.
// Every HDF5 failure is turned into a Status here, once, with the library's
// own error-stack description appended.
#ifndef GPUFEED_HDF5_H5_UTIL_H_
#define GPUFEED_HDF5_H5_UTIL_H_

#include <hdf5.h>

#include <string>
#include <utility>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed::h5 {

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  ~Id() { Reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void Reset();
  // Gives up ownership without closing (the id was closed by other means).
  hid_t Release() { return std::exchange(id_, H5I_INVALID_HID); }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's automatic printing of error stacks for the calling thread
// (the thread-safe build keeps that setting per thread). Cheap after the
// first call on a thread. Call before any HDF5 call.
void QuietErrors();

// The innermost useful description on the calling thread's HDF5 error stack
// ("unable to open file: truncated file: eof = 1000 ..."), or "" if empty.
std::string LastErrorText();

// Registers gpufeed's zstd filter (id 32015) in this process if no zstd
// filter is available yet, and raises HDF5's limits on its free lists of
// internal structures (below). Idempotent and thread-safe; every Dataset open
// calls it first.
void EnsureZstdFilterRegistered();

// Paths of every dataset in the file, for "dataset not found" hints.
std::vector<std::string> ListDatasets(hid_t file);

// Reads a string attribute (fixed or variable length); "" if absent.
std::string ReadStringAttr(hid_t obj, const char* name);
// Reads a 1-D string-array attribute; empty if absent.
std::vector<std::string> ReadStringArrayAttr(hid_t obj, const char* name);
// Reads a numeric attribute as doubles; empty if absent.
std::vector<double> ReadDoubleArrayAttr(hid_t obj, const char* name);

Status WriteStringAttr(hid_t obj, const char* name, const std::string& value);
Status WriteStringArrayAttr(hid_t obj, const char* name, const std::vector<std::string>& values);
Status WriteDoubleArrayAttr(hid_t obj, const char* name, const std::vector<double>& values);

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_H5_UTIL_H_
