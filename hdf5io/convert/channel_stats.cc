// The per-channel accumulator (channel_stats.h) and ComputeStats
// (gpufeed/stats.h): chunks read in parallel, merged in a fixed tree.
#include "hdf5io/convert/channel_stats.h"

#include "common/mutex.h"
#include "gpufeed/convert.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>

namespace gpufeed {
namespace stats {
namespace {

// IEEE half -> float, for a lookup table of all 65536 values.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

const float* HalfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = HalfToFloat(static_cast<uint16_t>(i));
    return t;
  }();
  return table.data();
}

struct Half {
  uint16_t bits;
};

// Exact integer sums of one channel since the last flush (8/16-bit data).
struct IntSums {
  uint64_t n = 0;
  int64_t s1 = 0;
  uint64_t s2 = 0;
  int64_t min = 0, max = 0;
};

// Flush before a sample would take a channel's count past 2^30: with
// |v| < 2^16 that keeps |s1| < 2^46 and s2 < 2^62; a single sample alone
// (at most a < 4 GiB chunk, < 2^31 16-bit elements) keeps s2 < 2^63.
constexpr uint64_t kIntFlush = uint64_t{1} << 30;

Moments FromIntSums(const IntSums& s) {
  Moments m;
  m.n = s.n;
  if (s.n == 0) return m;
  m.mean = static_cast<double>(s.s1) / static_cast<double>(s.n);
  // n * M2 = n * s2 - s1^2, exact in 128 bits.
  const __int128 nm2 = static_cast<__int128>(s.n) * static_cast<__int128>(s.s2) -
                       static_cast<__int128>(s.s1) * static_cast<__int128>(s.s1);
  m.m2 = static_cast<double>(nm2) / static_cast<double>(s.n);
  m.min = static_cast<double>(s.min);
  m.max = static_cast<double>(s.max);
  return m;
}

}  // namespace

void Moments::Merge(const Moments& o) {
  nan += o.nan;
  inf += o.inf;
  if (o.n == 0) return;
  if (n == 0) {
    const uint64_t keep_nan = nan, keep_inf = inf;
    *this = o;
    nan = keep_nan;
    inf = keep_inf;
    return;
  }
  const double na = static_cast<double>(n), nb = static_cast<double>(o.n);
  const double total = na + nb;
  const double delta = o.mean - mean;
  mean += delta * (nb / total);
  m2 += o.m2 + delta * delta * (na * nb / total);
  n += o.n;
  min = std::min(min, o.min);
  max = std::max(max, o.max);
}

Geometry GeometryOf(const std::vector<uint64_t>& shape, int channel_axis) {
  Geometry g;
  uint64_t total = 1;
  for (uint64_t x : shape) total *= x;
  if (channel_axis < 0 || static_cast<size_t>(channel_axis) >= shape.size()) {
    g.inner = total;
    return g;
  }
  const size_t a = static_cast<size_t>(channel_axis);
  for (size_t i = 0; i < a; ++i) g.outer *= shape[i];
  g.channels = shape[a];
  for (size_t i = a + 1; i < shape.size(); ++i) g.inner *= shape[i];
  return g;
}

Accumulator::Accumulator(DType dtype, Geometry g) : dtype_(dtype), g_(g), m_(g.channels) {}

bool Accumulator::Supports(DType dtype) { return dtype != DType::kBFloat16; }

