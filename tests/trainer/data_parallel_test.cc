// Data parallel on the CPU backend, ranks as threads meeting through the
// shared-memory collectives (the CPU form of the NCCL path: the same Train()
// code): 2 ranks of batch B train the same weights as 1 rank of batch 2B fed
// the same samples per step; a checkpoint taken at 2 ranks resumes at 1 and
// the other way, and at another width by the global batch; a rank that never comes ends the others' wait with an error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "gpufeed/trainer.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

// Sample p holds original sample perm[p] of a learnable set (class k % 4, a
// bright bar at the class's row over noise that encodes k).
class BarsSource : public ChunkSource {
 public:
  BarsSource(uint64_t n, std::vector<uint64_t> perm = {}) : n_(n), shape_{1, 8, 8} {
    if (perm.empty())
      for (uint64_t i = 0; i < n; ++i) perm.push_back(i);
    data_.resize(n * 64);
    for (uint64_t p = 0; p < n; ++p) {
      const uint64_t k = perm[p];
      labels_.push_back(int64_t(k % 4));
      const int bar = int(k % 4) * 2;
      for (int i = 0; i < 64; ++i)
        data_[p * 64 + i] = uint8_t((i / 8 == bar ? 160 : 40) + testing::IndexByte(k, i) % 64);
    }
  }
  uint64_t num_samples() const override { return n_; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  uint64_t sample_bytes() const override { return 64; }
  DType dtype() const override { return DType::kUInt8; }
  uint64_t chunk_samples() const override { return 32; }
  uint64_t num_chunks() const override { return (n_ + 31) / 32; }
  uint64_t samples_in_chunk(uint64_t i) const override { return std::min<uint64_t>(32, n_ - i * 32); }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return samples_in_chunk(i) * 64; }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    std::memcpy(dst.data(), data_.data() + i * 32 * 64, samples_in_chunk(i) * 64);
    return Status::Ok();
  }
  const std::vector<int64_t>& labels() const override { return labels_; }
  std::string name() const override { return "bars"; }

 private:
  uint64_t n_;
  std::vector<uint64_t> shape_;
  std::vector<uint8_t> data_;
  std::vector<int64_t> labels_;
};

TrainOptions Options(int batch) {
  TrainOptions o;
  o.device = TrainDevice::kCpu;
  o.model = ModelKind::kMlp;
  o.widths = {32};
  o.epochs = 3;
  o.batch_size = uint64_t(batch);
  o.lr = 3e-3f;
  o.loader.threads = 1;
  o.loader.order = Order::kSequential;
  o.telemetry = false;
  return o;
}

