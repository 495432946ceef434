// Session on index-valued data (sample k's bytes encode k), with the host's
// batches, through the feed's CPU twins and, on a machine with a GPU, through
// the feed on the GPU: every sample once an epoch, the first epoch started
// at open and the next epoch started early, each taken only by its own
// start (never delivered to another epoch, position or resume), a resume at another batch size
// delivering exactly the rest, interrupts ending a wait with nothing lost,
// batches outliving their session, statistics, and bad input refused with
// what to do.
#include "gpufeed/session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/testing/gpu_required.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

// 100 samples of [1, 4, 4] uint8 (16 bytes: the first 8 are the index),
// chunks of 10.
constexpr uint64_t kSamples = 100;
constexpr uint64_t kSampleBytes = 16;

std::string WriteFile(const std::string& tag) {
  const std::string dir = testing::MakeTempDir(tag);
  const std::vector<std::byte> data = testing::IndexSamples(kSamples, kSampleBytes);
  const std::string path = dir + "/in.h5";
  EXPECT_TRUE(testing::WriteH5(path, {kSamples, 1, 4, 4}, H5T_NATIVE_UINT8, data, {.chunk = {10, 1, 4, 4}}));
  return path;
}

// The host's batches as stored, the feed on its CPU twins, the feed on the GPU.
enum class Mode { kHost, kCpuFeed, kGpuFeed };

class SessionTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    path_ = WriteFile("session");
    if (GetParam() == Mode::kGpuFeed) {
      auto s = Session::Open(Opts());
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_TRUE((*s)->StartEpoch(0).ok());
      if (!(*s)->on_gpu()) GPUFEED_GPU_UNAVAILABLE("the feed runs on its CPU twins (no GPU, or its start failed)");
    }
  }
  bool feed() const { return GetParam() != Mode::kHost; }

  SessionOptions Opts(uint64_t batch_size = 8) const {
    SessionOptions o;
    o.source.data = path_;
    o.source.share = Share::kNone;
    o.source.loader.batch_size = batch_size;
    o.source.loader.order = Order::kBlock;
    o.source.loader.shuffle_window = 2;
    o.source.loader.seed = 11;
    o.source.loader.threads = 2;
    o.source.loader.prefetch = 4;
    // The tests' own file: no probe. A probe forks, and these tests open a
    // session while another's threads run its early epoch; under clang-14's
    // ASan a fork while another thread holds the allocator's lock leaves the
    // child stuck (ASan locks its allocator around fork only from LLVM 18),
    // and the probe then calls the file hostile after its 10 s. The probe's
    // own tests are hdf5io/hdf5's.
    o.source.open.trust_files = true;
    o.feed = GetParam() != Mode::kHost;
    o.feed_options.force_cpu = GetParam() != Mode::kGpuFeed;
    o.feed_options.mean = {0};
    o.feed_options.stddev = {1};  // float32 output equal to the stored bytes
    return o;
  }

  std::unique_ptr<Session> Open(const SessionOptions& o) const {
    auto s = Session::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::string path_;
};

// The samples of a batch, each checked against its bytes and label.
std::vector<uint64_t> SamplesOf(const SessionBatch& b) {
  std::vector<uint64_t> out;
  if (const Batch* h = b.host()) {
    EXPECT_EQ(b.device(), nullptr);
    EXPECT_EQ(h->size(), b.size());
    for (uint64_t i = 0; i < h->size(); ++i) {
      const int64_t k = testing::SampleIndexOf(h->images().subspan(i * kSampleBytes, kSampleBytes));
      EXPECT_EQ(k, static_cast<int64_t>(h->indices()[i])) << "batch " << b.index() << " row " << i;
      EXPECT_EQ(h->labels()[i], testing::IndexLabel(static_cast<uint64_t>(k)));
      out.push_back(static_cast<uint64_t>(k));
    }
    return out;
  }
  const DeviceBatch* d = b.device();
  EXPECT_NE(d, nullptr);
  if (d == nullptr) return out;
  EXPECT_EQ(static_cast<uint64_t>(d->size()), b.size());
  EXPECT_FALSE(b.feed_fields().empty());
  // float32 values equal to the stored bytes (mean 0, std 1); the device's
  // memory on the GPU, copied back.
  std::vector<float> px(b.size() * kSampleBytes);
  std::vector<int64_t> labels(b.size());
  const Status copied = b.CopyToHost(px.data(), labels.data());
  EXPECT_TRUE(copied.ok()) << copied.ToString();
  for (int i = 0; i < d->size(); ++i) {
    std::vector<std::byte> bytes(kSampleBytes);
    for (uint64_t p = 0; p < kSampleBytes; ++p) {
      bytes[p] = static_cast<std::byte>(static_cast<uint8_t>(px[static_cast<uint64_t>(i) * kSampleBytes + p]));
    }
    const int64_t k = testing::SampleIndexOf(bytes);
    EXPECT_EQ(k, static_cast<int64_t>(d->indices()[static_cast<size_t>(i)])) << "batch " << b.index() << " row " << i;
    EXPECT_EQ(labels[i], testing::IndexLabel(static_cast<uint64_t>(k)));
    out.push_back(static_cast<uint64_t>(k));
  }
  return out;
}

