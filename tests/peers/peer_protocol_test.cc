// The chunk protocol's pure parts: request proofs, answer headers, rendezvous ownership.
#include "peers/peer_protocol.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "peers/peer_backend.h"

namespace ckptfs {
namespace {

ChunkId Nth(int i) {
  std::string s = "chunk " + std::to_string(i);
  return ChunkId::Of(s.data(), s.size());
}

const std::string kKey = DerivePeerKey("secret", "bucket", "prefix/");

TEST(PeerRequestTest, AGoodRequestDecodesToWhatWasSent) {
  PeerRequest r = MakePeerRequest(Nth(1), 12345, 1'700'000'000);
  std::string wire = EncodePeerRequest(r, kKey);
  ASSERT_EQ(wire.size(), PeerRequest::kWireSize);
  auto got = DecodePeerRequest(wire, kKey, 1'700'000'010);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->id, r.id);
  EXPECT_EQ(got->len, 12345u);
  EXPECT_EQ(got->time, r.time);
  EXPECT_EQ(got->nonce, r.nonce);
  // Two requests for one chunk differ (the nonce): a replay is told apart by the server.
  EXPECT_NE(MakePeerRequest(Nth(1), 12345, 1'700'000'000).nonce, r.nonce);
}

TEST(PeerRequestTest, AnotherKeyATamperedFieldOrAStaleTimeIsRefused) {
  const std::time_t now = 1'700'000'000;
  std::string wire = EncodePeerRequest(MakePeerRequest(Nth(2), 4096, now), kKey);
  // Another bucket's key, or another secret's.
  EXPECT_EQ(DecodePeerRequest(wire, DerivePeerKey("secret", "other", "prefix/"), now)
                .status().code(), Code::kPermission);
  EXPECT_EQ(DecodePeerRequest(wire, DerivePeerKey("guess", "bucket", "prefix/"), now)
                .status().code(), Code::kPermission);
  // Every byte is covered by the proof: the id, the length, the time, the nonce, the proof.
  for (size_t i = 0; i < wire.size(); ++i) {
    std::string bad = wire;
    bad[i] = static_cast<char>(bad[i] ^ 1);
    EXPECT_EQ(DecodePeerRequest(bad, kKey, now).status().code(), Code::kPermission) << i;
  }
  // A request made too long ago or ahead.
  EXPECT_EQ(DecodePeerRequest(wire, kKey, now + kMaxSkewS + 1).status().code(), Code::kPermission);
  EXPECT_EQ(DecodePeerRequest(wire, kKey, now - kMaxSkewS - 1).status().code(), Code::kPermission);
  EXPECT_TRUE(DecodePeerRequest(wire, kKey, now + kMaxSkewS).ok());
  // Short, long, empty.
  EXPECT_FALSE(DecodePeerRequest(wire.substr(1), kKey, now).ok());
  EXPECT_FALSE(DecodePeerRequest(wire + "x", kKey, now).ok());
  EXPECT_FALSE(DecodePeerRequest("", kKey, now).ok());
}

TEST(PeerRequestTest, ThePeerKeyIsNotTheSecret) {
  const std::string key = DerivePeerKey("secret", "bucket", "");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_EQ(key.find("secret"), std::string::npos);
  EXPECT_NE(key, DerivePeerKey("secret", "bucket", "p/"));
  EXPECT_EQ(key, DerivePeerKey("secret", "bucket", ""));
}

TEST(PeerAnswerTest, HeadersRoundTripAndOthersAreCorrupt) {
  PeerAnswer a;
  uint64_t len = 0;
  ASSERT_TRUE(DecodePeerAnswerHeader(EncodePeerAnswerHeader(PeerAnswer::kOk, 77), &a, &len).ok());
  EXPECT_EQ(a, PeerAnswer::kOk);
  EXPECT_EQ(len, 77u);
  ASSERT_TRUE(
      DecodePeerAnswerHeader(EncodePeerAnswerHeader(PeerAnswer::kNotHere, 0), &a, &len).ok());
  EXPECT_EQ(a, PeerAnswer::kNotHere);
  std::string bad = EncodePeerAnswerHeader(PeerAnswer::kOk, 1);
  bad[4] = 9;
  EXPECT_EQ(DecodePeerAnswerHeader(bad, &a, &len).code(), Code::kCorrupt);
  EXPECT_EQ(DecodePeerAnswerHeader("HTTP/1.1 200 OK\r\n", &a, &len).code(), Code::kCorrupt);
}

std::vector<std::string> Nodes(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("10.0.0." + std::to_string(i + 1) + ":7070");
  return out;
}

TEST(RendezvousTest, TheOwnerIsStableAndIndependentOfOrder) {
  auto nodes = Nodes(8);
  auto reversed = std::vector<std::string>(nodes.rbegin(), nodes.rend());
  for (int i = 0; i < 1000; ++i) {
    const int a = RendezvousOwner(Nth(i), nodes);
    ASSERT_GE(a, 0);
    EXPECT_EQ(RendezvousOwner(Nth(i), nodes), a);
    EXPECT_EQ(reversed[static_cast<size_t>(RendezvousOwner(Nth(i), reversed))],
              nodes[static_cast<size_t>(a)]);
  }
  EXPECT_EQ(RendezvousOwner(Nth(0), {}), -1);
  EXPECT_EQ(RendezvousOwner(Nth(0), {"a:1"}), 0);
}

TEST(RendezvousTest, TheOwnersAreFixedForEveryBuild) {
  // Every node computes owners on its own: the choice must not change between builds or
  // machines (a change would leave nodes of two versions disagreeing). These owners are the
  // seeds' and mix's as peers/peer_protocol.cc has them.
  const RendezvousSet set(Nodes(8));
  const std::vector<int> want = {5, 5, 7, 7, 4, 6, 0, 3, 6, 0, 3, 4};
  for (int i = 0; i < static_cast<int>(want.size()); ++i) {
    EXPECT_EQ(set.Owner(Nth(i)), want[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(RendezvousOwner(Nth(i), Nodes(8)), want[static_cast<size_t>(i)]) << i;
  }
  EXPECT_EQ(RendezvousSet().Owner(Nth(0)), -1);
  EXPECT_EQ(set.size(), 8u);
}

TEST(RendezvousTest, ChunksSpreadEvenlyOverTheNodes) {
  constexpr int kChunks = 16000;
  auto nodes = Nodes(8);
  std::vector<int> owned(nodes.size());
  for (int i = 0; i < kChunks; ++i) ++owned[static_cast<size_t>(RendezvousOwner(Nth(i), nodes))];
  for (size_t n = 0; n < nodes.size(); ++n) {
    // 2000 expected each; a binomial's standard deviation here is about 42.
    EXPECT_GT(owned[n], 1800) << nodes[n];
    EXPECT_LT(owned[n], 2200) << nodes[n];
  }
}

TEST(RendezvousTest, ANodeLeavingMovesOnlyTheChunksItOwned) {
  constexpr int kChunks = 8000;
  auto nodes = Nodes(8);
  auto fewer = nodes;
  const std::string gone = fewer[3];
  fewer.erase(fewer.begin() + 3);
  int moved = 0;
  for (int i = 0; i < kChunks; ++i) {
    const std::string before = nodes[static_cast<size_t>(RendezvousOwner(Nth(i), nodes))];
    const std::string after = fewer[static_cast<size_t>(RendezvousOwner(Nth(i), fewer))];
    if (before != gone) {
      EXPECT_EQ(after, before) << i;
    } else {
      ++moved;
    }
  }
  EXPECT_GT(moved, kChunks / 8 - 300);
  EXPECT_LT(moved, kChunks / 8 + 300);
}

TEST(PeerKeysTest, OnlyChunkObjectsNameAChunk) {
  const ChunkId id = Nth(5);
  const std::string hex = id.Hex();
  EXPECT_EQ(ChunkOfKey("chunks/" + hex.substr(0, 2) + "/" + hex), id);
  const std::string other = hex.substr(0, 2) == "00" ? "01" : "00";
  EXPECT_FALSE(ChunkOfKey("chunks/" + other + "/" + hex).has_value());  // a wrong fan-out
  EXPECT_FALSE(ChunkOfKey("files/" + hex).has_value());
  EXPECT_FALSE(ChunkOfKey("chunks/" + hex.substr(0, 2) + "/" + hex + "x").has_value());
  EXPECT_FALSE(ChunkOfKey("chunks/" + hex.substr(0, 2) + "/" + hex.substr(1)).has_value());
}

}  // namespace
}  // namespace ckptfs
