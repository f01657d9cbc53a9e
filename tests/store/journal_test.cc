// The namespace journal (store/journal.h) against a model: writers on many threads appending
// interleaved, creates whose answers are lost and retried, truncation and the reader's relist,
// and the number of requests a reader's pass and a new reader's Head cost.
#include "store/journal.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/mem_backend.h"

namespace ckptfs {
namespace {

// A backend whose conditional creates sometimes lose their answer: the object is stored but
// the caller hears kIo (a timeout), or hears kExists for its own create (a retry inside the
// client after the first attempt got through).
class LossyBackend : public Backend {
 public:
  explicit LossyBackend(MemBackend* m, uint64_t seed) : m_(m), rng_(seed) {}
  Status Put(const std::string& k, const void* d, size_t n) override { return m_->Put(k, d, n); }
  Status PutIfAbsent(const std::string& k, const void* d, size_t n) override {
    Status st = m_->PutIfAbsent(k, d, n);
    std::lock_guard lock(mu_);
    const uint64_t dice = rng_() % 8;
    if (st.ok() && dice == 0) return Status(Code::kIo, "injected: answer lost");
    if (st.ok() && dice == 1) return Status(Code::kExists, "injected: retried after success");
    return st;
  }
  Result<size_t> Get(const std::string& k, uint64_t o, void* b, size_t n) override {
    return m_->Get(k, o, b, n);
  }
  Result<ObjectInfo> Head(const std::string& k) override { return m_->Head(k); }
  Status Delete(const std::string& k) override { return m_->Delete(k); }
  Status List(const std::string& p, const std::string& a,
              const std::function<bool(const ObjectInfo&)>& fn) override {
    return m_->List(p, a, fn);
  }
  std::string Describe() const override { return "lossy " + m_->Describe(); }

 private:
  MemBackend* m_;
  std::mutex mu_;
  std::mt19937_64 rng_;
};

TEST(NamespaceJournal, KeysAreNumberedInByteOrder) {
  EXPECT_EQ(NamespaceJournal::Key(7), "journal/00000000000000000007");
  EXPECT_EQ(NamespaceJournal::SeqOf(NamespaceJournal::Key(123456789)), 123456789u);
  EXPECT_LT(NamespaceJournal::Key(9), NamespaceJournal::Key(10));
  EXPECT_EQ(NamespaceJournal::SeqOf("journal/x"), 0u);
  EXPECT_EQ(NamespaceJournal::SeqOf("files/00000000000000000001"), 0u);
}

TEST(NamespaceJournal, InterleavedWritersGetDenseNumbersAndReadersSeeEveryChange) {
  MemBackend mem;
  constexpr int kWriters = 8, kEach = 40;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> errors;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      NamespaceJournal j(&mem, "node" + std::to_string(w));
      for (int i = 0; i < kEach; ++i) {
        Status st = j.Append("files/w" + std::to_string(w) + "/" + std::to_string(i));
        if (!st.ok()) {
          std::lock_guard lock(mu);
          errors.push_back(st.ToString());
        }
      }
    });
  }
  // A reader following along while they write: every key shows up, in one order, exactly once.
  NamespaceJournal reader(&mem, "reader");
  std::vector<std::string> read;
  uint64_t cursor = 0;
  auto follow = [&] {
    auto b = reader.ReadAfter(cursor, 7);  // small batches: the cursor moves many times
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_FALSE(b->gap);
    read.insert(read.end(), b->keys.begin(), b->keys.end());
    cursor = b->last;
  };
  while (read.size() < kWriters * kEach && errors.empty()) {
    follow();
    if (read.size() == static_cast<size_t>(kWriters * kEach)) break;
    std::this_thread::yield();
  }
  for (std::thread& t : threads) t.join();
  follow();
  EXPECT_EQ(errors, std::vector<std::string>{});
  EXPECT_EQ(cursor, static_cast<uint64_t>(kWriters * kEach));
  std::set<std::string> unique(read.begin(), read.end());
  EXPECT_EQ(unique.size(), read.size());
  EXPECT_EQ(read.size(), static_cast<size_t>(kWriters * kEach));
  // Each writer's own changes keep their order.
  for (int w = 0; w < kWriters; ++w) {
    int next = 0;
    for (const std::string& k : read) {
      if (k.rfind("files/w" + std::to_string(w) + "/", 0) == 0) {
        EXPECT_EQ(k, "files/w" + std::to_string(w) + "/" + std::to_string(next)) << k;
        ++next;
      }
    }
  }
  auto head = reader.Head();
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, static_cast<uint64_t>(kWriters * kEach));
}

