// NumPy .npy reader: parses the header dict (descr, fortran_order, shape) and
// memory-maps the C-order payload.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <regex>

#include "common/sizes.h"
#include "gpufeed/sample_source.h"
#include "gpufeed/field_spec.h"
#include "gpufeed/file_list.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed {
namespace {

struct NpyMap {
  std::string path;
  std::optional<io::MappedFile> mapped;  // the whole file (io/read_file.h)
  const std::byte* base = nullptr;       // mapped's bytes
  size_t size = 0;
  size_t data_offset = 0;
  DType dtype = DType::kUInt8;
  std::vector<uint64_t> shape;
};

Result<DType> DTypeFromDescr(const std::string& path, const std::string& descr) {
  if (descr.size() < 3) return Status::Corrupt(path + ": bad dtype descr '" + descr + "'");
  const char order = descr[0];
  const std::string kind = descr.substr(1);
  if (order == '>' && kind != "u1" && kind != "i1") {
    return Status::Unsupported(path + ": big-endian dtype '" + descr + "'; save it little-endian (arr.astype('<" +
                               kind + "'))");
  }
  // NumPy's kind letter and size: the dtype table's (gpufeed/dtype.h);
  // a bool ("b1") is read as its bytes, uint8.
  std::optional<DType> t;
  if (kind.size() == 2 && kind[1] >= '1' && kind[1] <= '8') {
    const size_t size = static_cast<size_t>(kind[1] - '0');
    switch (kind[0]) {
      case 'u':
      case 'b':
        t = DTypeOf(DTypeKind::kUnsignedInt, size);
        break;
      case 'i':
        t = DTypeOf(DTypeKind::kSignedInt, size);
        break;
      case 'f':
        t = DTypeOf(DTypeKind::kFloat, size);
        break;
      default:
        break;
    }
    if (kind[0] == 'b' && size != 1) t.reset();
  }
  if (t) return *t;
  return Status::Unsupported(path + ": dtype '" + descr + "' is not a supported numeric type");
}

Result<std::unique_ptr<NpyMap>> MapNpy(const std::string& path) {
  auto m = std::make_unique<NpyMap>();
  m->path = path;
  auto mapped = io::MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  m->mapped = std::move(*mapped);
  m->base = m->mapped->bytes().data();
  m->size = m->mapped->bytes().size();
  if (m->size < 10) return Status::Corrupt(path + ": not a .npy file (too short)");
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

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Named fields over .npy files (OpenNpyFields). Read units span files: a
// unit is a byte copy out of the mapped files, so no alignment is needed.
class NpyFieldSource final : public ChunkSource {
 public:
  struct Field {
    FieldInfo info;
    std::vector<std::unique_ptr<NpyMap>> files;
  };
  NpyFieldSource(std::vector<Field> fields, std::vector<uint64_t> file_first, std::string what)
      : fields_(std::move(fields)), file_first_(std::move(file_first)), what_(std::move(what)) {
    uint64_t offset = 0;
    for (Field& f : fields_) {
      f.info.offset = offset;
      offset += f.info.sample_bytes;
    }
    sample_bytes_ = offset;
    num_samples_ = file_first_.back();
    chunk_samples_ =
        std::clamp<uint64_t>((4u << 20) / std::max<uint64_t>(1, sample_bytes_), 1, std::max<uint64_t>(1, num_samples_));
    if (fields_.size() == 1) {
      shape_ = fields_[0].info.sample_shape;
      dtype_ = fields_[0].info.dtype;
    } else {
      shape_ = {sample_bytes_};
    }
  }
  uint64_t num_samples() const override { return num_samples_; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  uint64_t sample_bytes() const override { return sample_bytes_; }
  DType dtype() const override { return dtype_; }
  uint64_t chunk_samples() const override { return chunk_samples_; }
  uint64_t num_chunks() const override { return (num_samples_ + chunk_samples_ - 1) / chunk_samples_; }
  uint64_t samples_in_chunk(uint64_t i) const override {
    return std::min(chunk_samples_, num_samples_ - i * chunk_samples_);
  }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return samples_in_chunk(i) * sample_bytes_; }
  const std::vector<int64_t>& labels() const override {
    static const std::vector<int64_t> kNone;
    return kNone;
  }
  std::string name() const override { return what_; }
  std::vector<FieldInfo> fields() const override {
    std::vector<FieldInfo> out;
    for (const Field& f : fields_) out.push_back(f.info);
    return out;
  }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    if (i >= num_chunks()) return Status::InvalidArgument(what_ + ": unit " + std::to_string(i) + " out of range");
    const uint64_t capacity = fields_.size() == 1 ? samples_in_chunk(i) : chunk_samples_;
    if (dst.size() < capacity * sample_bytes_) {
      return Status::InvalidArgument(what_ + ": unit " + std::to_string(i) + ": destination too small");
    }
    const uint64_t first = i * chunk_samples_, end = first + samples_in_chunk(i);
    for (const Field& f : fields_) {
      const uint64_t sb = f.info.sample_bytes;
      std::byte* out = dst.data() + capacity * f.info.offset;
      for (uint64_t k = first; k < end;) {
        const size_t file =
            static_cast<size_t>(std::upper_bound(file_first_.begin(), file_first_.end(), k) - file_first_.begin() - 1);
        const uint64_t local = k - file_first_[file];
        const uint64_t run = std::min(end, file_first_[file + 1]) - k;
        const NpyMap& m = *f.files[file];
        CopyBytes(out + (k - first) * sb, m.base + m.data_offset + local * sb, run * sb);
        k += run;
      }
    }
    return Status::Ok();
  }

 private:
  std::vector<Field> fields_;
  std::vector<uint64_t> file_first_;
  std::string what_;
  std::vector<uint64_t> shape_;
  DType dtype_ = DType::kUInt8;
  uint64_t sample_bytes_ = 0, num_samples_ = 0, chunk_samples_ = 1;
};

}  // namespace

