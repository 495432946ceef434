// How shuffled an order is, as seen from the chunks: for each chunk, where in
// the epoch its samples land. `random` spreads a chunk over the whole epoch
// (each sample costs a chunk read without a big cache); `block` with window W
// keeps a chunk's samples within W chunks' worth of positions.
#ifndef GPUFEED_BENCH_ORDER_STATS_H_
#define GPUFEED_BENCH_ORDER_STATS_H_

#include <cstdint>

#include "gpufeed/loader.h"

namespace gpufeed::bench {

struct OrderStats {
  double mean_span = 0;              // mean over chunks of (last - first position of its samples) / N
  double mean_std = 0;               // mean over chunks of the std of its samples' positions / N (uniform: 0.289)
  double mean_abs_displacement = 0;  // mean |position - index| / N, how far samples move
};

OrderStats MeasureOrder(uint64_t num_samples, uint64_t chunk_samples, Order order, uint64_t window, uint64_t seed);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_ORDER_STATS_H_
