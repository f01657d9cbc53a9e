// ViewPages: what the CRC pass reads reaches the page cache in whole pages only (the kernel marks
// a page valid only when one store covers it), every page of the file once, with the file's
// bytes, the pages around record boundaries after the headers hold their CRCs.
#include <gtest/gtest.h>
#include <zlib.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "reshard/view_file.h"
#include "reshard/view_pages.h"
#include "tests/reshard/reference.h"
#include "tests/test_util.h"

namespace ckptfs::reshard {
namespace {

using testref::ReadView;

std::string Source(size_t n, uint64_t seed) {
  auto b = test::RandomBytes(n, seed);
  return std::string(b.begin(), b.end());
}

SourceReadFn ReadOf(const std::vector<std::string>& src) {
  return [&src](uint32_t s, uint64_t off, uint64_t len,
                const std::function<void(const uint8_t*, size_t)>& sink) -> Status {
    const auto* p = reinterpret_cast<const uint8_t*>(src[s].data()) + off;
    for (uint64_t done = 0; done < len; done += 1000) {
      sink(p + done, std::min<uint64_t>(1000, len - done));
    }
    return Status::Ok();
  };
}

// Records of odd sizes (a page never lines up with a record), one of them a whole source whose
// CRC is known, one made of rows of two sources, one a mean.
ViewFile Build() {
  TorchZipWriter w("archive");
  w.AddBytes("data.pkl", std::string(5000, 'p'));
  w.AddGathers("data/0", {Gather{1, {Part{0, 3, 70001, 70001}}}});
  w.AddGathers("data/1", {Gather{1, {Part{1, 0, 9000, 9000}}}});  // source 1 whole: known
  w.AddGathers("data/2", {Gather{37, {Part{0, 11, 333, 700}, Part{2, 5, 100, 200}}}});
  Gather mean{1, {Part{2, 0, 4096, 4096}, Part{0, 4, 4096, 4096}}};
  mean.mean = true;
  w.AddGathers("data/3", {mean});
  w.AddBytes("version", "3\n");
  return w.Finish();
}

struct Stores {
  std::mutex mu;
  std::map<uint64_t, std::string> at;  // offset -> bytes
  ViewBytesFn Fn() {
    return [this](uint64_t off, const uint8_t* data, size_t len) {
      std::lock_guard lock(mu);
      EXPECT_TRUE(at.emplace(off, std::string(reinterpret_cast<const char*>(data), len)).second)
          << "stored twice at " << off;
    };
  }
};

class ViewPagesTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ViewPagesTest, EveryPageOnceWholeWithTheFilesBytes) {
  const size_t page = GetParam();
  const std::vector<std::string> src{Source(100000, 1), Source(9000, 2), Source(20000, 3)};
  ViewFile f = Build();
  KnownCrcFn known = [&](uint32_t s, uint64_t off, uint64_t len) -> std::optional<uint32_t> {
    if (s != 1 || off != 0 || len != src[1].size()) return std::nullopt;
    return static_cast<uint32_t>(
        crc32_z(0, reinterpret_cast<const Bytef*>(src[1].data()), src[1].size()));
  };
  Stores stores;
  ViewPages pages(f.recipe.size(), page, stores.Fn());
  ASSERT_TRUE(ComputeCrcs(&f, ReadOf(src), known, 4, pages.Sink()).ok());
  const uint64_t before = pages.pages_sent();
  pages.Finish(f.recipe);
  const std::string file = ReadView(f.recipe, src, 0, f.recipe.size());
  const uint64_t count = (file.size() + page - 1) / page;
  EXPECT_LT(before, count) << "the pages around record boundaries wait for Finish";
  EXPECT_EQ(pages.pages_sent(), count);
  uint64_t next = 0;
  for (const auto& [off, bytes] : stores.at) {
    SCOPED_TRACE(off);
    EXPECT_EQ(off % page, 0u) << "a store starts inside a page";
    EXPECT_TRUE(bytes.size() % page == 0 || off + bytes.size() == file.size())
        << "a store ends inside a page before the end of the file";
    EXPECT_EQ(off, next) << "pages missed or stored twice";
    EXPECT_TRUE(bytes == file.substr(off, bytes.size())) << "stored bytes differ from the file's";
    next = off + bytes.size();
  }
  EXPECT_EQ(next, file.size());
}

INSTANTIATE_TEST_SUITE_P(PageSizes, ViewPagesTest, ::testing::Values(4096, 512, 65536));

TEST(ViewPages, APageWithBytesNeverTakenIsNotStored) {
  // A 20000-byte file of literals [0, 8192) and a gather after, of which bytes [8192, 12388)
  // are taken: page 2 (of 4096) goes at once, pages 0 and 1 (literal) at Finish; page 3 has
  // 100 bytes taken and the rest never, page 4 none: both stay out.
  const std::vector<std::string> src{Source(20000, 4)};
  Recipe r;
  r.AddLiteral(std::string(8192, 'x'));
  r.AddGather(1, {Part{0, 0, 20000 - 8192, 0}});
  const std::string file = ReadView(r, src, 0, r.size());
  Stores stores;
  ViewPages pages(r.size(), 4096, stores.Fn());
  pages.Take(8192, reinterpret_cast<const uint8_t*>(file.data()) + 8192, 12388 - 8192);
  pages.Finish(r);
  ASSERT_EQ(stores.at.size(), 2u);
  EXPECT_EQ(stores.at.begin()->first, 0u);
  EXPECT_EQ(stores.at.begin()->second, file.substr(0, 8192)) << "the literal pages, at Finish";
  EXPECT_EQ(stores.at.rbegin()->first, 8192u);
  EXPECT_EQ(stores.at.rbegin()->second, file.substr(8192, 4096)) << "the page taken whole";
  EXPECT_EQ(pages.pages_sent(), 3u);
}

TEST(ViewPages, TheShortLastPageGoesWithTheEndOfTheFile) {
  const std::string file = Source(5000, 5);
  Recipe r;
  r.AddGather(1, {Part{0, 0, 5000, 0}});
  Stores stores;
  ViewPages pages(r.size(), 4096, stores.Fn());
  pages.Take(4000, reinterpret_cast<const uint8_t*>(file.data()) + 4000, 1000);  // to the end
  EXPECT_EQ(pages.pages_sent(), 1u) << "bytes 4096.. end the file: stored at once";
  pages.Take(0, reinterpret_cast<const uint8_t*>(file.data()), 4000);
  pages.Finish(r);
  EXPECT_EQ(pages.pages_sent(), 2u);
  ASSERT_EQ(stores.at.size(), 2u);
  EXPECT_EQ(stores.at[4096], file.substr(4096));
  EXPECT_EQ(stores.at[0], file.substr(0, 4096));
}

}  // namespace
}  // namespace ckptfs::reshard