// Takes the rest of the epoch, each batch released as it comes.
std::vector<uint64_t> Drain(Session& s, uint64_t* batches = nullptr) {
  std::vector<uint64_t> got;
  for (;;) {
    auto b = s.Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || !*b) break;
    const std::vector<uint64_t> k = SamplesOf(**b);
    got.insert(got.end(), k.begin(), k.end());
    if (batches != nullptr) ++*batches;
  }
  return got;
}

void ExpectEverySampleOnce(std::vector<uint64_t> got) {
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), kSamples);
  for (uint64_t k = 0; k < kSamples; ++k) ASSERT_EQ(got[k], k) << "sample " << k << " missing or repeated";
}

TEST_P(SessionTest, EverySampleOnceAnEpochAndTheNextEpochStartedEarly) {
  auto s = Open(Opts());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->num_batches(), 13u);
  EXPECT_EQ(s->decode(), "none");
  std::vector<uint64_t> first;
  for (uint64_t e = 0; e < 3; ++e) {
    ASSERT_TRUE(s->StartEpoch(e).ok());
    EXPECT_EQ(s->on_gpu(), GetParam() == Mode::kGpuFeed);
    uint64_t batches = 0;
    const std::vector<uint64_t> got = Drain(*s, &batches);
    EXPECT_EQ(batches, 13u);
    ExpectEverySampleOnce(got);
    if (e == 0) first = got;
    if (e > 0) {
      EXPECT_NE(got, first) << "epoch " << e << " in epoch 0's order";
    }
    // Ended: the position is the epoch's end, the next epoch runs ahead and
    // the statistics stay the ended epoch's until it is started.
    EXPECT_EQ(s->position().epoch, e);
    EXPECT_EQ(s->position().next_batch, 13u);
    EXPECT_EQ(s->stats().loader.samples, kSamples);
    auto again = s->Next();
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(*again) << "the next epoch's batch before it was started";
  }
  // A rerun of the same epoch (step 0) is whole too.
  ASSERT_TRUE(s->StartEpoch(2).ok());
  ExpectEverySampleOnce(Drain(*s));
}

TEST_P(SessionTest, TheNextEpochWithoutTheEarlyStartIsTheSame) {
  SessionOptions early = Opts(), late = Opts();
  late.next_epoch_early = false;
  late.restart_feeder = false;
  auto a = Open(early), b = Open(late);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (uint64_t e = 0; e < 2; ++e) {
    ASSERT_TRUE(a->StartEpoch(e).ok());
    ASSERT_TRUE(b->StartEpoch(e).ok());
    EXPECT_EQ(Drain(*a), Drain(*b)) << "epoch " << e;
  }
}

TEST_P(SessionTest, ResumeAtAnotherBatchSizeDeliversTheRestExactlyOnce) {
  std::vector<uint64_t> before;
  std::string saved;
  {
    auto a = Open(Opts(8));
    ASSERT_NE(a, nullptr);
    ASSERT_TRUE(a->StartEpoch(1).ok());
    for (int i = 0; i < 5; ++i) {
      auto b = a->Next();
      ASSERT_TRUE(b.ok() && *b);
      const std::vector<uint64_t> k = SamplesOf(**b);
      before.insert(before.end(), k.begin(), k.end());
    }
    EXPECT_EQ(a->position().next_batch, 5u);
    const LoaderState st = a->state();
    EXPECT_EQ(st.epoch, 1u);
    EXPECT_EQ(st.consumed, 40u);
    saved = st.Serialize();
  }
  auto b = Open(Opts(12));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->CheckState(saved).ok());
  const Status loaded = b->LoadState(saved);
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  EXPECT_EQ(b->position().epoch, 1u);
  uint64_t batches = 0;
  std::vector<uint64_t> after = Drain(*b, &batches);
  EXPECT_EQ(after.size(), kSamples - 40);
  EXPECT_EQ(batches, 5u);  // 60 samples in batches of 12
  std::vector<uint64_t> all = before;
  all.insert(all.end(), after.begin(), after.end());
  ExpectEverySampleOnce(all);
  // The next epoch is this run's own, whole (a resumed epoch's successor
  // starts when asked).
  ASSERT_TRUE(b->StartEpoch(2).ok());
  uint64_t next_batches = 0;
  ExpectEverySampleOnce(Drain(*b, &next_batches));
  EXPECT_EQ(next_batches, 9u);
}