// Runs `world` ranks of Train() on threads; returns their reports.
std::vector<Result<TrainReport>> RunRanks(const ChunkSource& train, const ChunkSource* test, TrainOptions o, int world,
                                          const std::string& prefix, int ranks_started = -1) {
  if (ranks_started < 0) ranks_started = world;
  std::vector<Result<TrainReport>> out(size_t(ranks_started), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks_started; ++r) {
    threads.emplace_back([&, r] {
      TrainOptions mine = o;
      mine.parallel.rank = r;
      mine.parallel.world_size = world;
      mine.parallel.local_world_size = world;
      mine.parallel.rendezvous = prefix;
      out[size_t(r)] = Train(train, test, mine);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(DataParallelTest, TwoRanksTrainTheWeightsOfOneRankWithTwiceTheBatch) {
  constexpr uint64_t kN = 1024, kB = 16;
  // Sequential order, every batch full: rank r's step k is samples
  // r*512 + [16k, 16k+16). One rank with batch 32 sees both halves per step
  // when its samples are laid out as [rank 0's 16, rank 1's 16] per step.
  std::vector<uint64_t> perm;
  for (uint64_t p = 0; p < kN; ++p) {
    const uint64_t step = p / (2 * kB), j = p % (2 * kB);
    perm.push_back(j < kB ? step * kB + j : kN / 2 + step * kB + (j - kB));
  }
  BarsSource data(kN), interleaved(kN, perm), test(256);
  const std::string dir = testing::MakeTempDir("dp");
  // With a frozen first layer too: only the trainable gradients travel.
  {
    TrainOptions o = Options(int(kB));
    o.freeze = {"linear0.weight"};
    auto frozen = RunRanks(data, &test, o, 2, dir + "/frozen");
    for (auto& r : frozen) ASSERT_TRUE(r.ok()) << r.status().ToString();
    o.batch_size = 2 * kB;
    auto one = Train(interleaved, &test, o);
    ASSERT_TRUE(one.ok()) << one.status().ToString();
    EXPECT_EQ(frozen[1]->weights_hash, frozen[0]->weights_hash);
    EXPECT_LT(frozen[0]->trainable_parameters, frozen[0]->parameters);
    for (size_t e = 0; e < one->epochs.size(); ++e)
      EXPECT_NEAR(frozen[0]->epochs[e].train_loss, one->epochs[e].train_loss, 1e-4 * one->epochs[e].train_loss);
  }
  auto ranks = RunRanks(data, &test, Options(int(kB)), 2, dir + "/job");
  for (auto& r : ranks) ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto one = Train(interleaved, &test, Options(int(2 * kB)));
  ASSERT_TRUE(one.ok()) << one.status().ToString();

  const TrainReport& r0 = *ranks[0];
  EXPECT_EQ(r0.parallel, "2 ranks, shared memory");
  ASSERT_EQ(r0.ranks.size(), 2u);
  EXPECT_EQ(ranks[1]->weights_hash, r0.weights_hash);  // every rank the same bits
  ASSERT_EQ(r0.epochs.size(), one->epochs.size());
  for (size_t e = 0; e < one->epochs.size(); ++e) {
    const EpochReport &a = r0.epochs[e], &b = one->epochs[e];
    EXPECT_EQ(a.samples, b.samples) << "epoch " << e;  // the node's samples: both ranks'
    EXPECT_EQ(a.steps, b.steps);
    // fp32: one GEMM over 32 rows against two over 16 summed across ranks.
    EXPECT_NEAR(a.train_loss, b.train_loss, 1e-4 * b.train_loss) << "epoch " << e;
    EXPECT_NEAR(a.test_loss, b.test_loss, 1e-4 * b.test_loss) << "epoch " << e;
    EXPECT_EQ(a.test_accuracy, b.test_accuracy) << "epoch " << e;
  }
  EXPECT_GT(r0.epochs.back().test_accuracy, 0.9);
  // The same ranks without the all-reduce would have trained on half the
  // data each: the equality above is the reduction's doing. One rank with
  // batch 16 (half the gradient's samples) differs measurably.
  auto half = Train(data, &test, Options(int(kB)));
  ASSERT_TRUE(half.ok());
  EXPECT_GT(std::abs(half->epochs[0].test_loss - one->epochs[0].test_loss), 1e-3);
  std::filesystem::remove_all(dir);
}

TEST(DataParallelTest, ACheckpointAtTwoRanksResumesAtOneAndBack) {
  BarsSource data(1024), test(256);
  const std::string dir = testing::MakeTempDir("dp-resume");
  TrainOptions o = Options(16);
  o.model = ModelKind::kCnn;  // batchnorm statistics: rank 0's are saved
  o.channels = {8};
  o.epochs = 4;
  o.checkpoint_path = dir + "/ckpt";
  o.stop_after_epochs = 1;
  auto first = RunRanks(data, &test, o, 2, dir + "/a");
  for (auto& r : first) ASSERT_TRUE(r.ok()) << r.status().ToString();
  o.resume = true;
  auto second = Train(data, &test, o);  // one rank: epoch 2
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->start_epoch, 1);
  ASSERT_EQ(second->epochs.size(), 1u);
  EXPECT_EQ(second->epochs[0].samples, 1024u);
  o.stop_after_epochs = 0;
  auto third = RunRanks(data, &test, o, 2, dir + "/b");  // two ranks again: epochs 3 and 4
  for (auto& r : third) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(third[0]->start_epoch, 2);
  ASSERT_EQ(third[0]->epochs.size(), 2u);
  EXPECT_EQ(third[0]->epochs[1].samples, 1024u);
  EXPECT_GT(third[0]->epochs.back().test_accuracy, 0.9);
  std::filesystem::remove_all(dir);
}

// Resume at another width by the global batch (batch x accum x ranks): a
// checkpoint taken at 2 ranks of 16 resumes at 1 rank of 32, or of 16 with
// --accum 2. Where each step's samples are the same (one rank: batch 32 and
// 16 x accum 2 cut the epoch's order alike) the resumed run trains what the
// uninterrupted one does, to within rounding: the CPU backend sums a
// micro-batch's gradient in double and rounds it, so two micro-batches of 16
// round once more than one of 32 (the losses agree to 1e-4, not bit for
// bit). From 2 ranks the resumed epochs consume the same samples (every one
// once an epoch) in the same number of steps on the same learning-rate
// schedule, but a step's samples are not those of the 2-rank run: the loader
// gives each rank a contiguous share of the epoch's order. A global batch
// that differs is refused, naming a split that fits.
TEST(DataParallelTest, ACheckpointResumesAtAnotherWidthWithTheSameGlobalBatch) {
  BarsSource data(1024), test(256);
  const std::string dir = testing::MakeTempDir("dp-width");
  TrainOptions o = Options(32);
  o.epochs = 3;
  auto whole = Train(data, &test, o);  // one rank of 32, uninterrupted
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();

  o.checkpoint_path = dir + "/one";
  o.stop_after_epochs = 1;
  ASSERT_TRUE(Train(data, &test, o).ok());
  TrainOptions split = o;
  split.batch_size = 16, split.accum = 2, split.resume = true, split.stop_after_epochs = 0;
  auto resumed = Train(data, &test, split);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->start_epoch, 1);
  ASSERT_EQ(resumed->epochs.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    const EpochReport &a = resumed->epochs[e], &b = whole->epochs[e + 1];
    EXPECT_EQ(a.samples, b.samples);
    EXPECT_EQ(a.steps, b.steps);
    EXPECT_NEAR(a.train_loss, b.train_loss, 1e-4 * b.train_loss) << "epoch " << e + 1;
    EXPECT_NEAR(a.test_loss, b.test_loss, 1e-4 * b.test_loss) << "epoch " << e + 1;
  }

  // Two ranks of 16 -> one rank of 32 or of 16 x 2.
  TrainOptions two = Options(16);
  two.epochs = 3;
  two.checkpoint_path = dir + "/two";
  two.stop_after_epochs = 1;
  auto first = RunRanks(data, &test, two, 2, dir + "/a");
  for (auto& r : first) ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& [batch, accum] : {std::pair{32, 1}, std::pair{16, 2}}) {
    TrainOptions one = two;
    one.checkpoint_path = dir + "/two-" + std::to_string(batch);  // each resumes the 2-rank checkpoint
    std::filesystem::copy_file(two.checkpoint_path, one.checkpoint_path);
    one.batch_size = uint64_t(batch), one.accum = accum, one.resume = true, one.stop_after_epochs = 0;
    auto r = Train(data, &test, one);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->start_epoch, 1);
    ASSERT_EQ(r->epochs.size(), 2u);
    for (const EpochReport& e : r->epochs) {
      EXPECT_EQ(e.samples, 1024u);  // the drop_last shares hold every sample: each once
      EXPECT_EQ(e.steps, first[0]->epochs[0].steps);
    }
    EXPECT_GT(r->epochs.back().test_accuracy, 0.9);
  }
  // Another global batch: refused, naming both and a split that fits.
  TrainOptions other = two;
  other.batch_size = 24, other.resume = true, other.stop_after_epochs = 0;
  auto refused = Train(data, &test, other);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "a global batch of 32 (--batch-size 16 x --accum 1 x 2 ranks), this run's is 24 (--batch-size 24 x "
                "--accum 1 x 1 rank): resume with the same global batch (here: --batch-size 32 --accum 1)"),
            std::string::npos)
      << refused.status().ToString();
  other.batch_size = 8, other.accum = 3;
  refused = Train(data, &test, other);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("(here: --batch-size 32 --accum 1)"), std::string::npos)
      << refused.status().ToString();
  std::filesystem::remove_all(dir);
}

