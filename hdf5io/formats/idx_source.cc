// IDX reader (the MNIST / Fashion-MNIST format): big-endian header, uint8
// payload, gzip-compressed (inflated in memory, every member) or plain; the
// file read whole through io (hdf5io/io/read_file.h).
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "common/sizes.h"
#include "gpufeed/names.h"
#include "gpufeed/sample_source.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed {
namespace {

struct IdxArray {
  std::vector<uint64_t> dims;
  std::vector<uint8_t> data;
  uint64_t file_bytes = 0;
};

// The gzip members of `raw` inflated, one after another (as gzread reads
// them; bytes after the last member that start no other are left, as it
// leaves them). Corrupt naming the path for a damaged or truncated stream.
Result<std::vector<uint8_t>> Gunzip(const std::string& path, const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> out;
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return Status::Internal(path + ": zlib's inflate did not start");
  const uint8_t* const end = raw.data() + raw.size();
  const uint8_t* next = raw.data();  // the input not yet handed to zlib
  uint8_t buf[1 << 16];
  Status st;
  for (;;) {
    if (z.avail_in == 0 && next < end) {  // at most 4 GiB a piece (avail_in is 32 bits)
      z.next_in = const_cast<Bytef*>(next);
      z.avail_in = static_cast<uInt>(std::min<size_t>(static_cast<size_t>(end - next), UINT32_MAX));
      next += z.avail_in;
    }
    z.next_out = buf;
    z.avail_out = sizeof(buf);
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.insert(out.end(), buf, buf + (sizeof(buf) - z.avail_out));
    if (rc == Z_OK) continue;
    if (rc == Z_STREAM_END) {
      const uint8_t* at = z.next_in;
      if (end - at < 2 || at[0] != 0x1f || at[1] != 0x8b) break;  // no further member
      inflateReset(&z);
      continue;
    }
    if (rc == Z_BUF_ERROR && z.avail_in == 0 && next == end) {
      st = Status::Corrupt(path + ": gzip stream is truncated (it ends inside a member)");
    } else {
      st = Status::Corrupt(path + ": gzip stream is damaged: " +
                           (z.msg != nullptr ? std::string(z.msg) : "zlib error " + std::to_string(rc)));
    }
    break;
  }
  inflateEnd(&z);
  if (!st.ok()) return st;
  return out;
}

// The IDX file's bytes, read through io (read_file.h), inflated when gzip'd.
Result<IdxArray> ReadIdx(const std::string& path) {
  std::vector<uint8_t> raw;
  GPUFEED_RETURN_IF_ERROR(io::ReadWholeFile(path, &raw));
  const uint64_t file_bytes = raw.size();
  const bool gzipped = raw.size() >= 2 && raw[0] == 0x1f && raw[1] == 0x8b;
  std::vector<uint8_t> bytes;
  if (gzipped) {
    auto inflated = Gunzip(path, raw);
    if (!inflated.ok()) return inflated.status();
    bytes = std::move(*inflated);
  } else {
    bytes = std::move(raw);
  }
  IdxArray out;
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    return Status::Corrupt(path + ": not an IDX file (bad magic; expected 00 00 <type> <rank>)");
  }
  if (bytes[2] != 0x08) {
    return Status::Unsupported(path + ": IDX element type 0x" + std::to_string(bytes[2]) +
                               " is not supported (only unsigned byte, 0x08)");
  }
  const size_t rank = bytes[3];
  if (rank < 1 || bytes.size() < 4 + 4 * rank) return Status::Corrupt(path + ": IDX header is truncated");
  for (size_t k = 0; k < rank; ++k) {
    const uint8_t* p = &bytes[4 + 4 * k];
    out.dims.push_back((uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | p[3]);
  }
  // Checked, the sample size first (a file of 0 samples must not declare a
  // sample size that wraps): a product that wraps could equal the bytes
  // present and make every sample's offset wrong.
  const auto sample = CheckedProduct(1, std::span(out.dims).subspan(1));
  const auto total = sample ? CheckedMul(*sample, out.dims[0]) : std::nullopt;
  if (!total) return Status::Corrupt(path + ": IDX dimensions hold more than 2^64 bytes");
  const uint64_t count = *total;
  const size_t header = 4 + 4 * rank;
  if (bytes.size() - header != count) {
    return Status::Corrupt(path + ": IDX header promises " + std::to_string(count) + " bytes of data, file has " +
                           std::to_string(bytes.size() - header));
  }
  out.data.assign(bytes.begin() + header, bytes.end());
  out.file_bytes = file_bytes;
  return out;
}

class IdxSource final : public SampleSource {
 public:
  IdxSource(std::string path, IdxArray images, std::vector<int64_t> labels, uint64_t label_bytes)
      : path_(std::move(path)), images_(std::move(images)), labels_(std::move(labels)) {
    // [N, H, W] images are one-channel NCHW; other ranks are kept as they are.
    shape_.assign(images_.dims.begin() + 1, images_.dims.end());
    if (shape_.size() == 2) {
      shape_.insert(shape_.begin(), 1);
      layout_ = LayoutName(Layout::kNCHW);
    }
    sample_bytes_ = 1;
    for (uint64_t x : shape_) sample_bytes_ *= x;
    input_bytes_ = images_.file_bytes + label_bytes;
  }
  uint64_t num_samples() const override { return images_.dims[0]; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  DType dtype() const override { return DType::kUInt8; }
  std::string layout() const override { return layout_; }
  const std::vector<int64_t>& labels() const override { return labels_; }
  uint64_t input_bytes() const override { return input_bytes_; }
  std::string description() const override { return "IDX " + path_; }
  Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
    if (first + count > num_samples() || dst.size() < count * sample_bytes_) {
      return Status::InvalidArgument(path_ + ": read out of range");
    }
    // CopyBytes: a shape with a 0 dimension reads 0 bytes into a null dst.
    CopyBytes(dst.data(), images_.data.data() + first * sample_bytes_, count * sample_bytes_);
    return Status::Ok();
  }

 private:
  std::string path_;
  IdxArray images_;
  std::vector<int64_t> labels_;
  std::vector<uint64_t> shape_;
  std::string layout_;
  uint64_t sample_bytes_ = 1;
  uint64_t input_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<SampleSource>> OpenIdxSource(const std::string& images_path, const std::string& labels_path) {
  auto images = ReadIdx(images_path);
  if (!images.ok()) return images.status();
  if (images->dims.size() < 2) {
    return Status::InvalidArgument(images_path + ": IDX rank " + std::to_string(images->dims.size()) +
                                   " holds no samples (expected [N, ...]; is this a labels file?)");
  }
  std::vector<int64_t> labels;
  uint64_t label_bytes = 0;
  if (!labels_path.empty()) {
    auto l = ReadIdx(labels_path);
    if (!l.ok()) return l.status();
    if (l->dims.size() != 1) {
      return Status::InvalidArgument(labels_path + ": labels must be a 1-D IDX file, found rank " +
                                     std::to_string(l->dims.size()));
    }
    if (l->dims[0] != images->dims[0]) {
      return Status::InvalidArgument(labels_path + ": has " + std::to_string(l->dims[0]) + " labels but " +
                                     images_path + " has " + std::to_string(images->dims[0]) + " images");
    }
    labels.assign(l->data.begin(), l->data.end());
    label_bytes = l->file_bytes;
  }
  return std::unique_ptr<SampleSource>(
      std::make_unique<IdxSource>(images_path, std::move(*images), std::move(labels), label_bytes));
}

}  // namespace gpufeed