// The samples of whole epochs, in delivery order, of a session opened with
// `o` and started at each (epoch, batch) in turn.
std::vector<std::vector<uint64_t>> Epochs(const std::unique_ptr<Session>& s,
                                          const std::vector<std::pair<uint64_t, uint64_t>>& starts) {
  std::vector<std::vector<uint64_t>> out;
  for (auto [e, b] : starts) {
    EXPECT_TRUE(s->StartEpoch(e, b).ok());
    out.push_back(Drain(*s));
  }
  return out;
}

TEST_P(SessionTest, TheFirstEpochStartedAtOpenIsTakenOnlyByItsOwnStart) {
  SessionOptions late = Opts();
  late.first_epoch_early = false;
  late.next_epoch_early = false;
  // The reference: nothing started ahead of its start.
  auto ref = Open(late);
  ASSERT_NE(ref, nullptr);
  const auto want = Epochs(ref, {{0, 0}, {2, 0}, {0, 3}});
  ASSERT_EQ(want[0].size(), kSamples);
  // Epoch 0 taken as started at open: its stream ran while the session sat
  // idle (its clock began at open), and it is the reference's epoch 0.
  auto a = Open(Opts());
  ASSERT_NE(a, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(a->StartEpoch(0).ok());
  const SessionStats at_start = a->stats();
  EXPECT_TRUE(at_start.started_early);
  EXPECT_GE(at_start.loader.wall_seconds, 0.2) << "epoch 0's stream did not start at open";
  EXPECT_EQ(at_start.first_batch_seconds, 0) << "no batch yet";
  EXPECT_EQ(Drain(*a), want[0]);
  const SessionStats done = a->stats();
  EXPECT_GT(done.first_batch_seconds, 0);
  EXPECT_LT(done.first_batch_seconds, done.loader.wall_seconds);
  // Another epoch first, or epoch 0 from another batch: what was read ahead
  // is dropped, the start is that epoch's or batch's exactly.
  for (auto [e, b, w] : {std::tuple{2ull, 0ull, 1}, std::tuple{0ull, 3ull, 2}}) {
    auto o = Open(Opts());
    ASSERT_NE(o, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(o->StartEpoch(e, b).ok());
    EXPECT_FALSE(o->stats().started_early) << "epoch " << e << " batch " << b;
    EXPECT_EQ(Drain(*o), want[static_cast<size_t>(w)]) << "epoch " << e << " batch " << b;
  }
  // Off: nothing before the start.
  ASSERT_TRUE(ref->StartEpoch(1).ok());
  EXPECT_FALSE(ref->stats().started_early);
}

TEST_P(SessionTest, AnIdleSessionResumedMidEpochDeliversExactlyTheRest) {
  // Saved 5 batches into epoch 0 (the epoch the session starts at open) and
  // into epoch 1, resumed at the same and at another batch size by a session
  // that had sat idle with epoch 0 read ahead.
  for (uint64_t epoch : {0ull, 1ull}) {
    for (uint64_t resume_batch : {8ull, 12ull}) {
      std::vector<uint64_t> before, rest;
      std::string saved;
      {
        auto a = Open(Opts(8));
        ASSERT_NE(a, nullptr);
        ASSERT_TRUE(a->StartEpoch(epoch).ok());
        for (int i = 0; i < 5; ++i) {
          auto b = a->Next();
          ASSERT_TRUE(b.ok() && *b);
          const std::vector<uint64_t> k = SamplesOf(**b);
          before.insert(before.end(), k.begin(), k.end());
        }
        saved = a->state().Serialize();
        rest = Drain(*a);
      }
      auto b = Open(Opts(resume_batch));
      ASSERT_NE(b, nullptr);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const Status loaded = b->LoadState(saved);
      ASSERT_TRUE(loaded.ok()) << loaded.ToString();
      EXPECT_FALSE(b->stats().started_early);
      const std::vector<uint64_t> after = Drain(*b);
      if (resume_batch == 8) {
        EXPECT_EQ(after, rest) << "epoch " << epoch << ": the saved run's remaining batches, in order";
      } else {
        EXPECT_EQ(after.size(), kSamples - 40) << "epoch " << epoch;
      }
      std::vector<uint64_t> all = before;
      all.insert(all.end(), after.begin(), after.end());
      ExpectEverySampleOnce(all);
    }
  }
}

TEST_P(SessionTest, AnInterruptBeforeTheFirstStartEndsTheFirstWaitOfAnyEpoch) {
  auto s = Open(Opts());
  ASSERT_NE(s, nullptr);
  s->Interrupt();  // epoch 0 runs ahead; the caller then starts epoch 2
  ASSERT_TRUE(s->StartEpoch(2).ok());
  auto w = s->NextFor(std::chrono::seconds(30));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->wait, WaitResult::kInterrupted);
  ExpectEverySampleOnce(Drain(*s));
}

TEST_P(SessionTest, InterruptEndsAWaitWithNothingLost) {
  auto s = Open(Opts());
  ASSERT_NE(s, nullptr);
  // Before any epoch: kept for the first wait of the next one.
  s->Interrupt();
  ASSERT_TRUE(s->StartEpoch(0).ok());
  auto w = s->NextFor(std::chrono::seconds(30));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->wait, WaitResult::kInterrupted);
  EXPECT_FALSE(w->batch);
  std::vector<uint64_t> got;
  for (int i = 0; i < 3; ++i) {
    auto b = s->NextFor(std::chrono::seconds(30));
    ASSERT_TRUE(b.ok() && b->wait == WaitResult::kReady && b->batch);
    const std::vector<uint64_t> k = SamplesOf(*b->batch);
    got.insert(got.end(), k.begin(), k.end());
  }
  // Mid-epoch: the next wait ends, once; the epoch goes on from where it was.
  s->Interrupt();
  w = s->NextFor(std::chrono::seconds(30));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->wait, WaitResult::kInterrupted);
  EXPECT_FALSE(w->batch);
  EXPECT_EQ(s->position().next_batch, 3u);
  const std::vector<uint64_t> rest = Drain(*s);
  got.insert(got.end(), rest.begin(), rest.end());
  ExpectEverySampleOnce(got);
}