template <typename T>
void Accumulator::AddInt(const std::byte* data, uint64_t samples) {
  const uint64_t C = g_.channels, per_sample = g_.outer * g_.inner;  // elements of a channel in a sample
  // Per-channel scratch, flat so the NHWC case (inner == 1) is a tight loop.
  std::vector<int64_t> s1(C, 0), mn(C, std::numeric_limits<int64_t>::max()), mx(C, std::numeric_limits<int64_t>::min());
  std::vector<uint64_t> s2(C, 0);
  uint64_t n = 0;  // elements per channel in the scratch
  auto flush = [&] {
    for (uint64_t c = 0; c < C && n > 0; ++c) {
      IntSums x;
      x.n = n;
      x.s1 = s1[c];
      x.s2 = s2[c];
      x.min = mn[c];
      x.max = mx[c];
      m_[c].Merge(FromIntSums(x));
      s1[c] = 0;
      s2[c] = 0;
      mn[c] = std::numeric_limits<int64_t>::max();
      mx[c] = std::numeric_limits<int64_t>::min();
    }
    n = 0;
  };
  const T* p = reinterpret_cast<const T*>(data);
  for (uint64_t s = 0; s < samples; ++s) {
    if (n > 0 && n + per_sample > kIntFlush) flush();
    if (g_.inner == 1) {
      for (uint64_t o = 0; o < g_.outer; ++o, p += C) {
        for (uint64_t c = 0; c < C; ++c) {
          const int64_t v = p[c];
          s1[c] += v;
          s2[c] += static_cast<uint64_t>(v * v);
          mn[c] = std::min(mn[c], v);
          mx[c] = std::max(mx[c], v);
        }
      }
    } else {
      for (uint64_t o = 0; o < g_.outer; ++o) {
        for (uint64_t c = 0; c < C; ++c, p += g_.inner) {
          int64_t a1 = 0, lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
          uint64_t a2 = 0;
          if constexpr (sizeof(T) == 1) {
            // 8-bit: 32-bit sums over blocks of 4096 (4096 x 255^2 < 2^32),
            // which the compiler vectorizes; exact all the same.
            for (uint64_t k0 = 0; k0 < g_.inner; k0 += 4096) {
              const uint64_t k1 = std::min<uint64_t>(g_.inner, k0 + 4096);
              int32_t b1 = 0;
              uint32_t b2 = 0;
              T blo = std::numeric_limits<T>::max(), bhi = std::numeric_limits<T>::min();
              for (uint64_t k = k0; k < k1; ++k) {
                const T v = p[k];
                b1 += v;
                b2 += static_cast<uint32_t>(static_cast<int32_t>(v) * static_cast<int32_t>(v));
                blo = std::min(blo, v);
                bhi = std::max(bhi, v);
              }
              a1 += b1;
              a2 += b2;
              lo = std::min<int64_t>(lo, blo);
              hi = std::max<int64_t>(hi, bhi);
            }
          } else {
            for (uint64_t k = 0; k < g_.inner; ++k) {
              const int64_t v = p[k];
              a1 += v;
              a2 += static_cast<uint64_t>(v * v);
              lo = std::min(lo, v);
              hi = std::max(hi, v);
            }
          }
          s1[c] += a1;
          s2[c] += a2;
          mn[c] = std::min(mn[c], lo);
          mx[c] = std::max(mx[c], hi);
        }
      }
    }
    n += per_sample;
  }
  flush();
}

namespace {
template <typename T>
double Value(T v) {
  return static_cast<double>(v);
}
template <>
double Value<Half>(Half v) {
  return static_cast<double>(HalfTable()[v.bits]);
}

// Sums of one channel shifted by k (a value near its mean), so that M2 =
// s2 - s1^2 / n does not cancel catastrophically when the mean is large.
struct ShiftedSums {
  bool have_k = false;
  double k = 0, s1 = 0, s2 = 0, min = 0, max = 0;
  uint64_t n = 0, nan = 0, inf = 0;
};

// One channel's run of `inner` values at p added to its sums.
template <typename T>
void AddRun(ShiftedSums& a, const T* p, uint64_t inner) {
  // Value by value: non-finite values counted apart, the shift and
  // min/max set by the first finite one.
  auto one_by_one = [&](uint64_t from, uint64_t to) {
    for (uint64_t k = from; k < to; ++k) {
      const double v = Value(p[k]);
      if constexpr (!std::is_integral_v<T>) {
        if (!std::isfinite(v)) {
          if (std::isnan(v)) {
            ++a.nan;
          } else {
            ++a.inf;
          }
          continue;
        }
      }
      if (!a.have_k) {
        a.have_k = true;
        a.k = v;
      }
      if (a.n == 0) a.min = a.max = v;
      const double d = v - a.k;
      a.s1 += d;
      a.s2 += d * d;
      a.min = std::min(a.min, v);
      a.max = std::max(a.max, v);
      ++a.n;
    }
  };
  // Long runs: blocks whose values are all finite (checked first) go
  // through four independent accumulators, which the CPU overlaps.
  // The order is fixed either way, so results do not vary run to run.
  constexpr uint64_t kBlock = 1024;
  uint64_t k = 0;
  while (k < inner) {
    if (a.n == 0 || inner - k < kBlock) {
      const uint64_t to = a.n == 0 ? k + 1 : inner;
      one_by_one(k, to);
      k = to;
      continue;
    }
    bool finite = true;
    if constexpr (!std::is_integral_v<T>) {
      double probe = 0;
      for (uint64_t i = k; i < k + kBlock; ++i) probe += Value(p[i]) * 0.0;  // NaN iff a NaN/Inf is there
      finite = probe == 0.0;
    }
    if (!finite) {
      one_by_one(k, k + kBlock);
      k += kBlock;
      continue;
    }
    double s1[4] = {0, 0, 0, 0}, s2[4] = {0, 0, 0, 0};
    double lo[4] = {a.min, a.min, a.min, a.min}, hi[4] = {a.max, a.max, a.max, a.max};
    for (uint64_t i = k; i < k + kBlock; i += 4) {
      for (int j = 0; j < 4; ++j) {
        const double v = Value(p[i + j]);
        const double d = v - a.k;
        s1[j] += d;
        s2[j] += d * d;
        lo[j] = std::min(lo[j], v);
        hi[j] = std::max(hi[j], v);
      }
    }
    a.s1 += (s1[0] + s1[1]) + (s1[2] + s1[3]);
    a.s2 += (s2[0] + s2[1]) + (s2[2] + s2[3]);
    a.min = std::min(std::min(lo[0], lo[1]), std::min(lo[2], lo[3]));
    a.max = std::max(std::max(hi[0], hi[1]), std::max(hi[2], hi[3]));
    a.n += kBlock;
    k += kBlock;
  }
}
}  // namespace

