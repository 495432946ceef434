// The benchmarks' checks (bench_checks.h): coverage, hashes, echo passes,
// fed values against an independent reference.
#include "bench/bench_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gpufeed::bench {

Status IndexTally::Add(uint64_t index) {
  if (index >= count_.size()) {
    return Status::Corrupt("sample index " + std::to_string(index) + " is outside the dataset's " +
                           std::to_string(count_.size()));
  }
  ++count_[index];
  ++delivered_;
  return Status::Ok();
}

Status IndexTally::Add(std::span<const uint64_t> indices) {
  for (uint64_t i : indices) GPUFEED_RETURN_IF_ERROR(Add(i));
  return Status::Ok();
}

Status CheckCoverage(const IndexTally& tally, const CoverageClaim& claim, const std::string& what) {
  const std::vector<uint32_t>& c = tally.counts();
  const uint64_t n = c.size();
  uint64_t missing = 0, repeats = 0, first_missing = n, first_doubled = n;
  for (uint64_t k = 0; k < n; ++k) {
    if (c[k] == 0) {
      ++missing;
      if (first_missing == n) first_missing = k;
    } else if (c[k] > 1) {
      repeats += c[k] - 1;
      if (first_doubled == n) first_doubled = k;
    }
  }
  auto fail = [&](const std::string& why) { return Status::Corrupt(what + ": " + why + "; no figure is printed"); };
  const std::string counts =
      std::to_string(missing) + " samples missing and " + std::to_string(repeats) + " repeated (first missing " +
      (first_missing < n ? std::to_string(first_missing) : std::string("none")) + ", first repeated " +
      (first_doubled < n ? std::to_string(first_doubled) : std::string("none")) + ")";
  switch (claim.kind) {
    case Coverage::kEveryIndexOnce:
      if (missing || repeats) return fail("not every index once: " + counts);
      break;
    case Coverage::kNoIndexDoubled:
      if (repeats) return fail("an index delivered twice: " + counts);
      if (tally.delivered() != claim.expected) {
        return fail(std::to_string(tally.delivered()) + " samples delivered, " + std::to_string(claim.expected) +
                    " expected");
      }
      break;
    case Coverage::kPadded: {
      const uint64_t ranks = std::max<uint64_t>(1, claim.expected);
      const uint64_t want_repeats = (n + ranks - 1) / ranks * ranks - n;
      if (missing || repeats != want_repeats) {
        return fail("the union of " + std::to_string(ranks) + " ranks: " + counts + ", " +
                    std::to_string(want_repeats) + " padded repeats expected");
      }
      break;
    }
  }
  return Status::Ok();
}

std::string DescribeCoverage(const IndexTally& tally, const CoverageClaim& claim) {
  switch (claim.kind) {
    case Coverage::kEveryIndexOnce:
      return "every index once";
    case Coverage::kNoIndexDoubled:
      return "no index doubled (" + std::to_string(tally.delivered()) + " of " + std::to_string(tally.num_samples()) +
             " samples)";
    case Coverage::kPadded: {
      const uint64_t n = tally.num_samples(), ranks = std::max<uint64_t>(1, claim.expected);
      return "every index, " + std::to_string((n + ranks - 1) / ranks * ranks - n) + " padded repeats";
    }
  }
  return "";
}

Status CompareHashes(std::span<const uint64_t> got, std::span<const uint64_t> want, const std::string& what) {
  if (got.size() != want.size()) {
    return Status::Corrupt(what + ": " + std::to_string(got.size()) + " samples hashed, the reference has " +
                           std::to_string(want.size()));
  }
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k] != want[k]) {
      return Status::Corrupt(what + ": sample " + std::to_string(k) +
                             " differs from HDF5's H5Dread; refusing to time a wrong reader");
    }
  }
  return Status::Ok();
}

Status EchoCheck::Add(uint64_t upload, int pass, std::span<const uint64_t> indices) {
  if (pass < 0 || pass >= echo_) {
    return Status::Corrupt("an output batch of pass " + std::to_string(pass) + " with echo " + std::to_string(echo_));
  }
  if (started_ && upload != last_upload_) {
    if (upload < last_upload_) {
      return Status::Corrupt("an output batch of upload " + std::to_string(upload) + " came after upload " +
                             std::to_string(last_upload_));
    }
    GPUFEED_RETURN_IF_ERROR(CheckUpload());
  }
  if (pass != 0 && passes_.empty()) {
    return Status::Corrupt("upload " + std::to_string(upload) + ": echo pass " + std::to_string(pass) +
                           " before its fresh pass");
  }
  started_ = true;
  last_upload_ = upload;
  if (pass < last_pass_) {
    return Status::Corrupt("echo pass " + std::to_string(pass) + " came after pass " + std::to_string(last_pass_));
  }
  if (passes_.size() <= static_cast<size_t>(pass)) passes_.resize(static_cast<size_t>(pass) + 1);
  passes_[static_cast<size_t>(pass)].insert(passes_[static_cast<size_t>(pass)].end(), indices.begin(), indices.end());
  last_pass_ = pass;
  return Status::Ok();
}