TEST_P(SessionTest, BatchesOutliveTheSessionAndAStoppedEpoch) {
  auto s = Open(Opts());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->StartEpoch(0).ok());
  auto b = s->Next();
  ASSERT_TRUE(b.ok() && *b);
  const std::vector<uint64_t> held = SamplesOf(**b);
  // A new epoch mid-way, then the session gone: the held batch still reads
  // what it read, on any thread, and releases into a pool that is still there.
  ASSERT_TRUE(s->StartEpoch(3).ok());
  auto other = s->Next();
  ASSERT_TRUE(other.ok() && *other);
  EXPECT_EQ((*other)->epoch(), 3u);
  s.reset();
  std::thread t([&] {
    EXPECT_EQ(SamplesOf(**b), held);
    (*b)->SetReleaseStream(nullptr);
    (*b)->Release();
    EXPECT_EQ((*b)->host(), nullptr);
    EXPECT_EQ((*b)->device(), nullptr);
  });
  t.join();
}

TEST_P(SessionTest, StatisticsArePresent) {
  auto s = Open(Opts());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->StartEpoch(0).ok());
  (void)Drain(*s);
  const SessionStats st = s->stats();
  EXPECT_EQ(st.loader.samples, kSamples);
  EXPECT_EQ(st.loader.batches, 13u);
  EXPECT_GT(st.loader.chunk_reads, 0u);
  EXPECT_EQ(st.has_feed, feed());
  if (feed()) {
    EXPECT_EQ(st.feed.fresh_samples, kSamples);
    EXPECT_EQ(st.feed.on_gpu, GetParam() == Mode::kGpuFeed);
  }
  const std::string j = SessionStatsJson(st);
  EXPECT_NE(j.find("\"samples\": 100"), std::string::npos) << j;
  EXPECT_NE(j.find("\"batches\": 13"), std::string::npos) << j;
  EXPECT_EQ(j.find("\"feed_fresh_samples\": 100") != std::string::npos, feed()) << j;
  EXPECT_TRUE(st.started_early);  // epoch 0, started at open
  EXPECT_GT(st.first_batch_seconds, 0);
  EXPECT_NE(j.find("\"started_early\": 1"), std::string::npos) << j;
  EXPECT_NE(j.find("\"first_batch_seconds\": "), std::string::npos) << j;
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(j.back(), '}');
}

