// NumPy .npy reader: parses the header dict (descr, fortran_order, shape) and
// memory-maps the C-order payload.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <regex>

#include "common/sizes.h"
#include "gpufeed/convert.h"

namespace gpufeed {
namespace {

struct NpyMap {
  std::string path;
  const std::byte* base = nullptr;
  size_t size = 0;
  size_t data_offset = 0;
  DType dtype = DType::kUInt8;
  std::vector<uint64_t> shape;

  NpyMap() = default;
  NpyMap(const NpyMap&) = delete;
  NpyMap& operator=(const NpyMap&) = delete;
  ~NpyMap() {
    if (base != nullptr) ::munmap(const_cast<std::byte*>(base), size);
  }
};

Result<DType> DTypeFromDescr(const std::string& path, const std::string& descr) {
  if (descr.size() < 3) return Status::Corrupt(path + ": bad dtype descr '" + descr + "'");
  const char order = descr[0];
  const std::string kind = descr.substr(1);
  if (order == '>' && kind != "u1" && kind != "i1") {
    return Status::Unsupported(path + ": big-endian dtype '" + descr + "'; save it little-endian (arr.astype('<" +
                               kind + "'))");
  }
  static const std::pair<const char*, DType> kKinds[] = {
      {"u1", DType::kUInt8},   {"i1", DType::kInt8},    {"u2", DType::kUInt16},  {"i2", DType::kInt16},
      {"u4", DType::kUInt32},  {"i4", DType::kInt32},   {"u8", DType::kUInt64},  {"i8", DType::kInt64},
      {"f2", DType::kFloat16}, {"f4", DType::kFloat32}, {"f8", DType::kFloat64}, {"b1", DType::kUInt8},
  };
  for (const auto& [k, t] : kKinds) {
    if (kind == k) return t;
  }
  return Status::Unsupported(path + ": dtype '" + descr + "' is not a supported numeric type");
}

Result<std::unique_ptr<NpyMap>> MapNpy(const std::string& path) {
  auto m = std::make_unique<NpyMap>();
  m->path = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  ::fstat(fd, &st);
  m->size = static_cast<size_t>(st.st_size);
  if (m->size < 10) {
    ::close(fd);
    return Status::Corrupt(path + ": not a .npy file (too short)");
  }
  void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Status::IOError(path + ": mmap failed: " + std::strerror(errno));
  m->base = static_cast<const std::byte*>(p);
  const auto* b = reinterpret_cast<const unsigned char*>(m->base);
  if (std::memcmp(b, "\x93NUMPY", 6) != 0) return Status::Corrupt(path + ": not a .npy file (bad magic)");
  const int major = b[6];
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = b[8] | (b[9] << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (m->size < 12) return Status::Corrupt(path + ": .npy header is truncated");
    header_len = b[8] | (b[9] << 8) | (size_t{b[10]} << 16) | (size_t{b[11]} << 24);
    prefix = 12;
  } else {
    return Status::Unsupported(path + ": .npy format version " + std::to_string(major));
  }
  if (prefix + header_len > m->size) return Status::Corrupt(path + ": .npy header is truncated");
  const std::string header(reinterpret_cast<const char*>(b + prefix), header_len);
  std::smatch match;
  if (!std::regex_search(header, match, std::regex("'descr'\\s*:\\s*'([^']+)'"))) {
    return Status::Corrupt(path + ": .npy header has no descr");
  }
  auto dtype = DTypeFromDescr(path, match[1]);
  if (!dtype.ok()) return dtype.status();
  m->dtype = *dtype;
  if (std::regex_search(header, match, std::regex("'fortran_order'\\s*:\\s*True"))) {
    return Status::Unsupported(path + ": Fortran-order array; save it with np.ascontiguousarray first");
  }
  if (!std::regex_search(header, match, std::regex("'shape'\\s*:\\s*\\(([^)]*)\\)"))) {
    return Status::Corrupt(path + ": .npy header has no shape");
  }
  const std::string dims = match[1];
  const std::regex number("\\d+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it) {
    const std::string digits = it->str();
    uint64_t d = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    if (ec != std::errc() || ptr != digits.data() + digits.size()) {
      return Status::Corrupt(path + ": .npy shape entry '" + digits + "' does not fit 64 bits");
    }
    m->shape.push_back(d);
  }
  m->data_offset = prefix + header_len;
  // Checked products: a shape whose byte count wraps would pass the size
  // check below and describe memory the file does not have.
  // The sample size first, so a 0 in front does not hide a sample size
  // that wraps.
  const auto sample = m->shape.empty() ? std::optional<uint64_t>(DTypeSize(m->dtype))
                                       : CheckedProduct(DTypeSize(m->dtype), std::span(m->shape).subspan(1));
  const auto total = sample && !m->shape.empty() ? CheckedMul(*sample, m->shape[0]) : sample;
  if (!total) return Status::Corrupt(path + ": .npy shape " + dims + " holds more than 2^64 bytes");
  const uint64_t bytes = *total;
  if (bytes > m->size - m->data_offset) {
    return Status::Corrupt(path + ": .npy is truncated (header promises " + std::to_string(bytes) +
                           " data bytes, file has " + std::to_string(m->size - m->data_offset) + ")");
  }
  return m;
}

class NpySource final : public SampleSource {
 public:
  NpySource(std::unique_ptr<NpyMap> m, std::vector<int64_t> labels) : m_(std::move(m)), labels_(std::move(labels)) {
    shape_.assign(m_->shape.begin() + 1, m_->shape.end());
    sample_bytes_ = DTypeSize(m_->dtype);
    for (uint64_t x : shape_) sample_bytes_ *= x;
    layout_ = GuessLayout(shape_);
  }
  uint64_t num_samples() const override { return m_->shape[0]; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  DType dtype() const override { return m_->dtype; }
  std::string layout() const override { return layout_; }
  const std::vector<int64_t>& labels() const override { return labels_; }
  uint64_t input_bytes() const override { return m_->size; }
  std::string description() const override { return "npy " + m_->path; }
  Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
    if (first + count > num_samples() || dst.size() < count * sample_bytes_) {
      return Status::InvalidArgument(m_->path + ": read out of range");
    }
    // CopyBytes: a shape with a 0 dimension reads 0 bytes into a null dst.
    CopyBytes(dst.data(), m_->base + m_->data_offset + first * sample_bytes_, count * sample_bytes_);
    return Status::Ok();
  }

