// Checks shared by the local tier's tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "tests/test_util.h"

namespace ckptfs::test {

// Bytes of `path` backed by disk blocks (st_blocks).
inline uint64_t Allocated(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

// Chunk `c` reads back whole and verified.
inline void ExpectReadsBack(ChunkCache& cache, const TestChunk& c) {
  auto r = cache.Get(c.id, c.bytes.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->size, c.bytes.size());
  EXPECT_TRUE(std::equal(c.bytes.begin(), c.bytes.end(), (*r)->bytes.get()));
}

// The chunks ForEach lists.
inline std::vector<ChunkId> Listed(const ChunkCache& cache) {
  std::vector<ChunkId> ids;
  EXPECT_TRUE(cache.ForEach([&](const ChunkId& id, uint64_t) { ids.push_back(id); }).ok());
  return ids;
}

}  // namespace ckptfs::test