template <typename T>
void Accumulator::AddFloat(const std::byte* data, uint64_t samples) {
  std::vector<ShiftedSums> sums(g_.channels);
  for (uint64_t c = 0; c < g_.channels; ++c) {
    if (m_[c].n > 0) {
      sums[c].have_k = true;
      sums[c].k = m_[c].mean;
    }
  }
  const T* p = reinterpret_cast<const T*>(data);
  for (uint64_t s = 0; s < samples; ++s) {
    for (uint64_t o = 0; o < g_.outer; ++o) {
      for (uint64_t c = 0; c < g_.channels; ++c) {
        AddRun(sums[c], p, g_.inner);
        p += g_.inner;
      }
    }
  }
  for (uint64_t c = 0; c < g_.channels; ++c) {
    const ShiftedSums& a = sums[c];
    Moments m;
    m.nan = a.nan;
    m.inf = a.inf;
    m.n = a.n;
    if (a.n > 0) {
      const double n = static_cast<double>(a.n);
      m.mean = a.k + a.s1 / n;
      m.m2 = std::max(0.0, a.s2 - a.s1 * a.s1 / n);
      m.min = a.min;
      m.max = a.max;
    }
    m_[c].Merge(m);
  }
}

void Accumulator::Add(const std::byte* data, uint64_t samples) {
  switch (dtype_) {
    case DType::kUInt8:
      return AddInt<uint8_t>(data, samples);
    case DType::kInt8:
      return AddInt<int8_t>(data, samples);
    case DType::kUInt16:
      return AddInt<uint16_t>(data, samples);
    case DType::kInt16:
      return AddInt<int16_t>(data, samples);
    case DType::kUInt32:
      return AddFloat<uint32_t>(data, samples);
    case DType::kInt32:
      return AddFloat<int32_t>(data, samples);
    case DType::kUInt64:
      return AddFloat<uint64_t>(data, samples);
    case DType::kInt64:
      return AddFloat<int64_t>(data, samples);
    case DType::kFloat16:
      return AddFloat<Half>(data, samples);
    case DType::kFloat32:
      return AddFloat<float>(data, samples);
    case DType::kFloat64:
      return AddFloat<double>(data, samples);
    case DType::kBFloat16:
      return;  // refused by Supports()
  }
}

void Accumulator::Merge(const Accumulator& o) {
  for (size_t c = 0; c < m_.size() && c < o.m_.size(); ++c) m_[c].Merge(o.m_[c]);
}

std::vector<ChannelStats> Accumulator::Result() const {
  std::vector<ChannelStats> out(m_.size());
  for (size_t c = 0; c < m_.size(); ++c) {
    const Moments& m = m_[c];
    out[c].count = m.n;
    out[c].nan = m.nan;
    out[c].inf = m.inf;
    if (m.n > 0) {
      out[c].mean = m.mean;
      out[c].stddev = std::sqrt(std::max(0.0, m.m2 / static_cast<double>(m.n)));
      out[c].min = m.min;
      out[c].max = m.max;
    }
  }
  return out;
}

}  // namespace stats

int ChannelAxisFromLayout(std::string_view layout, size_t sample_rank) {
  if (layout.empty() || std::count(layout.begin(), layout.end(), 'C') != 1) return -1;
  const int c = static_cast<int>(layout.find('C'));
  if (layout.size() == sample_rank + 1 && layout[0] == 'N') return c - 1;
  if (layout.size() == sample_rank) return c;
  return -1;
}

int GuessChannelAxis(std::string_view layout, const std::vector<uint64_t>& shape, bool* guessed) {
  *guessed = false;
  const int from_layout = ChannelAxisFromLayout(layout, shape.size());
  if (from_layout >= 0 || !layout.empty() || shape.size() != 3) return from_layout;
  *guessed = true;
  const std::string guess = GuessLayout(shape);
  if (!guess.empty()) return ChannelAxisFromLayout(guess, 3);
  constexpr uint64_t kMaxGuessedChannels = 64;
  if (shape[0] <= kMaxGuessedChannels && shape[0] < shape[2]) return 0;
  if (shape[2] <= kMaxGuessedChannels && shape[2] < shape[0]) return 2;
  *guessed = false;
  return -1;
}

