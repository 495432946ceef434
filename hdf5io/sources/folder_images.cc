// An image folder read as it is (hdf5io/sources/folder_images.h): each file one
// encoded sample, one read unit.
#include "hdf5io/sources/folder_images.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "hdf5io/formats/image_folder_listing.h"
#include "gpufeed/names.h"
#include "gpufeed/sample_decoder.h"
#include "hdf5io/hdf5/reach.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed {

// ---------------------------------------------------------------------------
// FolderReadAhead

FolderReadAhead::FolderReadAhead(const std::vector<std::string>* files) : files_(files), hinted_(files->size()) {}

FolderReadAhead::~FolderReadAhead() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void FolderReadAhead::Hint(uint64_t k) {
  if (k >= hinted_.size() || hinted_[k].exchange(1, std::memory_order_relaxed) != 0) return;
  // Warm: a probe in kProbeEvery goes to the thread, the rest cost this.
  const uint64_t n = hints_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n >= cold_until_.load(std::memory_order_relaxed) && n % kProbeEvery != 0) return;
  MutexLock lock(&mu_);
  if (stop_ || queue_.size() >= 4 * kDepth) return;  // left marked: hinted again after its read
  if (!started_) {
    started_ = true;
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error&) {
      stop_ = true;  // no thread to be had: the reads go on without read-ahead
      return;
    }
  }
  queue_.push_back(k);
  if (queue_.size() == 1) cv_.Signal();  // the thread drains the queue before it waits again
}

void FolderReadAhead::Run() {
  try {
    for (;;) {
      uint64_t k;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stop_) cv_.Wait(&mu_);
        if (stop_) return;
        k = queue_.front();
        queue_.pop_front();
      }
      Check(k);
    }
  } catch (...) {  // a thread root: read-ahead is a hint, the reads go on without it
    MutexLock lock(&mu_);
    stop_ = true;
  }
}

void FolderReadAhead::Check(uint64_t k) {
  auto cached = io::CachedOrReadAhead((*files_)[k], /*advise=*/true);
  if (cached.ok() && !*cached) {
    advised_.fetch_add(1, std::memory_order_relaxed);
    cold_until_.store(hints_.load(std::memory_order_relaxed) + kColdFor, std::memory_order_relaxed);
  }
  // Last, released: whoever sees a file counted checked sees what its check
  // did (advised, and the cold spell that makes every hint a check).
  checked_.fetch_add(1, std::memory_order_release);
}

namespace {

class FolderImages final : public EncodedImageSource {
 public:
  // What sources over the same folder share (WithDecodeOptions,
  // WithReadUnit): made at open, never written afterwards.
  struct Index {
    std::string dir;
    image_folder::FolderListing listing;
    uint64_t max_size = 0;
    // Over listing.files (destroyed first); shared by the views, as the
    // page cache is.
    std::unique_ptr<FolderReadAhead> read_ahead;
  };

  FolderImages(std::shared_ptr<const Index> index, uint64_t group) : index_(std::move(index)), group_(group) {
    max_chunk_bytes_ = 0;
    for (uint64_t c = 0; c < num_chunks(); ++c) max_chunk_bytes_ = std::max(max_chunk_bytes_, chunk_buffer_bytes(c));
  }

  Status SetDecode(const DecodeOptions& decode) {
    auto decoder = MakeImageDecoder(decode);
    if (!decoder.ok()) return decoder.status();
    decoder_ = std::move(*decoder);
    decode_ = decode;
    shape_ = LayoutOr(decode.layout, Layout::kNCHW) == Layout::kNHWC
                 ? std::vector<uint64_t>{decode.height, decode.width, 3}
                 : std::vector<uint64_t>{3, decode.height, decode.width};
    return Status::Ok();
  }

  EncodedStorage storage() const override { return EncodedStorage::kFolder; }
  const DecodeOptions& decode_options() const override { return decode_; }
  std::vector<std::string> class_names() const override { return index_->listing.class_names; }
  uint64_t stored_bytes() const override { return index_->listing.total_bytes; }
  uint64_t sample_stored_bytes(uint64_t k) const override { return index_->listing.sizes[k]; }

