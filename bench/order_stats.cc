// Order statistics over one epoch of the sampler.
#include "bench/order_stats.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpufeed/loader.h"

namespace gpufeed::bench {

OrderStats MeasureOrder(uint64_t n, uint64_t k, Order order, uint64_t window, uint64_t seed) {
  const std::vector<uint64_t> o = EpochOrder(n, k, order, seed, 0, window);
  const uint64_t chunks = (n + k - 1) / k;
  std::vector<double> lo(chunks, 1e300), hi(chunks, -1), sum(chunks, 0), sq(chunks, 0), cnt(chunks, 0);
  OrderStats s;
  for (uint64_t p = 0; p < n; ++p) {
    const uint64_t c = o[p] / k;
    const double x = double(p) / n;
    lo[c] = std::min(lo[c], x);
    hi[c] = std::max(hi[c], x);
    sum[c] += x;
    sq[c] += x * x;
    cnt[c] += 1;
    s.mean_abs_displacement += std::abs(double(p) - double(o[p])) / n;
  }
  s.mean_abs_displacement /= n;
  for (uint64_t c = 0; c < chunks; ++c) {
    const double m = sum[c] / cnt[c];
    s.mean_span += hi[c] - lo[c];
    s.mean_std += std::sqrt(std::max(0.0, sq[c] / cnt[c] - m * m));
  }
  s.mean_span /= chunks;
  s.mean_std /= chunks;
  return s;
}

}  // namespace gpufeed::bench