TEST(NamespaceJournal, LostAndRepeatedAnswersLoseNoChange) {
  // Two writers whose creates lose their answers; each retries a failed Append (as RemoteTier
  // redoes the op). Every change is in the journal, at most twice, and none is lost; an
  // answer of kExists for a writer's own create is known as its own, not taken twice.
  MemBackend mem;
  LossyBackend lossy1(&mem, 1), lossy2(&mem, 2);
  NamespaceJournal a(&lossy1, "a"), b(&lossy2, "b");
  std::map<std::string, int> want;
  int retries = 0;
  for (int i = 0; i < 200; ++i) {
    NamespaceJournal& j = i % 3 ? a : b;
    const std::string key = "files/k" + std::to_string(i);
    want[key] = 1;  // appends of it, at most: the first, and one per retry
    for (;;) {
      Status st = j.Append(key);
      if (st.ok()) break;
      ASSERT_EQ(st.code(), Code::kIo) << st.ToString();
      ++retries;
      ++want[key];
    }
  }
  EXPECT_GT(retries, 5);  // the injection did happen
  NamespaceJournal reader(&mem, "r");
  auto batch = reader.ReadAfter(0);
  ASSERT_TRUE(batch.ok());
  ASSERT_FALSE(batch->gap);
  std::map<std::string, int> got;
  for (const std::string& k : batch->keys) ++got[k];
  for (const auto& [k, n] : want) {
    EXPECT_GE(got[k], 1) << k << " lost";
    EXPECT_LE(got[k], n) << k << ": an own create answered kExists was appended again";
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_LE(batch->keys.size(), want.size() + static_cast<size_t>(retries));
}

TEST(NamespaceJournal, TruncationSendsAReaderThatFellBehindToTheListing) {
  MemBackend mem;
  NamespaceJournal w(&mem, "w");
  for (int i = 1; i <= 50; ++i) ASSERT_TRUE(w.Append("dirs/d" + std::to_string(i)).ok());
  NamespaceJournal reader(&mem, "r");
  auto b = reader.ReadAfter(0, 10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->last, 10u);
  auto dropped = w.Truncate(20);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 30u);
  // The reader at 10 cannot go on: entries 11..30 are gone.
  auto after = reader.ReadAfter(10);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->gap);
  // Head is still 50 and new entries go on from there: numbers are never taken twice.
  auto head = reader.Head();
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, 50u);
  NamespaceJournal fresh(&mem, "fresh");  // knows nothing: finds the head itself
  ASSERT_TRUE(fresh.Append("dirs/new").ok());
  auto tail = reader.ReadAfter(50);
  ASSERT_TRUE(tail.ok());
  ASSERT_FALSE(tail->gap);
  EXPECT_EQ(tail->keys, std::vector<std::string>{"dirs/new"});
  EXPECT_EQ(tail->last, 51u);
  // Truncating everything keeps the newest.
  ASSERT_TRUE(w.Truncate(0).ok());
  head = reader.Head();
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, 51u);
}

TEST(NamespaceJournal, AReaderPassCostsOneListingAndANewReaderLogarithmicRequests) {
  MemBackend mem;
  NamespaceJournal w(&mem, "w");
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(w.Append("files/f" + std::to_string(i)).ok());
  NamespaceJournal reader(&mem, "r");
  mem.ResetStats();
  auto head = reader.Head();
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, 1000u);
  const auto h = mem.stats();
  EXPECT_EQ(h.lists, 2u);   // the oldest entry; the listing after the bisection's answer
  EXPECT_LE(h.heads, 22u);  // doubling to 1024, then bisecting: 2 log2(1000)
  mem.ResetStats();
  auto none = reader.ReadAfter(1000);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->keys.empty());
  EXPECT_EQ(mem.stats().lists, 1u);
  EXPECT_EQ(mem.stats().gets, 0u);
  ASSERT_TRUE(w.Append("files/one").ok());
  mem.ResetStats();
  auto one = reader.ReadAfter(1000);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->keys, std::vector<std::string>{"files/one"});
  EXPECT_EQ(mem.stats().lists, 1u);
  EXPECT_LE(mem.stats().gets, 2u);  // the entry (a size, then its bytes)
}