Result<std::vector<FieldStats>> ComputeStats(const ChunkSource& source, const StatsOptions& options) {
  const std::vector<FieldInfo> fields = source.fields();
  if (source.decodes_samples()) {
    return Status::Unsupported(source.name() +
                               ": statistics of encoded images are not computed (they depend on the decode "
                               "options); convert the images to an array first");
  }
  if (!options.channel_axes.empty() && options.channel_axes.size() != fields.size()) {
    return Status::InvalidArgument(source.name() + ": " + std::to_string(options.channel_axes.size()) +
                                   " channel axes for " + std::to_string(fields.size()) + " fields");
  }
  std::vector<stats::Geometry> geometry;
  std::vector<FieldStats> out(fields.size());
  for (size_t j = 0; j < fields.size(); ++j) {
    const FieldInfo& f = fields[j];
    const int axis = options.channel_axes.empty() ? -1 : options.channel_axes[j];
    if (axis < -1 || (axis >= 0 && static_cast<size_t>(axis) >= f.sample_shape.size())) {
      return Status::InvalidArgument(source.name() + ": field '" + f.name + "' has " +
                                     std::to_string(f.sample_shape.size()) + " sample axes; channel axis " +
                                     std::to_string(axis) + " is not one of them");
    }
    if (!stats::Accumulator::Supports(f.dtype)) {
      return Status::Unsupported(source.name() + ": field '" + f.name + "' is " + std::string(DTypeName(f.dtype)) +
                                 ", which has no statistics here");
    }
    geometry.push_back(stats::GeometryOf(f.sample_shape, axis));
    out[j].name = f.name;
    out[j].path = f.path;
    out[j].channel_axis = axis;
    out[j].samples = source.num_samples();
  }
  const uint64_t n_chunks = source.num_chunks();
  const uint64_t capacity = source.chunk_samples();
  const uint64_t buffer_bytes = std::max(source.max_chunk_buffer_bytes(), capacity * source.sample_bytes());
  const int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  using Accs = std::vector<stats::Accumulator>;
  Accs identity;
  for (size_t j = 0; j < fields.size(); ++j) identity.emplace_back(fields[j].dtype, geometry[j]);

  // The first failure by chunk index (not by time), so the error is the same
  // whatever the threads did.
  struct {
    Mutex mu;
    uint64_t chunk GUARDED_BY(mu) = UINT64_MAX;
    Status status GUARDED_BY(mu);
  } error;
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> done{0}, done_samples{0};
  Mutex progress_mu;  // one progress call at a time
  const uint64_t step = std::max<uint64_t>(1, n_chunks / 100);

  Accs total;
  try {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      total = tbb::parallel_deterministic_reduce(
          tbb::blocked_range<uint64_t>(0, n_chunks, 1), identity,
          [&](const tbb::blocked_range<uint64_t>& r, Accs acc) {
            thread_local std::vector<std::byte> buf;
            if (buf.size() < buffer_bytes) buf.resize(buffer_bytes);
            for (uint64_t i = r.begin(); i != r.end() && !failed.load(std::memory_order_relaxed); ++i) {
              Status s = source.ReadChunk(i, std::span<std::byte>(buf.data(), buffer_bytes));
              if (!s.ok()) {
                MutexLock lock(&error.mu);
                if (i < error.chunk) {
                  error.chunk = i;
                  error.status = std::move(s);
                }
                failed.store(true);
                break;
              }
              const uint64_t n = source.samples_in_chunk(i);
              for (size_t j = 0; j < fields.size(); ++j) acc[j].Add(buf.data() + capacity * fields[j].offset, n);
              const uint64_t d = done.fetch_add(1) + 1;
              const uint64_t d_samples = done_samples.fetch_add(n) + n;
              if (options.progress && d % step == 0) {
                MutexLock lock(&progress_mu);
                options.progress(d_samples, source.num_samples());
              }
            }
            return acc;
          },
          [](Accs a, const Accs& b) {
            for (size_t j = 0; j < a.size(); ++j) a[j].Merge(b[j]);
            return a;
          });
    });
  } catch (const std::exception& e) {
    return Status::Internal(source.name() + ": computing statistics: " + e.what());
  }
  if (failed.load()) {
    MutexLock lock(&error.mu);
    return error.status;
  }
  for (size_t j = 0; j < fields.size(); ++j) out[j].channels = total[j].Result();
  return out;
}

}  // namespace gpufeed