Status EchoCheck::CheckUpload() {
  const std::string upload = "upload " + std::to_string(uploads_);
  if (passes_.empty()) return Status::Ok();
  if (exact_ ? passes_.size() != static_cast<size_t>(echo_) : passes_.size() > static_cast<size_t>(echo_)) {
    return Status::Corrupt(upload + " was used " + std::to_string(passes_.size()) + " times, echo is " +
                           std::to_string(echo_));
  }
  std::vector<uint64_t> fresh = passes_[0];
  std::sort(fresh.begin(), fresh.end());
  for (size_t p = 1; p < passes_.size(); ++p) {
    std::vector<uint64_t> echoed = passes_[p];
    std::sort(echoed.begin(), echoed.end());
    if (echoed != fresh) {
      return Status::Corrupt(upload + ": echo pass " + std::to_string(p) +
                             " is not a permutation of its fresh pass's samples");
    }
  }
  passes_.clear();
  last_pass_ = -1;
  ++uploads_;
  return Status::Ok();
}

Status EchoCheck::Finish() { return CheckUpload(); }

uint64_t FeedSampleSpec::out_sample_bytes() const {
  return uint64_t(channels) * height * width * (dtype == DType::kFloat32 ? 4 : 2);
}

namespace {

// IEEE half to float, written out here (not the library's twin) so that the
// check does not share the code it checks.
float HalfToFloat(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man + 1024), exp - 25);
  }
  return (h & 0x8000) ? -v : v;
}

bool Close(DType dtype, float got, float want) {
  const float diff = std::fabs(got - want);
  switch (dtype) {
    case DType::kFloat32:
      return got == want;
    case DType::kFloat16:
      return diff <= std::max(std::ldexp(std::fabs(want), -11), std::ldexp(1.0f, -25));
    default:  // bf16
      return diff <= std::ldexp(std::fabs(want), -8);
  }
}

uint64_t Offset(Layout layout, int c, int y, int x, int channels, int height, int width) {
  return layout == Layout::kNCHW ? (uint64_t(c) * height + y) * width + x : (uint64_t(y) * width + x) * channels + c;
}

}  // namespace

float OutputValue(DType dtype, const void* row, uint64_t element) {
  const auto* p = static_cast<const uint8_t*>(row);
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p + element * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + element * 2, 2);
  if (dtype == DType::kFloat16) return HalfToFloat(h);
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Status CheckFeedSample(const FeedSampleSpec& s, const uint8_t* stored, const void* got, const std::string& what,
                       std::string* crop) {
  const int pad = s.crop_padding, C = s.channels, H = s.height, W = s.width;
  // Tried from no crop outwards: the first elements reject a wrong crop.
  for (int flip = 0; flip <= (s.flip ? 1 : 0); ++flip) {
    for (int dy = -pad; dy <= pad; ++dy) {
      for (int dx = -pad; dx <= pad; ++dx) {
        bool match = true;
        for (int c = 0; c < C && match; ++c) {
          for (int y = 0; y < H && match; ++y) {
            for (int x = 0; x < W; ++x) {
              const int sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
              float v = 0.0f;
              if (sy >= 0 && sy < H && sx >= 0 && sx < W) v = stored[Offset(s.in_layout, c, sy, sx, C, H, W)];
              const float want = (v - s.mean[static_cast<size_t>(c)]) * s.inv_std[static_cast<size_t>(c)];
              if (!Close(s.dtype, OutputValue(s.dtype, got, Offset(s.out_layout, c, y, x, C, H, W)), want)) {
                match = false;
                break;
              }
            }
          }
        }
        if (match) {
          if (crop != nullptr) {
            *crop = "dy " + std::to_string(dy) + " dx " + std::to_string(dx) + (flip ? " flipped" : "");
          }
          return Status::Ok();
        }
      }
    }
  }
  return Status::Corrupt(what + ": its values are no crop" + (s.flip ? " or flip" : "") +
                         " of the file's sample through the transform (the feed's " + std::string(DTypeName(s.dtype)) +
                         " output against an independent CPU reference)");
}

Status CheckDecodedSample(const FeedSampleSpec& s, const uint8_t* reference, const void* got, double max_mean_levels,
                          const std::string& what, double* mean_levels) {
  const int C = s.channels, H = s.height, W = s.width;
  double sum = 0;
  for (int c = 0; c < C; ++c) {
    const double inv = s.inv_std[static_cast<size_t>(c)], mean = s.mean[static_cast<size_t>(c)];
    for (int y = 0; y < H; ++y) {
      for (int x = 0; x < W; ++x) {
        const double level = OutputValue(s.dtype, got, Offset(s.out_layout, c, y, x, C, H, W)) / inv + mean;
        sum += std::fabs(level - reference[Offset(s.in_layout, c, y, x, C, H, W)]);
      }
    }
  }
  const double mean_diff = sum / (double(C) * H * W);
  if (mean_levels != nullptr) *mean_levels = mean_diff;
  if (!(mean_diff <= max_mean_levels)) {
    return Status::Corrupt(what + ": its pixels differ from the CPU decode of the same sample by " +
                           std::to_string(mean_diff) + " levels of 255 on average (at most " +
                           std::to_string(max_mean_levels) + " allowed)");
  }
  return Status::Ok();
}

}  // namespace gpufeed::bench
