#include "tests/backends/backend_conformance.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "tests/test_util.h"

namespace ckptfs::test {

namespace {

constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 64;

std::string Bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v = RandomBytes(n, seed);
  return std::string(v.begin(), v.end());
}

}  // namespace

void BackendConformanceTest::SetUp() {
  BackendUnderTest b = GetParam().factory();
  ASSERT_NE(b.backend, nullptr) << "factory of " << GetParam().name << " made no backend";
  ASSERT_TRUE(b.prefix.empty() || b.prefix.back() == '/') << b.prefix;
  backend_ = std::move(b.backend);
  prefix_ = std::move(b.prefix);
  cleanup_ = std::move(b.cleanup);
}

void BackendConformanceTest::TearDown() {
  if (backend_ && !prefix_.empty()) {
    std::vector<std::string> left;
    Status s = backend_->List(prefix_, "", [&](const ObjectInfo& o) {
      left.push_back(o.key);
      return true;
    });
    for (const std::string& key : left) s = backend_->Delete(key);
    EXPECT_TRUE(s.ok()) << "cleaning " << prefix_ << ": " << s.ToString();
  }
  backend_.reset();
  if (cleanup_) cleanup_();
}

void BackendConformanceTest::MustPut(std::string_view key, std::string_view data) {
  Status s = backend_->Put(K(key), data.data(), data.size());
  ASSERT_TRUE(s.ok()) << "put " << K(key) << ": " << s.ToString();
}

Result<std::string> BackendConformanceTest::GetRange(std::string_view key, uint64_t offset,
                                                     size_t len) {
  std::vector<uint8_t> buf(len + kGuardBytes, kGuard);
  Result<size_t> n = backend_->Get(K(key), offset, buf.data(), len);
  for (size_t i = len; i < buf.size(); ++i) {
    if (buf[i] != kGuard) return Internal("Get wrote past the end of the caller's buffer");
  }
  if (!n.ok()) return n.status();
  if (*n > len) return Internal("Get returned " + std::to_string(*n) + " > len");
  return std::string(buf.begin(), buf.begin() + *n);
}

std::vector<std::pair<std::string, uint64_t>> BackendConformanceTest::ListAll(
    std::string_view prefix, std::string_view start_after) {
  std::vector<std::pair<std::string, uint64_t>> out;
  // An empty start_after stays empty: "from the first" is a case of its own.
  std::string after = start_after.empty() ? "" : K(start_after);
  Status s = backend_->List(K(prefix), after, [&](const ObjectInfo& o) {
    EXPECT_EQ(o.key.compare(0, prefix_.size(), prefix_), 0) << o.key;
    out.emplace_back(o.key.substr(prefix_.size()), o.size);
    return true;
  });
  EXPECT_TRUE(s.ok()) << "list " << K(prefix) << ": " << s.ToString();
  return out;
}

std::vector<std::string> BackendConformanceTest::ListKeys(std::string_view prefix,
                                                          std::string_view start_after) {
  std::vector<std::string> keys;
  for (auto& [key, size] : ListAll(prefix, start_after)) keys.push_back(key);
  return keys;
}

TEST_P(BackendConformanceTest, DescribeSaysWhere) { EXPECT_FALSE(backend().Describe().empty()); }