// Pipeline stages x data parallel: 2 replicas of a 2-stage pipeline (each
// rank a pipeline, its stages threads; each stage's gradients summed with
// the other replica's same stage through a communicator of its own) train
// the weights, bit for bit, of --accum M on 2 ranks with the same global
// batch: a pipelined step reproduces accumulation's sums, and the
// shared-memory all-reduce sums every tensor in rank order however it is
// bucketed. Both schedules; a cnn too (batchnorm statistics broadcast from
// replica 0 stage by stage).
TEST(DataParallelTest, PipelineStagesTimesTwoReplicasTrainTheWeightsOfAccumulationOnTwoRanks) {
  BarsSource data(1024), test(256);
  const std::string dir = testing::MakeTempDir("dp-pipe");
  TrainOptions mlp = Options(16);
  mlp.widths = {32, 16};
  mlp.epochs = 2;
  TrainOptions cnn = mlp;
  cnn.model = ModelKind::kCnn;
  cnn.channels = {4, 8};
  int job = 0;
  for (const TrainOptions& base : {mlp, cnn}) {
    for (bool one_f_one_b : {true, false}) {
      TrainOptions accum = base;
      accum.accum = 3;
      accum.parallel.bucket_bytes = 256;  // several buckets a step
      auto want = RunRanks(data, &test, accum, 2, dir + "/" + std::to_string(job++));
      for (auto& r : want) ASSERT_TRUE(r.ok()) << r.status().ToString();
      TrainOptions piped = accum;
      piped.accum = 1;
      piped.pipeline.stages = 2;
      piped.pipeline.micro_batches = 3;
      piped.pipeline.one_f_one_b = one_f_one_b;
      piped.pipeline.by_memory = true;
      auto got = RunRanks(data, &test, piped, 2, dir + "/" + std::to_string(job++));
      for (auto& r : got) ASSERT_TRUE(r.ok()) << r.status().ToString();
      const std::string what = want[0]->model + (one_f_one_b ? " 1f1b" : " gpipe");
      EXPECT_EQ(got[0]->weights_hash, want[0]->weights_hash) << what;
      EXPECT_EQ(got[1]->weights_hash, got[0]->weights_hash) << what;
      EXPECT_EQ(got[0]->stages.size(), 2u);
      EXPECT_NE(got[0]->pipeline.find("2 replicas"), std::string::npos) << got[0]->pipeline;
      ASSERT_EQ(got[0]->epochs.size(), want[0]->epochs.size());
      for (size_t e = 0; e < want[0]->epochs.size(); ++e) {
        EXPECT_EQ(got[0]->epochs[e].samples, want[0]->epochs[e].samples);
        EXPECT_EQ(got[0]->epochs[e].steps, want[0]->epochs[e].steps);
        EXPECT_EQ(got[0]->epochs[e].test_loss, want[0]->epochs[e].test_loss) << what;
      }
    }
  }
  // Without the replicas' sums the stages would train on their own shard:
  // one replica alone with the same batch trains other weights.
  TrainOptions alone = mlp;
  alone.pipeline.stages = 2, alone.pipeline.micro_batches = 3, alone.pipeline.by_memory = true;
  auto single = Train(data, &test, alone);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  TrainOptions accum = mlp;
  accum.accum = 3;
  auto two = RunRanks(data, &test, accum, 2, dir + "/alone");
  ASSERT_TRUE(two[0].ok());
  EXPECT_NE(single->weights_hash, two[0]->weights_hash);
  std::filesystem::remove_all(dir);
}

