// An image folder (DIR/<class>/<image>, as torchvision's ImageFolder and
// DALI's file reader take it) read as it is: each file an encoded sample,
// decoded by the loader as encoded images in HDF5 are (gpufeed/encoded.h),
// with no conversion first. Internal to sources/: the door opens it.
#ifndef GPUFEED_SOURCES_FOLDER_IMAGES_H_
#define GPUFEED_SOURCES_FOLDER_IMAGES_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

#include "gpufeed/dataset.h"
#include "gpufeed/decode_options.h"
#include "gpufeed/encoded.h"
#include "gpufeed/status.h"

namespace gpufeed {

// The folder's JPEG and PNG files, class folder by class folder (sorted
// names: the label is the class's index), listed and their sizes taken
// once; each file must resolve (symbolic links followed) under the folder
// or under open.allow_paths / GPUFEED_ALLOW_PATHS, else InvalidArgument
// naming the file and the option. A read unit is one file, read whole with
// pread; a file whose size changed since the open is Corrupt ("rewritten?").
// The files the loader will read next are read ahead while the page cache
// lacks them (FolderReadAhead). storage() is EncodedStorage::kFolder.
Result<std::unique_ptr<EncodedImageSource>> OpenFolderImages(const std::string& dir, const OpenOptions& open,
                                                             const DecodeOptions& decode);

// Reads a folder's files ahead of the loader when the page cache lacks
// them. The loader hints the files it will read (the source's WillRead, up
// to kDepth files ahead, in its plan's order); one thread takes them in that
// order and checks whether each is cached (io::CachedOrReadAhead): one that
// is not is asked of the kernel (posix_fadvise WILLNEED, which returns at
// once), so up to kDepth files are on their way from the disk rather than
// one per loader thread. While the files it checks are cached (a warm
// page cache) one hinted file in kProbeEvery goes to the thread and the
// rest are dropped at once (no system call, no wake-up); one file found not
// cached makes it check every file until kColdFor files pass with none
// missing. A hint, never a read: an error is dropped (the read reports it).
// Thread-safe; the destructor stops and joins the thread.
class FolderReadAhead {
 public:
  static constexpr uint32_t kDepth = 128;
  static constexpr uint64_t kProbeEvery = 16;
  static constexpr uint64_t kColdFor = 512;

  // `files` must outlive this.
  explicit FolderReadAhead(const std::vector<std::string>* files);
  ~FolderReadAhead();
  FolderReadAhead(const FolderReadAhead&) = delete;
  FolderReadAhead& operator=(const FolderReadAhead&) = delete;

  // File k will be read soon; ignored while k was hinted since its last
  // Read(k), or when 4 x kDepth hints wait already.
  void Hint(uint64_t k);
  // File k was read: the next Hint(k) counts again.
  void Read(uint64_t k) { hinted_[k].store(0, std::memory_order_relaxed); }

  struct Counts {
    uint64_t hints = 0;    // taken (not ignored)
    uint64_t checked = 0;  // of them, checked for the cache by the thread
    uint64_t advised = 0;  // of those, not cached: read ahead
  };
  Counts counts() const { return {hints_.load(), checked_.load(), advised_.load()}; }

 private:
  void Run();
  void Check(uint64_t k);

  const std::vector<std::string>* files_;
  std::vector<std::atomic<uint8_t>> hinted_;  // 1: queued, or read ahead since its last read
  Mutex mu_;
  CondVar cv_;
  std::deque<uint64_t> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool started_ GUARDED_BY(mu_) = false;  // the thread, started at the first hint
  std::thread thread_;                    // written once, under mu_, at the first hint
  std::atomic<uint64_t> hints_{0}, checked_{0}, advised_{0};
  std::atomic<uint64_t> cold_until_{0};  // every hint is checked while hints_ is below this
};

}  // namespace gpufeed

#endif  // GPUFEED_SOURCES_FOLDER_IMAGES_H_
