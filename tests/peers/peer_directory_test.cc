// Nodes finding each other through records in a bucket (in memory here).
#include "peers/peer_directory.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backends/mem_backend.h"

namespace ckptfs {
namespace {

std::vector<std::string> Keys(Backend* b) {
  std::vector<std::string> out;
  EXPECT_TRUE(b->List("nodes/", "", [&](const ObjectInfo& o) {
    out.push_back(o.key);
    return true;
  }).ok());
  return out;
}

TEST(PeerDirectoryTest, NodesSeeEachOtherWhileTheirRecordsAreFresh) {
  MemBackend bucket;
  std::map<std::string, std::vector<std::string>> seen;
  auto dir = [&](const std::string& self) {
    return std::make_unique<PeerDirectory>(&bucket, self, 10, [&seen, self](const auto& live) {
      seen[self] = live;
    });
  };
  auto a = dir("10.0.0.1:7070"), b = dir("10.0.0.2:7070"), c = dir("10.0.0.3:7070");
  const std::time_t t0 = 1'700'000'000;
  a->Refresh(t0);
  b->Refresh(t0);
  c->Refresh(t0);
  a->Refresh(t0 + 1);
  EXPECT_EQ(seen["10.0.0.1:7070"], (std::vector<std::string>{"10.0.0.2:7070", "10.0.0.3:7070"}));
  EXPECT_EQ(seen["10.0.0.3:7070"], (std::vector<std::string>{"10.0.0.1:7070", "10.0.0.2:7070"}));
  // One record per node: a refresh replaces it.
  EXPECT_EQ(Keys(&bucket).size(), 3u);
  // c stops refreshing: three heartbeats on, it is gone from a's set; b stays.
  b->Refresh(t0 + 25);
  a->Refresh(t0 + 31);
  EXPECT_EQ(seen["10.0.0.1:7070"], (std::vector<std::string>{"10.0.0.2:7070"}));
  // Ten minutes on, the dead record is deleted by whoever lists it.
  a->Refresh(t0 + 700);
  for (const std::string& k : Keys(&bucket)) EXPECT_EQ(k.find("10.0.0.3"), std::string::npos) << k;
  // A stopped node deletes its own record.
  a->Stop();
  for (const std::string& k : Keys(&bucket)) EXPECT_EQ(k.find("10.0.0.1"), std::string::npos) << k;
}

TEST(PeerDirectoryTest, ForeignKeysUnderTheirPrefixAreIgnored) {
  MemBackend bucket;
  ASSERT_TRUE(bucket.Put("nodes/junk", "", 0).ok());
  ASSERT_TRUE(bucket.Put("nodes/10.0.0.9:1/notatime", "", 0).ok());
  std::vector<std::string> live = {"unset"};
  PeerDirectory d(&bucket, "", 10, [&](const auto& l) { live = l; });
  d.Refresh(1'700'000'000);  // lists only: no record of its own
  EXPECT_EQ(live, std::vector<std::string>{"unset"});  // nothing changed: still empty
  EXPECT_EQ(Keys(&bucket).size(), 2u);
}

}  // namespace
}  // namespace ckptfs