TEST(NamespaceJournal, AWriterWhoseHintATruncationFreedTakesNoNumberTwice) {
  // A writer appends entry 1 and falls silent while others append 2..10 and gc keeps the
  // newest 3: its hint (1) points into the freed range. Its next entry is 11, which a reader
  // at 10 finds; taking 2 again would hide the change from every reader past it.
  MemBackend mem;
  NamespaceJournal quiet(&mem, "quiet"), busy(&mem, "busy"), reader(&mem, "r");
  ASSERT_TRUE(quiet.Append("files/a").ok());
  for (int i = 2; i <= 10; ++i) ASSERT_TRUE(busy.Append("files/b" + std::to_string(i)).ok());
  auto upto = reader.ReadAfter(0);
  ASSERT_TRUE(upto.ok());
  EXPECT_EQ(upto->last, 10u);
  ASSERT_TRUE(busy.Truncate(3).ok());
  ASSERT_TRUE(quiet.Append("files/late").ok());
  auto after = reader.ReadAfter(10);
  ASSERT_TRUE(after.ok());
  ASSERT_FALSE(after->gap);
  EXPECT_EQ(after->keys, std::vector<std::string>{"files/late"});
  EXPECT_EQ(after->last, 11u);
  auto head = NamespaceJournal(&mem, "fresh").Head();
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, 11u);
}

// A gateway that ignores If-None-Match: every create succeeds.
class IgnoresConditions : public LossyBackend {
 public:
  explicit IgnoresConditions(MemBackend* m) : LossyBackend(m, 0), m_(m) {}
  Status PutIfAbsent(const std::string& k, const void* d, size_t n) override {
    return m_->Put(k, d, n);
  }

 private:
  MemBackend* m_;
};

TEST(NamespaceJournal, AProbeTellsWhetherCreatesAreExclusive) {
  MemBackend mem;
  auto ok = NamespaceJournal(&mem, "n").CreatesAreExclusive();
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(*ok);
  IgnoresConditions lax(&mem);
  auto lax_ok = NamespaceJournal(&lax, "n").CreatesAreExclusive();
  ASSERT_TRUE(lax_ok.ok());
  EXPECT_FALSE(*lax_ok);
  std::vector<std::string> left;
  ASSERT_TRUE(mem.List("journal/", "", [&](const ObjectInfo& o) {
    left.push_back(o.key);
    return true;
  }).ok());
  EXPECT_EQ(left, std::vector<std::string>{});  // the probe cleans up after itself
}

// Fails a third of the GETs.
class FlakyGets : public LossyBackend {
 public:
  explicit FlakyGets(MemBackend* m) : LossyBackend(m, 0), m_(m) {}
  Status PutIfAbsent(const std::string& k, const void* d, size_t n) override {
    return m_->PutIfAbsent(k, d, n);
  }
  Result<size_t> Get(const std::string& k, uint64_t o, void* b, size_t n) override {
    if (++calls_ % 3 == 0) return Status(Code::kIo, "injected: get " + k);
    return m_->Get(k, o, b, n);
  }

 private:
  MemBackend* m_;
  int calls_ = 0;
};

TEST(NamespaceJournal, AReaderOnAFlakyBackendGetsThroughALongBatchInParts) {
  // Read whole, a batch of 60 entries would need 60 GETs in a row to succeed; in parts, every
  // pass keeps what it read, and the reader gets through, each key once and in order.
  MemBackend mem;
  NamespaceJournal w(&mem, "w");
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(w.Append("files/k" + std::to_string(i)).ok());
  FlakyGets flaky(&mem);
  NamespaceJournal reader(&flaky, "r");
  std::vector<std::string> got;
  uint64_t cursor = 0;
  for (int pass = 0; pass < 200 && cursor < 60; ++pass) {
    auto b = reader.ReadAfter(cursor);
    if (!b.ok()) continue;  // the first GET failed: nothing read, try again
    ASSERT_FALSE(b->gap);
    got.insert(got.end(), b->keys.begin(), b->keys.end());
    cursor = b->last;
  }
  ASSERT_EQ(cursor, 60u);
  ASSERT_EQ(got.size(), 60u);
  for (int i = 0; i < 60; ++i) EXPECT_EQ(got[i], "files/k" + std::to_string(i));
}

}  // namespace
}  // namespace ckptfs