TEST_P(SessionTest, BadUseIsRefusedSayingWhatToDo) {
  auto s = Open(Opts());
  ASSERT_NE(s, nullptr);
  auto early = s->NextFor(std::chrono::milliseconds(10));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(early.status().message().find("no epoch started"), std::string::npos) << early.status().ToString();
  const Status garbage = s->LoadState("not a state");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.message().find(s->name()), std::string::npos) << garbage.ToString();
  // A state of another run (another seed) is refused, naming the option.
  SessionOptions other = Opts();
  other.source.loader.seed = 12;
  auto o = Open(other);
  ASSERT_NE(o, nullptr);
  auto refused = s->CheckState(o->state().Serialize());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("seed"), std::string::npos) << refused.status().ToString();
  if (!feed()) {
    // Holding every batch of the pool and asking for another: an error naming prefetch, not a hang.
    ASSERT_TRUE(s->StartEpoch(0).ok());
    std::vector<SessionBatch> held;
    for (uint64_t i = 0; i < s->pool_slots(); ++i) {
      auto b = s->Next();
      ASSERT_TRUE(b.ok() && *b) << b.status().ToString();
      held.push_back(std::move(**b));
    }
    auto more = s->NextFor(std::chrono::seconds(30));
    ASSERT_FALSE(more.ok());
    EXPECT_NE(more.status().message().find("prefetch"), std::string::npos) << more.status().ToString();
    held.pop_back();
    auto again = s->NextFor(std::chrono::seconds(30));
    ASSERT_TRUE(again.ok() && again->batch) << "releasing one batch lets the epoch go on";
  }
}

// "Gpu" matches the GPU tier's filter (cmake/Testing.cmake: */Gpu).
INSTANTIATE_TEST_SUITE_P(HostAndFeed, SessionTest, ::testing::Values(Mode::kHost, Mode::kCpuFeed, Mode::kGpuFeed),
                         [](const ::testing::TestParamInfo<Mode>& p) {
                           return p.param == Mode::kHost ? "Host" : p.param == Mode::kCpuFeed ? "Cpu" : "Gpu";
                         });

TEST(SessionOpenTest, MissingFileAndImpossibleDecodeAreRefused) {
  SessionOptions o;
  o.source.data = testing::MakeTempDir("session_missing") + "/none.h5";
  o.source.share = Share::kNone;
  auto missing = Session::Open(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.h5"), std::string::npos) << missing.status().ToString();
  // decode on the GPU with the feed on the CPU: Unsupported, saying what it needs.
  o.source.data = WriteFile("session_decode");
  o.feed = true;
  o.feed_options.force_cpu = true;
  o.decode = DecodeDevice::kGpu;
  auto gpu = Session::Open(o);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(gpu.status().message().find("decode=\"auto\""), std::string::npos) << gpu.status().ToString();
}

TEST(SessionOpenTest, TheEnvironmentOverridesTheEpochSwitches) {
  const char* names[] = {"GPUFEED_FEED_RESTART", "GPUFEED_NEXT_EPOCH_EARLY", "GPUFEED_FIRST_EPOCH_EARLY"};
  for (const char* n : names) ASSERT_EQ(std::getenv(n), nullptr) << n << " is set in this test's environment";
  SessionOptions o;
  EXPECT_TRUE(WithEnvironment(o).restart_feeder);
  EXPECT_TRUE(WithEnvironment(o).next_epoch_early);
  EXPECT_TRUE(WithEnvironment(o).first_epoch_early);
  ::setenv("GPUFEED_FIRST_EPOCH_EARLY", "0", 1);
  EXPECT_FALSE(WithEnvironment(o).first_epoch_early);
  ::unsetenv("GPUFEED_FIRST_EPOCH_EARLY");
  ::setenv("GPUFEED_FEED_RESTART", "0", 1);
  ::setenv("GPUFEED_NEXT_EPOCH_EARLY", "0", 1);
  const SessionOptions off = WithEnvironment(o);
  ::setenv("GPUFEED_NEXT_EPOCH_EARLY", "1", 1);
  o.next_epoch_early = false;
  const SessionOptions on = WithEnvironment(o);
  ::unsetenv("GPUFEED_FEED_RESTART");
  ::unsetenv("GPUFEED_NEXT_EPOCH_EARLY");
  EXPECT_FALSE(off.restart_feeder);
  EXPECT_FALSE(off.next_epoch_early);
  EXPECT_TRUE(on.next_epoch_early);
  EXPECT_FALSE(on.restart_feeder);
}

}  // namespace
}  // namespace gpufeed