TEST_P(BackendConformanceTest, EmptyObjectRoundTrip) {
  MustPut("empty", "");
  auto head = backend().Head(K("empty"));
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size, 0u);
  EXPECT_EQ(head->key, K("empty"));
  auto got = GetRange("empty", 0, 10);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "");
  auto whole = backend().GetObject(K("empty"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(*whole, "");
}

TEST_P(BackendConformanceTest, OneByteRoundTrip) {
  MustPut("one", "x");
  auto got = GetRange("one", 0, 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "x");
  auto more = GetRange("one", 0, 100);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(*more, "x");
}

TEST_P(BackendConformanceTest, LargeObjectRoundTrip) {
  const std::string data = Bytes((5 << 20) + 3, 7);  // 5 MiB and an odd tail
  MustPut("large", data);
  auto head = backend().Head(K("large"));
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size, data.size());
  auto whole = backend().GetObject(K("large"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(*whole == data) << "5 MiB object came back different";
  auto mid = GetRange("large", 3 << 20, 1 << 20);
  ASSERT_TRUE(mid.ok()) << mid.status().ToString();
  EXPECT_TRUE(*mid == data.substr(3 << 20, 1 << 20));
}

TEST_P(BackendConformanceTest, RangedGets) {
  const std::string data = Bytes(1000, 11);
  MustPut("r", data);
  struct Case {
    uint64_t offset;
    size_t len;
    std::string want;
  } cases[] = {
      {0, 1000, data},                    // exactly the object
      {100, 200, data.substr(100, 200)},  // inside
      {999, 1, data.substr(999)},         // the last byte
      {900, 200, data.substr(900)},       // spanning the end: short
      {0, 5000, data},                    // longer than the object: short
      {1000, 10, ""},                     // at the end
      {5000, 10, ""},                     // past the end
      {std::numeric_limits<uint64_t>::max(), 10, ""},
      {500, 0, ""},  // nothing asked
  };
  for (const Case& c : cases) {
    auto got = GetRange("r", c.offset, c.len);
    ASSERT_TRUE(got.ok()) << "offset " << c.offset << " len " << c.len << ": "
                          << got.status().ToString();
    EXPECT_TRUE(*got == c.want) << "offset " << c.offset << " len " << c.len << ": got "
                                << got->size() << " bytes, want " << c.want.size();
  }
}

TEST_P(BackendConformanceTest, MissingObjectIsNotFound) {
  MustPut("dir/obj", "x");
  for (const char* key : {"nothing", "dir", "dir/ob", "dir/obj/under", "dir/obj2"}) {
    auto got = GetRange(key, 0, 10);
    EXPECT_EQ(got.status().code(), Code::kNotFound) << key << ": " << got.status().ToString();
    auto empty_read = GetRange(key, 0, 0);
    EXPECT_EQ(empty_read.status().code(), Code::kNotFound) << key;
    auto head = backend().Head(K(key));
    EXPECT_EQ(head.status().code(), Code::kNotFound) << key << ": " << head.status().ToString();
    auto whole = backend().GetObject(K(key));
    EXPECT_EQ(whole.status().code(), Code::kNotFound) << key << ": " << whole.status().ToString();
  }
}

TEST_P(BackendConformanceTest, HeadReportsSize) {
  for (size_t size : {0u, 1u, 4097u, 65536u}) {
    std::string key = "h/" + std::to_string(size);
    MustPut(key, Bytes(size, size));
    auto head = backend().Head(K(key));
    ASSERT_TRUE(head.ok()) << key << ": " << head.status().ToString();
    EXPECT_EQ(head->size, size);
    EXPECT_EQ(head->key, K(key));
  }
}

TEST_P(BackendConformanceTest, OverwriteReplacesWholeObject) {
  MustPut("o", std::string(1000, 'a'));
  MustPut("o", std::string(2000, 'b'));
  auto whole = backend().GetObject(K("o"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(*whole, std::string(2000, 'b'));
  MustPut("o", std::string(10, 'c'));  // shorter: nothing of the old tail may survive
  auto head = backend().Head(K("o"));
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size, 10u);
  whole = backend().GetObject(K("o"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(*whole, std::string(10, 'c'));
  auto tail = GetRange("o", 10, 100);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_EQ(*tail, "");
  EXPECT_EQ(ListAll(""), (std::vector<std::pair<std::string, uint64_t>>{{"o", 10}}));
}

// ObjectInfo::version may be empty (the backend cannot tell), but if it is not, it is stable while
// the object is, changes with every rewrite (of the same size too) and reads the same from Head
// and List.
TEST_P(BackendConformanceTest, VersionChangesWithEachRewrite) {
  std::vector<std::string> versions;
  for (char c : {'a', 'b', 'c'}) {
    MustPut("v", std::string(16, c));
    auto head = backend().Head(K("v"));
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    auto again = backend().Head(K("v"));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->version, head->version) << "version changed without a Put";
    std::vector<std::string> listed;
    ASSERT_TRUE(backend()
                    .List(K("v"), "",
                          [&](const ObjectInfo& o) {
                            listed.push_back(o.version);
                            return true;
                          })
                    .ok());
    EXPECT_EQ(listed, std::vector<std::string>{head->version}) << "List and Head disagree";
    versions.push_back(head->version);
  }
  if (versions[0].empty()) {
    EXPECT_EQ(versions, std::vector<std::string>(3)) << "version must be always or never given";
  } else {
    EXPECT_NE(versions[0], versions[1]);
    EXPECT_NE(versions[1], versions[2]);
  }
}

TEST_P(BackendConformanceTest, DeleteIsIdempotent) {
  EXPECT_TRUE(backend().Delete(K("never")).ok());
  MustPut("d/x/y", "1");
  MustPut("d/x/yz", "22");
  MustPut("d/x", "333");  // an object and the "directory" of another, as S3 allows
  Status s = backend().Delete(K("d/x/y"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(backend().Head(K("d/x/y")).status().code(), Code::kNotFound);
  EXPECT_EQ(GetRange("d/x/y", 0, 1).status().code(), Code::kNotFound);
  EXPECT_TRUE(backend().Delete(K("d/x/y")).ok()) << "a second Delete must succeed too";
  EXPECT_EQ(ListKeys("d/"), (std::vector<std::string>{"d/x", "d/x/yz"}));
  ASSERT_TRUE(backend().Delete(K("d/x/yz")).ok());
  ASSERT_TRUE(backend().Delete(K("d/x")).ok());
  EXPECT_EQ(ListKeys(""), std::vector<std::string>{});
  MustPut("d/x/y", "again");  // whatever Delete tidied up, the same key can be put again
  auto got = GetRange("d/x/y", 0, 100);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "again");
}

// Keys chosen so that byte order differs from a directory walk: '-' (0x2d) and '.' (0x2e) sort
// before '/' (0x2f), which sorts before '0', and UTF-8 bytes sort after ASCII (unsigned). "a.z"
// sorts before everything under "a/" whatever a backend calls the directory on disk.
const std::vector<std::string> kListKeys = {
    "A",       "a",    "a-b",        "a.b", "a.z", "a/b",       "a/b-", "a/b/c",
    "a/b/c/d", "a/bc", "a/\xc3\xa9", "a0",  "ab",  "a\xc3\xa9", "b",
};

TEST_P(BackendConformanceTest, ListReportsByteOrder) {
  // Put in a scrambled order, so insertion order cannot pass for sorting.
  std::vector<std::string> scrambled = kListKeys;
  std::shuffle(scrambled.begin(), scrambled.end(), std::mt19937(1));
  for (const std::string& key : scrambled) MustPut(key, "v:" + key);
  std::vector<std::pair<std::string, uint64_t>> want;
  for (const std::string& key : kListKeys) want.emplace_back(key, key.size() + 2);
  EXPECT_EQ(ListAll(""), want);
}

TEST_P(BackendConformanceTest, ListHonorsPrefix) {
  for (const std::string& key : kListKeys) MustPut(key, "v:" + key);
  using V = std::vector<std::string>;
  EXPECT_EQ(ListKeys("a/b"), (V{"a/b", "a/b-", "a/b/c", "a/b/c/d", "a/bc"}));
  EXPECT_EQ(ListKeys("a/b/"), (V{"a/b/c", "a/b/c/d"}));
  EXPECT_EQ(ListKeys("a/b/c/d"), (V{"a/b/c/d"}));
  EXPECT_EQ(ListKeys("a/b/c/d/"), V{});
  EXPECT_EQ(ListKeys("a."), (V{"a.b", "a.z"}));
  EXPECT_EQ(ListKeys("a/\xc3"), (V{"a/\xc3\xa9"}));  // a prefix may end inside a UTF-8 sequence
  EXPECT_EQ(ListKeys("zz"), V{});
  EXPECT_EQ(ListKeys("a").size(), kListKeys.size() - 2);  // all but "A" and "b"
  EXPECT_EQ(ListKeys("").size(), kListKeys.size());
}

TEST_P(BackendConformanceTest, ListHonorsStartAfter) {
  for (const std::string& key : kListKeys) MustPut(key, "v:" + key);
  using V = std::vector<std::string>;
  const V tail_after_ab = {"a/b-", "a/b/c", "a/b/c/d",   "a/bc", "a/\xc3\xa9",
                           "a0",   "ab",    "a\xc3\xa9", "b"};
  EXPECT_EQ(ListKeys("", "a/b"), tail_after_ab);  // strictly after an existing key
  EXPECT_EQ(ListKeys("", "a/b/"),                 // after a key that is not there
            (V{"a/b/c", "a/b/c/d", "a/bc", "a/\xc3\xa9", "a0", "ab", "a\xc3\xa9", "b"}));
  EXPECT_EQ(ListKeys("", "a/bc"), (V{"a/\xc3\xa9", "a0", "ab", "a\xc3\xa9", "b"}));
  EXPECT_EQ(ListKeys("", "a\xc3\xa9"), (V{"b"}));
  EXPECT_EQ(ListKeys("", "b"), V{});
  EXPECT_EQ(ListKeys("", "\xff"), V{});
  EXPECT_EQ(ListKeys("a/b", "a/b/c"), (V{"a/b/c/d", "a/bc"}));
  EXPECT_EQ(ListKeys("a/b", "A"), (V{"a/b", "a/b-", "a/b/c", "a/b/c/d", "a/bc"}));
  EXPECT_EQ(ListKeys("a/b", "a/c"), V{});
}

TEST_P(BackendConformanceTest, ListStopsWhenTold) {
  for (const std::string& key : kListKeys) MustPut(key, "v:" + key);
  for (size_t stop_at : {1u, 3u, 9u}) {
    std::vector<std::string> seen;
    Status s = backend().List(K(""), "", [&](const ObjectInfo& o) {
      seen.push_back(o.key.substr(prefix_.size()));
      return seen.size() < stop_at;
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(seen, std::vector<std::string>(kListKeys.begin(), kListKeys.begin() + stop_at));
  }
}

TEST_P(BackendConformanceTest, ListOfNothingCallsNothing) {
  EXPECT_EQ(ListAll(""), (std::vector<std::pair<std::string, uint64_t>>{}));
  MustPut("x", "1");
  EXPECT_EQ(ListKeys("y"), std::vector<std::string>{});
}

// A garbage collector lists and deletes as it goes; a reader lists and fetches. The callback
// calling back into the backend must neither deadlock nor lose the keys not yet reported.
TEST_P(BackendConformanceTest, ListCallbackMayUseTheBackend) {
  for (const std::string& key : kListKeys) MustPut(key, "v:" + key);
  std::vector<std::string> seen;
  Status s = backend().List(K(""), "", [&](const ObjectInfo& o) {
    auto got = backend().GetObject(o.key);
    EXPECT_TRUE(got.ok()) << o.key << ": " << got.status().ToString();
    if (got.ok()) {
      EXPECT_EQ(*got, "v:" + o.key.substr(prefix_.size()));
    }
    EXPECT_TRUE(backend().Delete(o.key).ok()) << o.key;
    seen.push_back(o.key.substr(prefix_.size()));
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, kListKeys);
  EXPECT_EQ(ListKeys(""), std::vector<std::string>{});
}

// Valid keys that a file-per-object backend has to take care to map (dot names, names that look
// like its own markers) or that a URL encoder has to get right.
TEST_P(BackendConformanceTest, UnusualValidKeysRoundTrip) {
  std::vector<std::string> keys = {
      ".hidden",
      ".tmp",
      ".tmp/x",
      "...",
      "a..",
      "%pct",
      "%2F",
      "x.d",
      "x.e",
      "x.d.e",
      "x.d/y.e/z",
      "x.e/y",
      "sp ace",
      "plus+eq=amp&",
      "q?h#",
      "st*r",
      "-dash",
      "~tilde",
      "uni/\xc3\xa9\xe2\x82\xac",
      "a/b.d",
      "a/b.d/c",
      "a/b",
      "a/%.d",
      "a/.d",
      "back\\slash",
  };
  for (size_t i = 0; i < keys.size(); ++i) MustPut(keys[i], "#" + std::to_string(i));
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = backend().GetObject(K(keys[i]));
    ASSERT_TRUE(got.ok()) << keys[i] << ": " << got.status().ToString();
    EXPECT_EQ(*got, "#" + std::to_string(i)) << keys[i];
  }
  std::set<std::string> want(keys.begin(), keys.end());
  std::vector<std::string> listed = ListKeys("");
  EXPECT_EQ(listed, std::vector<std::string>(want.begin(), want.end()));
}

TEST_P(BackendConformanceTest, LongestKeyWorks) {
  // 1024 bytes in all, in components of at most 200 bytes (a file name holds 255).
  std::string key = prefix_;
  while (key.size() < 1024) {
    if (!key.empty() && key.back() != '/') key += '/';
    key += std::string(std::min<size_t>(200, 1024 - key.size()), 'k');
  }
  ASSERT_EQ(key.size(), 1024u);
  ASSERT_NE(key.back(), '/');
  std::string rel = key.substr(prefix_.size());
  MustPut(rel, "long");
  auto got = backend().GetObject(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "long");
  EXPECT_EQ(ListKeys(""), std::vector<std::string>{rel});
  EXPECT_TRUE(backend().Delete(key).ok());
}

TEST_P(BackendConformanceTest, InvalidKeysAreRejected) {
  const std::vector<std::string> bad = {
      "",
      "/abs",
      K("a//b"),
      K("trailing/"),
      K("."),
      K("a/./b"),
      K(".."),
      K("a/../b"),
      K(std::string("nul\0byte", 8)),
      K("new\nline"),
      K(std::string(1025 - prefix_.size(), 'k')),
  };
  for (const std::string& key : bad) {
    char buf[4];
    EXPECT_EQ(backend().Put(key, "x", 1).code(), Code::kInvalid) << "put '" << key << "'";
    EXPECT_EQ(backend().Get(key, 0, buf, 4).status().code(), Code::kInvalid) << key;
    EXPECT_EQ(backend().Head(key).status().code(), Code::kInvalid) << key;
    EXPECT_EQ(backend().Delete(key).code(), Code::kInvalid) << key;
    EXPECT_EQ(backend().GetObject(key).status().code(), Code::kInvalid) << key;
  }
  EXPECT_EQ(ListKeys(""), std::vector<std::string>{}) << "a rejected Put stored something";
}

TEST_P(BackendConformanceTest, GetObjectReturnsWholeObject) {
  const std::string data = Bytes(300000, 3);
  MustPut("g/obj", data);
  auto got = backend().GetObject(K("g/obj"));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == data);
  EXPECT_EQ(backend().GetObject(K("g/none")).status().code(), Code::kNotFound);
}

TEST_P(BackendConformanceTest, GetExactReturnsAnObjectOfTheLengthExpected) {
  const std::string data = Bytes(300001, 4);
  MustPut("e/obj", data);
  std::vector<char> buf(data.size() + kGuardBytes, kGuard);
  auto n = backend().GetExact(K("e/obj"), buf.data(), data.size());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, data.size());
  EXPECT_TRUE(std::string(buf.data(), data.size()) == data);
  EXPECT_EQ(static_cast<uint8_t>(buf[data.size()]), kGuard) << "written past the length expected";
  // An object shorter than expected: what there is.
  std::fill(buf.begin(), buf.end(), kGuard);
  n = backend().GetExact(K("e/obj"), buf.data(), data.size() + 10);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, data.size());
  EXPECT_TRUE(std::string(buf.data(), data.size()) == data);
  EXPECT_EQ(backend().GetExact(K("e/none"), buf.data(), 10).status().code(), Code::kNotFound);
  // Longer than expected: never past the buffer (S3: kCorrupt; the others: the first bytes).
  std::fill(buf.begin(), buf.end(), kGuard);
  n = backend().GetExact(K("e/obj"), buf.data(), 1000);
  if (n.ok()) {
    EXPECT_EQ(*n, 1000u);
    EXPECT_TRUE(std::string(buf.data(), 1000) == data.substr(0, 1000));
  } else {
    EXPECT_EQ(n.status().code(), Code::kCorrupt) << n.status().ToString();
  }
  EXPECT_EQ(static_cast<uint8_t>(buf[1000]), kGuard) << "written past the length expected";
}

// Writers overwrite one key with objects that are each uniform in a byte of their own and of a
// length of their own; readers must only ever see one whole object (Backend: atomic objects).
TEST_P(BackendConformanceTest, ConcurrentOverwritesAreNeverTorn) {
  constexpr int kWriters = 4, kReaders = 4, kRounds = 12;
  auto length_of = [](int w) { return size_t{50000} * (w + 1) + w; };
  MustPut("same", std::string(length_of(0), 'A'));
  std::atomic<int> writers_left{kWriters};
  std::mutex mu;
  std::vector<std::string> errors;
  auto fail = [&](std::string e) {
    std::lock_guard lock(mu);
    if (errors.size() < 10) errors.push_back(std::move(e));
  };
  // Which writer wrote `bytes`, or -1 when it is nobody's whole object.
  auto check = [&](std::string_view bytes) {
    int w = bytes.empty() ? -1 : bytes[0] - 'A';
    if (w < 0 || w >= kWriters || bytes.size() != length_of(w)) return -1;
    return bytes.find_first_not_of(bytes[0]) == std::string_view::npos ? w : -1;
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::string data(length_of(w), static_cast<char>('A' + w));
      for (int i = 0; i < kRounds; ++i) {
        Status s = backend().Put(K("same"), data.data(), data.size());
        if (!s.ok()) fail("put: " + s.ToString());
      }
      writers_left--;
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      std::vector<char> buf(length_of(kWriters) + 1);
      // Bounded both ways: at least a few reads, at most a few hundred.
      for (int i = 0; i < 400 && (i < 5 || writers_left > 0); ++i) {
        if (i % 3 == 0) {
          auto n = backend().Get(K("same"), 0, buf.data(), buf.size());
          if (!n.ok()) {
            fail("get: " + n.status().ToString());
          } else if (check(std::string_view(buf.data(), *n)) < 0) {
            fail("get returned a torn object of " + std::to_string(*n) + " bytes");
          }
        } else if (i % 3 == 1) {
          auto head = backend().Head(K("same"));
          bool known = false;
          for (int w = 0; head.ok() && w < kWriters; ++w) known |= head->size == length_of(w);
          if (!known)
            fail("head: " + (head.ok() ? std::to_string(head->size) : head.status().ToString()));
        } else {
          // The default GetObject may see the size change between its Head and Get: kCorrupt.
          auto whole = backend().GetObject(K("same"));
          if (whole.ok() ? check(*whole) < 0 : whole.status().code() != Code::kCorrupt) {
            fail("get object (reader " + std::to_string(r) + "): " +
                 (whole.ok() ? "torn, " + std::to_string(whole->size()) + " bytes"
                             : whole.status().ToString()));
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors, std::vector<std::string>{});
  auto last = backend().GetObject(K("same"));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_GE(check(*last), 0);
}

// Threads put into shared "directories" and delete some of what they put at once, so emptied
// parents get tidied away (by backends that have any) while other threads put into them.
TEST_P(BackendConformanceTest, ConcurrentPutsAndDeletesOfDifferentKeys) {
  constexpr int kThreads = 8, kKeys = 16;
  auto key_of = [](int t, int j) { return "c/" + std::to_string(j) + "/t" + std::to_string(t); };
  auto data_of = [](int t, int j) { return Bytes(100 + 7 * t + j, 1000 * t + j); };
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int j = 0; j < kKeys; ++j) {
        std::string data = data_of(t, j);
        Status s = backend().Put(K(key_of(t, j)), data.data(), data.size());
        if (s.ok() && j % 2 == 1) s = backend().Delete(K(key_of(t, j)));
        if (!s.ok()) {
          std::lock_guard lock(mu);
          errors.push_back(key_of(t, j) + ": " + s.ToString());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors, std::vector<std::string>{});
  std::vector<std::pair<std::string, uint64_t>> want;
  for (int t = 0; t < kThreads; ++t) {
    for (int j = 0; j < kKeys; j += 2) want.emplace_back(key_of(t, j), data_of(t, j).size());
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ListAll("c/"), want);
  for (int t = 0; t < kThreads; ++t) {
    for (int j = 0; j < kKeys; j += 2) {
      auto got = backend().GetObject(K(key_of(t, j)));
      ASSERT_TRUE(got.ok()) << key_of(t, j) << ": " << got.status().ToString();
      EXPECT_TRUE(*got == data_of(t, j)) << key_of(t, j);
    }
  }
}

TEST_P(BackendConformanceTest, PutIfAbsentCreatesOnlyWhatIsAbsent) {
  const std::string k = K("x/once");
  ASSERT_TRUE(backend().PutIfAbsent(k, "first", 5).ok());
  Status again = backend().PutIfAbsent(k, "second", 6);
  EXPECT_EQ(again.code(), Code::kExists) << again.ToString();
  auto got = backend().GetObject(k);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "first");
  // After a delete the name is free again.
  ASSERT_TRUE(backend().Delete(k).ok());
  ASSERT_TRUE(backend().PutIfAbsent(k, "third", 5).ok());
  EXPECT_EQ(*backend().GetObject(k), "third");
}

TEST_P(BackendConformanceTest, ConcurrentPutIfAbsentHasOneWinnerPerKey) {
  // 8 threads race for each of 12 keys: exactly one create of each succeeds, and the object
  // holds the winner's bytes (the journal's numbers rest on this).
  constexpr int kThreads = 8, kKeys = 12;
  std::mutex mu;
  std::vector<std::vector<int>> winners(kKeys);
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int j = 0; j < kKeys; ++j) {
        const std::string data = "writer " + std::to_string(t);
        Status s;
        for (int attempt = 0; attempt < 50; ++attempt) {
          s = backend().PutIfAbsent(K("race/" + std::to_string(j)), data.data(), data.size());
          if (s.code() != Code::kBusy) break;  // a concurrent create in flight: ask again
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::lock_guard lock(mu);
        if (s.ok()) {
          winners[j].push_back(t);
        } else if (s.code() != Code::kExists) {
          errors.push_back(s.ToString());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors, std::vector<std::string>{});
  for (int j = 0; j < kKeys; ++j) {
    ASSERT_EQ(winners[j].size(), 1u) << "key " << j;
    auto got = backend().GetObject(K("race/" + std::to_string(j)));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, "writer " + std::to_string(winners[j][0])) << "key " << j;
  }
}

}  // namespace ckptfs::test
