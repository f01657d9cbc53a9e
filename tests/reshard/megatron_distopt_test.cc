// The distributed optimizer's buffer layout (LayoutDistOpt) on cases worked out by hand from
// Megatron's _compute_per_buffer_param_layout, and the bucket size taken from a run's args.
#include "reshard/megatron_distopt.h"

#include <gtest/gtest.h>

#include <vector>

#include "reshard/megatron_args.h"

namespace ckptfs::reshard {
namespace {

std::vector<int64_t> Offsets(const std::vector<DistOptParam>& p, std::optional<int64_t> size,
                             int64_t* total = nullptr, size_t* buckets = nullptr) {
  DistOptLayout l = LayoutDistOpt(p, size);
  if (total) *total = l.numel_unpadded;
  if (buckets) *buckets = l.buckets;
  return l.offset;
}

TEST(LayoutDistOpt, OneBucketInReverseOrderEachStartOnTheGridOf64) {
  int64_t total = 0;
  size_t buckets = 0;
  // Registration order a(10) b(70) c(64): laid out c, b, a; b starts at 64, a at 64 + 70 -> 192.
  EXPECT_EQ(Offsets({{10}, {70}, {64}}, std::nullopt, &total, &buckets),
            (std::vector<int64_t>{192, 64, 0}));
  EXPECT_EQ(total, 202);  // the end of the last parameter: no padding after it
  EXPECT_EQ(buckets, 1u);
}

TEST(LayoutDistOpt, ABucketClosesAtItsLastParametersEndWithoutPadding) {
  int64_t total = 0;
  size_t buckets = 0;
  // d(5000) closes bucket 0 at 5000 (>= 2000); c(64) and b(3) open bucket 1 at 0 and 64; a(100)
  // is shared_embedding: bucket 1 closes at b's padded end 128, a is bucket 2.
  EXPECT_EQ(Offsets({{100, true}, {3}, {64}, {5000}}, 2000, &total, &buckets),
            (std::vector<int64_t>{5128, 5064, 5000, 0}));
  EXPECT_EQ(total, 5228);
  EXPECT_EQ(buckets, 3u);
  // Without the bucket size the same parameters keep b's padding before a's own bucket.
  EXPECT_EQ(Offsets({{100, true}, {3}, {64}, {5000}}, std::nullopt, &total, &buckets),
            (std::vector<int64_t>{5184, 5120, 5056, 0}));
  EXPECT_EQ(total, 5284);
  EXPECT_EQ(buckets, 2u);
}

TEST(LayoutDistOpt, ASharedEmbeddingFirstInTheBufferIsABucketOfItsOwn) {
  size_t buckets = 0;
  // The last stage's output layer (registered last, laid out first) and a norm after it.
  EXPECT_EQ(Offsets({{40}, {1000, true}}, std::nullopt, nullptr, &buckets),
            (std::vector<int64_t>{1000, 0}));
  EXPECT_EQ(buckets, 2u);
}

pickle::ValuePtr Args(std::vector<std::pair<std::string, pickle::ValuePtr>> kv) {
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> pairs;
  for (auto& [k, v] : kv) pairs.emplace_back(pickle::MakeStr(k), v);
  return pickle::MakeDict(std::move(pairs));
}

TEST(DistOptBucketSize, FollowsTheArgsAndRefusesWithoutThem) {
  using pickle::MakeBool;
  using pickle::MakeInt;
  auto size = [](const pickle::ValuePtr& a, uint32_t pp, int64_t n) {
    auto r = DistOptBucketSize({{n - 1}, {1}}, a, pp);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->value_or(-1) : -2;
  };
  EXPECT_EQ(size(Args({{"overlap_grad_reduce", MakeBool(false)}}), 0, 100), -1);
  auto on = Args({{"overlap_grad_reduce", MakeBool(true)}, {"data_parallel_size", MakeInt(64)},
                  {"context_parallel_size", MakeInt(2)}});
  EXPECT_EQ(size(on, 0, 100), 128000000);  // max(4e7, 1e6 * DP * CP)
  EXPECT_EQ(size(on, 1, 100), -1);         // later pipeline stages: one bucket
  EXPECT_EQ(size(Args({{"overlap_grad_reduce", MakeBool(true)}, {"ddp_bucket_size", MakeInt(5)}}),
                 0, 100), 5);
  EXPECT_EQ(size(Args({{"overlap_grad_reduce", MakeBool(true)}, {"ddp_num_buckets", MakeInt(3)}}),
                 0, 100), 33);
  const std::vector<DistOptParam> odd = {{100}};
  EXPECT_FALSE(DistOptBucketSize(odd, Args({}), 0).ok());
  EXPECT_FALSE(DistOptBucketSize(odd, Args({{"overlap_grad_reduce", MakeBool(true)}}), 0).ok());
  // Parameters of multiples of 64 elements lay out alike in any buckets: no args needed.
  auto aligned = DistOptBucketSize({{64}, {4096}}, Args({}), 0);
  ASSERT_TRUE(aligned.ok()) << aligned.status().ToString();
  EXPECT_FALSE(aligned->has_value());
}

}  // namespace
}  // namespace ckptfs::reshard