 private:
  std::unique_ptr<NpyMap> m_;
  std::vector<int64_t> labels_;
  std::vector<uint64_t> shape_;
  std::string layout_;
  uint64_t sample_bytes_ = 1;
};

template <typename T>
void Widen(const std::byte* p, uint64_t n, std::vector<int64_t>* out) {
  out->resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    (*out)[i] = static_cast<int64_t>(v);
  }
}

}  // namespace

Result<std::unique_ptr<SampleSource>> OpenNpySource(const std::string& path, const std::string& labels_path) {
  auto m = MapNpy(path);
  if (!m.ok()) return m.status();
  if ((*m)->shape.empty()) return Status::InvalidArgument(path + ": 0-d array holds no samples");
  std::vector<int64_t> labels;
  if (!labels_path.empty()) {
    auto l = MapNpy(labels_path);
    if (!l.ok()) return l.status();
    const NpyMap& lm = **l;
    uint64_t n = 1;
    for (uint64_t d : lm.shape) n *= d;
    if (lm.shape.empty() || n != lm.shape[0] || !DTypeIsInteger(lm.dtype)) {
      return Status::InvalidArgument(labels_path + ": labels must be a 1-D integer array");
    }
    if (n != (*m)->shape[0]) {
      return Status::InvalidArgument(labels_path + ": has " + std::to_string(n) + " labels but " + path + " has " +
                                     std::to_string((*m)->shape[0]) + " samples");
    }
    const std::byte* p = lm.base + lm.data_offset;
    switch (lm.dtype) {
      case DType::kUInt8:
        Widen<uint8_t>(p, n, &labels);
        break;
      case DType::kInt8:
        Widen<int8_t>(p, n, &labels);
        break;
      case DType::kUInt16:
        Widen<uint16_t>(p, n, &labels);
        break;
      case DType::kInt16:
        Widen<int16_t>(p, n, &labels);
        break;
      case DType::kUInt32:
        Widen<uint32_t>(p, n, &labels);
        break;
      case DType::kInt32:
        Widen<int32_t>(p, n, &labels);
        break;
      case DType::kUInt64:
        Widen<uint64_t>(p, n, &labels);
        break;
      default:
        Widen<int64_t>(p, n, &labels);
        break;
    }
  }
  return std::unique_ptr<SampleSource>(std::make_unique<NpySource>(std::move(*m), std::move(labels)));
}

}  // namespace gpufeed