  uint64_t num_samples() const override { return index_->listing.sizes.size(); }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  uint64_t sample_bytes() const override { return decoder_->sample_bytes(); }
  DType dtype() const override { return DType::kUInt8; }
  uint64_t chunk_samples() const override { return group_; }
  uint64_t num_chunks() const override { return (num_samples() + group_ - 1) / group_; }
  uint64_t samples_in_chunk(uint64_t i) const override { return std::min(group_, num_samples() - i * group_); }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return chunk_buffer_bytes(i); }
  uint64_t chunk_buffer_bytes(uint64_t i) const override {
    uint64_t bytes = 0;
    for (uint64_t k = i * group_; k < i * group_ + samples_in_chunk(i); ++k) bytes += index_->listing.sizes[k];
    return bytes;
  }
  uint64_t max_chunk_buffer_bytes() const override { return std::max<uint64_t>(1, max_chunk_bytes_); }
  bool decodes_samples() const override { return true; }
  const std::vector<int64_t>& labels() const override { return index_->listing.labels; }
  std::string name() const override { return index_->dir; }
  std::string sample_name(uint64_t k) const override {
    return k < num_samples() ? index_->listing.files[k] + " (sample " + std::to_string(k) + ")"
                             : EncodedImageSource::sample_name(k);
  }
  SourceAttributes attributes() const override {
    SourceAttributes a;
    a.layout = decode_.layout;
    a.class_names = index_->listing.class_names;
    return a;
  }

  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    if (i >= num_chunks() || dst.size() < chunk_buffer_bytes(i)) {
      return Status::InvalidArgument(name() + ": ReadChunk(" + std::to_string(i) +
                                     ") out of range or buffer too small");
    }
    uint64_t at = 0;
    for (uint64_t k = i * group_; k < i * group_ + samples_in_chunk(i); ++k) {
      GPUFEED_RETURN_IF_ERROR(ReadFile(k, dst.data() + at));
      at += index_->listing.sizes[k];
    }
    return Status::Ok();
  }

  Status ReadEncoded(uint64_t k, std::vector<uint8_t>* out) const override {
    if (k >= num_samples()) return Status::InvalidArgument(name() + ": sample " + std::to_string(k) + " out of range");
    out->resize(index_->listing.sizes[k]);
    return ReadFile(k, reinterpret_cast<std::byte*>(out->data()));
  }

  Result<std::span<const std::byte>> EncodedBytes(std::span<const std::byte> chunk_bytes, uint64_t chunk,
                                                  uint64_t sample) const override {
    const uint64_t first = chunk * group_;
    if (chunk >= num_chunks() || sample < first || sample >= first + samples_in_chunk(chunk) ||
        chunk_bytes.size() < chunk_buffer_bytes(chunk)) {
      return Status::Internal(name() + ": EncodedBytes(" + std::to_string(sample) + ") outside chunk " +
                              std::to_string(chunk) + " or mis-sized");
    }
    uint64_t at = 0;
    for (uint64_t k = first; k < sample; ++k) at += index_->listing.sizes[k];
    return chunk_bytes.subspan(at, index_->listing.sizes[sample]);
  }
  std::shared_ptr<const SampleDecoder> sample_decoder() const override { return decoder_; }

  // The loader's hints of the read units it reads next: their files read
  // ahead while the page cache lacks them (FolderReadAhead).
  void WillRead(uint64_t i) const override {
    if (i >= num_chunks()) return;
    for (uint64_t k = i * group_; k < i * group_ + samples_in_chunk(i); ++k) index_->read_ahead->Hint(k);
  }
  uint32_t read_ahead_chunks() const override {
    return static_cast<uint32_t>(std::max<uint64_t>(1, FolderReadAhead::kDepth / group_));
  }

  Result<std::unique_ptr<EncodedImageSource>> WithDecodeOptions(const DecodeOptions& decode) const override {
    GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(decode));
    auto s = std::make_unique<FolderImages>(index_, group_);
    GPUFEED_RETURN_IF_ERROR(s->SetDecode(decode));
    return std::unique_ptr<EncodedImageSource>(std::move(s));
  }
  std::unique_ptr<EncodedImageSource> WithReadUnit(uint64_t samples) const override {
    auto s = std::make_unique<FolderImages>(index_, std::max<uint64_t>(1, samples));
    s->decoder_ = decoder_;
    s->decode_ = decode_;
    s->shape_ = shape_;
    return s;
  }

 private:
  // File k's bytes into dst (sizes[k] of them), read whole through io
  // (hdf5io/io/read_file.h), checked against its size at the open.
  Status ReadFile(uint64_t k, std::byte* dst) const {
    const std::string& path = index_->listing.files[k];
    const uint64_t want = index_->listing.sizes[k];
    index_->read_ahead->Read(k);
    return io::ReadWholeFile(path, [&](uint64_t size) -> Result<std::byte*> {
      if (size != want) {
        return Status::Corrupt(path + ": holds " + std::to_string(size) + " bytes, " + std::to_string(want) +
                               " when the folder was opened (was it rewritten? open the folder again)");
      }
      return dst;
    });
  }

  std::shared_ptr<const Index> index_;
  uint64_t group_ = 1, max_chunk_bytes_ = 0;
  DecodeOptions decode_;
  std::shared_ptr<const SampleDecoder> decoder_;
  std::vector<uint64_t> shape_;
};

}  // namespace

Result<std::unique_ptr<EncodedImageSource>> OpenFolderImages(const std::string& dir, const OpenOptions& open,
                                                             const DecodeOptions& decode) {
  GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(decode));
  // A file reaches only what is under the folder (or allowed), judged by
  // where it resolves: a plain file where its directory does (each
  // directory resolved once, not each file: 100,000 files would cost
  // 500,000 readlink calls), a symbolic link by its target; a folder the
  // walk reaches through a link is judged before it is listed.
  // Reach takes a file's directory as its own: a name in the folder (which
  // need not exist; an existing one would resolve to the same directory).
  const h5::Reach reach(dir + "/.gpufeed-folder", open);
  auto listing = image_folder::ListImageFolder(
      dir, [&](const std::string& d) { return reach.Check(d, d, "folder of image files", dir); });
  if (!listing.ok()) return listing.status();
  auto index = std::make_shared<FolderImages::Index>();
  index->dir = dir;
  index->listing = std::move(*listing);
  for (const std::string& d : index->listing.image_dirs) {
    GPUFEED_RETURN_IF_ERROR(reach.Check(d, d, "folder of image files", dir));
  }
  for (uint64_t k : index->listing.linked_files) {
    const std::string& path = index->listing.files[k];
    GPUFEED_RETURN_IF_ERROR(reach.Check(path, path, "image file", dir));
  }
  for (uint64_t s : index->listing.sizes) index->max_size = std::max(index->max_size, s);
  index->read_ahead = std::make_unique<FolderReadAhead>(&index->listing.files);
  auto src = std::make_unique<FolderImages>(index, 1);
  GPUFEED_RETURN_IF_ERROR(src->SetDecode(decode));
  return std::unique_ptr<EncodedImageSource>(std::move(src));
}

}  // namespace gpufeed
