// Per-channel statistics of a dataset's fields (`gpufeed inspect --stats`,
// and the mean/std `gpufeed convert` writes), computed chunk by chunk in
// parallel, and where they are stored for the loader: the mean/std
// attributes of the HDF5 dataset, or a sidecar file beside a read-only file.
//
//   auto src = gpufeed::FieldSource::Open("deepcam/*.h5", o);
//   auto stats = gpufeed::ComputeStats(**src, {.channel_axes = {0, -1}});
//   gpufeed::StoreStats(file, *stats, gpufeed::StoreMode::kAuto);
//
// Numerics: per chunk, 8- and 16-bit integers are summed exactly in
// integers; every other type as double sums shifted by a value of the
// channel (the running mean once there is one), which keeps the variance
// accurate where the mean is far from 0. Chunks are merged with Chan's
// formula in a fixed tree (tbb::parallel_deterministic_reduce), so the result
// does not depend on the thread count or timing. NaN and +-Inf in float data
// are counted apart and left out of count, mean, std, min and max.
#ifndef GPUFEED_STATS_H_
#define GPUFEED_STATS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/status.h"

namespace gpufeed {

struct ChannelStats {
  uint64_t count = 0;         // finite values counted
  double mean = 0;            // of the finite values, in stored units
  double stddev = 0;          // population std (divides by count)
  double min = 0, max = 0;    // of the finite values; 0 when count == 0
  uint64_t nan = 0, inf = 0;  // float data: values left out (always 0 for integers)
};

struct FieldStats {
  std::string name;       // the field's name ("images", "data")
  std::string path;       // its HDF5 dataset path ("" when not from HDF5)
  int channel_axis = -1;  // axis of the sample's shape the channels run along; -1: one channel, the whole sample
  uint64_t samples = 0;
  std::vector<ChannelStats> channels;
  // The per-channel means and stds, as the mean/std attributes hold them.
  std::vector<double> means() const;
  std::vector<double> stddevs() const;
};

// The channel axis a layout names for a sample of rank `sample_rank`: the
// position of 'C' in a layout with one letter per axis of the whole array
// ("NCHW", "NHWC", "NCDHW": axis 0 is N) or of the sample ("CHW", "HWC");
// -1 when layout is empty, has no single 'C', or does not match the rank.
int ChannelAxisFromLayout(std::string_view layout, size_t sample_rank);

// The channel axis for statistics of a field that may record no layout:
// the layout's (above) when it names one; else, for a 3-axis sample, the
// axis GuessLayout (convert.h) picks, or else the smaller end when it is at
// most 64 and smaller than the other end ([16, 768, 1152] -> 0, DeepCAM's
// 16 channels; [768, 1152, 16] -> 2), the two layouts the GPU feed takes;
// -1 (the whole sample) otherwise. *guessed says whether it was a guess.
int GuessChannelAxis(std::string_view layout, const std::vector<uint64_t>& sample_shape, bool* guessed);

struct StatsOptions {
  // Per field of source.fields(), the channel axis (-1: the whole sample is
  // one channel). Empty: -1 for every field. Checked against each field's
  // sample rank (InvalidArgument).
  std::vector<int> channel_axes;
  int threads = 0;  // 0: all hardware threads
  // Called with the samples done so far and the total, from one thread at a
  // time (not necessarily the caller's), about every 1 % of the chunks.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Reads every chunk of `source` once (ReadChunk, one chunk per thread in
// flight: memory is threads x the read unit) and returns one FieldStats per
// field, in field order. A read error is returned as it came, naming the
// chunk; Unsupported for bfloat16 fields.
Result<std::vector<FieldStats>> ComputeStats(const ChunkSource& source, const StatsOptions& options);

// The sidecar that holds statistics for `file` when the file itself is not
// written: "<file>.gpufeed-stats.json" (docs/format.md "Statistics").
std::string StatsSidecarPath(const std::string& file);

enum class StoreMode {
  kAuto,        // attributes when the file and its directory are writable, else the sidecar
  kAttributes,  // attributes, or an error saying why not
  kSidecar,     // the sidecar, even for a writable file
};

// Stores `stats` (fields whose path is set) for the HDF5 file `file`:
// - attributes: `mean` and `std` (float64, one per channel) on each field's
//   dataset, replacing what was there. Atomic: the file is copied beside
//   itself (a reflink where the file system has them, else a byte copy), the
//   copy gets the attributes, is fsynced and renamed over the file, so a
//   failure or crash leaves the old file. Costs a copy of the file without
//   reflinks; the file's inode changes (hard links keep the old contents).
// - sidecar: StatsSidecarPath(file), written through AtomicFile; the file's
//   size and modification time are recorded and the sidecar is ignored once
//   they change. Entries for other datasets of an existing sidecar that
//   still matches the file are kept.
// Returns where they went ("attributes" or the sidecar's path).
Result<std::string> StoreStats(const std::string& file, const std::vector<FieldStats>& stats, StoreMode mode);

// The mean/std the sidecar of `file` holds for `dataset_path`, when there is
// a well-formed sidecar that matches the file's size and modification time
// (both vectors empty otherwise). The sidecar is untrusted: its size, JSON
// and array lengths are checked. Dataset::Open calls it when the dataset has
// no mean/std attributes. *ignored (when given): why a sidecar that is there
// was not used ("" when none is there or it was used), for the logger.
void ReadStatsSidecar(const std::string& file, const std::string& dataset_path, std::vector<double>* mean,
                      std::vector<double>* stddev, std::string* ignored = nullptr);

}  // namespace gpufeed

#endif  // GPUFEED_STATS_H_