// Stages x replicas write one checkpoint (rank 0's, every stage in the whole
// model's order): resumed by 2 replicas it continues bit for bit; resumed
// by 1 replica of the same stages with the same global batch it trains on.
TEST(DataParallelTest, PipelineReplicasWriteOneCheckpointThatResumesAtAnotherWidth) {
  BarsSource data(1024), test(256);
  const std::string dir = testing::MakeTempDir("dp-pipe-ckpt");
  TrainOptions o = Options(16);
  o.model = ModelKind::kCnn;
  o.channels = {4, 8};
  o.epochs = 3;
  o.pipeline.stages = 2, o.pipeline.micro_batches = 2, o.pipeline.by_memory = true;
  auto whole = RunRanks(data, &test, o, 2, dir + "/whole");
  for (auto& r : whole) ASSERT_TRUE(r.ok()) << r.status().ToString();
  o.checkpoint_path = dir + "/ckpt";
  o.stop_after_epochs = 1;
  auto first = RunRanks(data, &test, o, 2, dir + "/first");
  for (auto& r : first) ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::filesystem::copy_file(o.checkpoint_path, dir + "/ckpt-one");
  o.resume = true, o.stop_after_epochs = 0;
  auto again = RunRanks(data, &test, o, 2, dir + "/again");
  for (auto& r : again) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(again[0]->start_epoch, 1);
  EXPECT_EQ(again[0]->weights_hash, whole[0]->weights_hash);
  TrainOptions one = o;
  one.checkpoint_path = dir + "/ckpt-one";
  one.batch_size = 32;  // 1 x 32 x 2 micro-batches = 2 x 16 x 2
  auto r = Train(data, &test, one);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->start_epoch, 1);
  ASSERT_EQ(r->epochs.size(), 2u);
  EXPECT_EQ(r->epochs[0].samples, 1024u);
  EXPECT_EQ(r->epochs[0].steps, whole[0]->epochs[1].steps);
  std::filesystem::remove_all(dir);
}

TEST(DataParallelTest, ARankThatNeverComesEndsTheWaitWithAnError) {
  BarsSource data(256), test(64);
  const std::string dir = testing::MakeTempDir("dp-missing");
  TrainOptions o = Options(16);
  o.parallel.timeout_s = 1;
  auto ranks = RunRanks(data, &test, o, 2, dir + "/job", 1);  // rank 1 never starts
  ASSERT_FALSE(ranks[0].ok());
  EXPECT_NE(ranks[0].status().message().find("waited 1 s for the other ranks (1 of 2 attached)"), std::string::npos)
      << ranks[0].status().ToString();
  std::filesystem::remove_all(dir);
}

TEST(DataParallelTest, BadRanksAreRefused) {
  BarsSource data(256);
  TrainOptions o = Options(16);
  o.parallel.rank = 2, o.parallel.world_size = 2;
  auto r = Train(data, nullptr, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank 2 is not in [0, world size 2)"), std::string::npos);
}

}  // namespace
}  // namespace gpufeed
