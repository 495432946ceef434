// Inspect report and sample export (.npy / .pgm / .ppm).
#include "gpufeed/inspect.h"
#include "gpufeed/names.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/atomic_file.h"

namespace gpufeed {

InspectReport Inspect(const Dataset& ds) {
  InspectReport r;
  for (int64_t l : ds.labels()) ++r.label_histogram[l];
  const DatasetInfo& info = ds.info();
  if (info.stored_bytes > 0) r.compression_ratio = static_cast<double>(info.raw_bytes) / info.stored_bytes;
  if (!info.hdf5_chunk_shape.empty()) {
    r.hdf5_chunks = 1;
    for (size_t d = 0; d < info.shape.size(); ++d) {
      r.hdf5_chunks *= (info.shape[d] + info.hdf5_chunk_shape[d] - 1) / info.hdf5_chunk_shape[d];
    }
  }
  r.recommended_cache_bytes = std::min(info.raw_bytes, InspectReport::kRecommendedWindow * ds.chunk_bytes_max());
  return r;
}

namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Status WriteWhole(const std::string& path, const std::string& header, const std::vector<std::byte>& body) {
  AtomicFile f(path);
  GPUFEED_RETURN_IF_ERROR(f.Write(header));
  GPUFEED_RETURN_IF_ERROR(f.Write(body.data(), body.size()));
  return f.Commit();
}

}  // namespace

Status ExportSample(const Dataset& ds, uint64_t k, const std::string& path) {
  if (k >= ds.num_samples()) {
    return Status::InvalidArgument("sample " + std::to_string(k) + " out of range (" +
                                   std::to_string(ds.num_samples()) + " samples)");
  }
  std::vector<std::byte> sample(ds.sample_bytes());
  GPUFEED_RETURN_IF_ERROR(ds.ReadSamples(k, 1, sample));
  const auto& shape = ds.sample_shape();
  if (EndsWith(path, ".npy")) {
    std::string dict = "{'descr': '" + std::string(DTypeNpyDescr(ds.dtype())) + "', 'fortran_order': False, 'shape': (";
    for (uint64_t d : shape) dict += std::to_string(d) + ", ";
    dict += "), }";
    // Header: magic, version 1.0, little-endian length, dict padded with
    // spaces and a newline so the data starts 64-byte aligned.
    size_t total = 10 + dict.size() + 1;
    dict.append((64 - total % 64) % 64, ' ');
    dict += '\n';
    std::string header("\x93NUMPY\x01\x00", 8);
    header += static_cast<char>(dict.size() & 0xff);
    header += static_cast<char>(dict.size() >> 8);
    return WriteWhole(path, header + dict, sample);
  }
  const bool pgm = EndsWith(path, ".pgm"), ppm = EndsWith(path, ".ppm");
  if (!pgm && !ppm) return Status::InvalidArgument(path + ": unknown format (use .npy, .pgm or .ppm)");
  if (ds.dtype() != DType::kUInt8) {
    return Status::Unsupported(path + ": .pgm/.ppm need uint8 samples, dataset is " +
                               std::string(DTypeName(ds.dtype())) + " (use .npy)");
  }
  // Find H, W, C and whether channels lead.
  uint64_t h = 0, w = 0, c = 1;
  bool channels_first = true;
  if (shape.size() == 2) {
    h = shape[0];
    w = shape[1];
  } else if (shape.size() == 3) {
    const bool nhwc = kLayoutNames.Find(ds.info().layout) == Layout::kNHWC ||
                      (ds.info().layout.empty() && shape[0] > 4 && shape[2] <= 4);
    channels_first = !nhwc;
    c = nhwc ? shape[2] : shape[0];
    h = nhwc ? shape[0] : shape[1];
    w = nhwc ? shape[1] : shape[2];
  } else {
    return Status::Unsupported(path + ": sample shape is not an image ([H, W], [C, H, W] or [H, W, C])");
  }
  const uint64_t want_c = pgm ? 1 : 3;
  if (c != want_c) {
    return Status::InvalidArgument(path + ": sample has " + std::to_string(c) + " channels; " +
                                   (pgm ? ".pgm needs 1 (use .ppm)" : ".ppm needs 3 (use .pgm)"));
  }
  std::vector<std::byte> pixels(h * w * c);
  for (uint64_t y = 0; y < h; ++y) {
    for (uint64_t x = 0; x < w; ++x) {
      for (uint64_t ch = 0; ch < c; ++ch) {
        const uint64_t src = channels_first ? (ch * h + y) * w + x : (y * w + x) * c + ch;
        pixels[(y * w + x) * c + ch] = sample[src];
      }
    }
  }
  const std::string header =
      std::string(pgm ? "P5\n" : "P6\n") + std::to_string(w) + " " + std::to_string(h) + "\n255\n";
  return WriteWhole(path, header, pixels);
}

}  // namespace gpufeed