Result<std::unique_ptr<ChunkSource>> OpenNpyFields(const std::vector<std::string>& specs, bool no_sample_axis) {
  if (specs.empty()) return Status::InvalidArgument(".npy fields: name at least one (--field NAME=PATTERN.npy)");
  std::vector<NpyFieldSource::Field> fields;
  std::vector<uint64_t> file_first;
  std::string what = "npy";
  for (const std::string& text : specs) {
    const size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 >= text.size()) {
      return Status::InvalidArgument("field '" + text + "': expected NAME=PATTERN (for example data='dir/*_data.npy')");
    }
    // The name rules of HDF5 fields (FieldSpec); the pattern is a path, not an HDF5 path.
    auto named = FieldSpec::Parse(text.substr(0, eq) + "=/x");
    if (!named.ok()) return named.status();
    const std::string name = named->name, pattern = text.substr(eq + 1);
    for (const auto& f : fields) {
      if (f.info.name == name) return Status::InvalidArgument("field '" + name + "' is named twice");
    }
    auto files = ExpandFiles(pattern);
    if (!files.ok()) return files.status().WithContext("field '" + name + "'");
    NpyMap* first = nullptr;
    NpyFieldSource::Field f;
    f.info.name = name;
    f.info.path = "/" + name;
    std::vector<uint64_t> counts;
    for (const std::string& path : *files) {
      auto m = MapNpy(path);
      if (!m.ok()) return m.status();
      std::vector<uint64_t> sample_shape = (*m)->shape;
      uint64_t n = 1;
      if (!no_sample_axis) {
        if (sample_shape.empty()) {
          return Status::InvalidArgument(path +
                                         ": a 0-d array has no sample axis (is each file one sample? "
                                         "--no-sample-axis)");
        }
        n = sample_shape[0];
        sample_shape.erase(sample_shape.begin());
      }
      if (first == nullptr) {
        f.info.dtype = (*m)->dtype;
        f.info.sample_shape = sample_shape;
        f.info.sample_bytes = DTypeSize((*m)->dtype);
        for (uint64_t x : sample_shape) f.info.sample_bytes *= x;  // checked by MapNpy against the file's size
        first = m->get();
      } else if ((*m)->dtype != f.info.dtype || sample_shape != f.info.sample_shape) {
        return Status::InvalidArgument(path + ": field '" + name + "' is " + std::string(DTypeName((*m)->dtype)) + " " +
                                       ShapeText(sample_shape) + " per sample, but in " + first->path + " it is " +
                                       std::string(DTypeName(f.info.dtype)) + " " + ShapeText(f.info.sample_shape) +
                                       "; every file of a field must agree in dtype and sample shape");
      }
      counts.push_back(n);
      f.files.push_back(std::move(*m));
    }
    if (fields.empty()) {
      file_first.assign(1, 0);
      for (uint64_t n : counts) {
        const auto next = CheckedAdd(file_first.back(), n);
        if (!next) return Status::Unsupported(pattern + ": the files' sample counts overflow 64 bits");
        file_first.push_back(*next);
      }
    } else {
      if (f.files.size() != fields[0].files.size()) {
        return Status::InvalidArgument("field '" + name + "' (" + pattern + ") names " +
                                       std::to_string(f.files.size()) + " files but field '" + fields[0].info.name +
                                       "' names " + std::to_string(fields[0].files.size()) +
                                       "; file i of every field holds the same samples");
      }
      for (size_t i = 0; i < counts.size(); ++i) {
        if (counts[i] != file_first[i + 1] - file_first[i]) {
          return Status::InvalidArgument(f.files[i]->path + ": field '" + name + "' has " + std::to_string(counts[i]) +
                                         " samples but " + fields[0].files[i]->path + " (field '" +
                                         fields[0].info.name + "') has " +
                                         std::to_string(file_first[i + 1] - file_first[i]));
        }
      }
    }
    what += (fields.empty() ? " " : ",") + name + "=" + pattern;
    fields.push_back(std::move(f));
  }
  if (file_first.back() == 0) return Status::InvalidArgument(what + ": no samples");
  return std::unique_ptr<ChunkSource>(
      std::make_unique<NpyFieldSource>(std::move(fields), std::move(file_first), std::move(what)));
}

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
