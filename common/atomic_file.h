// AtomicFile: the one way gpufeed replaces a file (checkpoints, converted
// datasets, inspect's exports). Data goes to a temporary file beside the
// target; Commit() fsyncs it, renames it over the target and fsyncs the
// directory (as LevelDB's SetCurrentFile does), so after a crash or power
// loss the target is either the old file or the whole new one, never empty
// or short. A destroyed, uncommitted AtomicFile removes its temporary file;
// so does SIGINT/SIGTERM in a program that called RemoveTempFilesOnSignal().
#ifndef GPUFEED_COMMON_ATOMIC_FILE_H_
#define GPUFEED_COMMON_ATOMIC_FILE_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "gpufeed/status.h"

namespace gpufeed {

class AtomicFile {
 public:
  // Names the temporary file `path` + ".tmp-<pid>-<n>" and registers it for
  // removal on a signal; nothing is created yet (HDF5 creates it itself when
  // it writes to tmp_path(); Write() opens it otherwise).
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }

  // Appends to the temporary file (created on the first call).
  Status Write(const void* data, size_t n);
  Status Write(std::string_view s) { return Write(s.data(), s.size()); }

  // fsync(temporary) -> rename(temporary, path) -> fsync(directory). The
  // errors name the file and the failing step (disk full, permission).
  Status Commit();

  // Writes `data` to `path` atomically in one call.
  static Status WriteWhole(const std::string& path, std::string_view data);

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int registry_slot_ = -1;
  bool committed_ = false;
};

// Installs SIGINT/SIGTERM handlers that unlink every live AtomicFile's
// temporary file and then die of the signal as before. For programs (the
// CLI); a library does not take signals on its own.
void RemoveTempFilesOnSignal();

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_ATOMIC_FILE_H_
