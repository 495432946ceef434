// A Session's statistics (include/gpufeed/session.h) and their JSON.
#include <cstdio>
#include <string>

#include "gpu/session/session_core.h"
#include "gpufeed/session.h"

namespace gpufeed {
namespace {

std::string JsonNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

SessionStats Session::stats() const {
  Core& c = *core_;
  if (c.next_started) return c.ended_stats;  // the ended epoch's while the next one runs ahead of its start
  SessionStats s;
  if (c.feed() && c.feed_state) {
    MutexLock lock(&c.feed_state->mu);
    s.loader = c.feed_state->feeder->loader_stats();
    s.feed = c.feed_state->feeder->stats();
    s.has_feed = true;
  } else if (c.stream) {
    s.loader = c.stream->stats();
  }
  s.first_batch_seconds = c.first_batch_seconds;
  s.started_early = c.started_early;
  return s;
}

std::string SessionStatsJson(const SessionStats& stats) {
  std::string j = "{";
  auto add = [&](const char* k, double v) {
    if (j.size() > 1) j += ", ";
    j += std::string("\"") + k + "\": " + JsonNumber(v);
  };
  if (stats.has_feed) {
    const FeedStats& f = stats.feed;
    add("feed_fresh_batches", double(f.fresh_batches));
    add("feed_echoed_batches", double(f.echoed_batches));
    add("feed_fresh_samples", double(f.fresh_samples));
    add("feed_echoed_samples", double(f.echoed_samples));
    add("feed_uploads", double(f.uploads));
    add("feed_bytes_uploaded", double(f.bytes_uploaded));
    add("feed_data_wait_seconds", f.data_wait_seconds);
    add("feed_wall_seconds", f.wall_seconds);
    add("feed_echo", f.echo);
    add("feed_on_gpu", f.on_gpu ? 1 : 0);
    add("feed_decoded_on_device", double(f.decoded_on_device));
    add("feed_decoded_by_loader", double(f.decoded_by_loader));
    add("feed_decode_fallbacks", double(f.decode_fallbacks));
    add("feed_decode_skipped", double(f.decode_skipped));
    add("feed_decode_seconds", f.decode_seconds);
  }
  const LoaderStats& s = stats.loader;
  add("batches", double(s.batches));
  add("samples", double(s.samples));
  add("bytes_delivered", double(s.bytes_delivered));
  add("chunk_reads", double(s.chunk_reads));
  add("bytes_read", double(s.bytes_read));
  add("bytes_decoded", double(s.bytes_decoded));
  add("chunk_hits", double(s.chunk_hits));
  add("chunk_misses", double(s.chunk_misses));
  add("prefetched", double(s.prefetched));
  add("chunk_shared_hits", double(s.chunk_shared_hits));
  add("chunk_reads_ahead", double(s.chunk_reads_ahead));
  add("plan_seconds", s.plan_seconds);
  add("fetch_seconds", s.fetch_seconds);
  add("assemble_seconds", s.assemble_seconds);
  add("deferred_samples", double(s.deferred_samples));
  add("host_decoded_samples", double(s.host_decoded_samples));
  add("balanced_samples", double(s.balanced_samples));
  add("skipped_samples", double(s.skipped_samples));
  add("minor_faults", double(s.minor_faults));
  add("major_faults", double(s.major_faults));
  add("chunk_bytes_mapped", double(s.chunk_bytes_mapped));
  add("chunk_bytes_held", double(s.chunk_bytes_held));
  add("source_probe_seconds", s.source_probe_seconds);
  add("source_open_seconds", s.source_open_seconds);
  add("source_opens", double(s.source_opens));
  add("source_planned_opens", double(s.source_planned_opens));
  add("host_decode_share", s.host_decode_share);
  add("consumer_wait_seconds", s.consumer_wait_seconds);
  add("wall_seconds", s.wall_seconds);
  add("first_batch_seconds", stats.first_batch_seconds);
  add("started_early", stats.started_early ? 1 : 0);
  add("hit_rate", s.hit_rate());
  add("read_amplification", s.read_amplification());
  add("samples_per_second", s.samples_per_second());
  add("mean_queue_depth", s.mean_queue_depth());
  j += "}";
  return j;
}

}  // namespace gpufeed
