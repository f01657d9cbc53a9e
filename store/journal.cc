#include "store/journal.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "store/summed_text.h"

namespace ckptfs {
namespace {

constexpr std::string_view kMagic = "ckptfs-journal 1\n";
constexpr int kSeqDigits = 20;  // decimal, zero-padded: byte order is number order

uint64_t RandomInstance() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

NamespaceJournal::NamespaceJournal(Backend* backend, std::string writer)
    : backend_(backend), writer_(std::move(writer)), instance_(RandomInstance()) {}

std::string NamespaceJournal::Key(uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llu", kSeqDigits, static_cast<unsigned long long>(seq));
  return std::string(kPrefix) + buf;
}

uint64_t NamespaceJournal::SeqOf(std::string_view key) {
  if (key.substr(0, kPrefix.size()) != kPrefix) return 0;
  std::string_view digits = key.substr(kPrefix.size());
  if (digits.size() != kSeqDigits) return 0;
  uint64_t seq = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    seq = seq * 10 + static_cast<uint64_t>(c - '0');
  }
  return seq;
}

std::string NamespaceJournal::Body(const std::string& key, uint64_t nonce) const {
  return WithSum(std::string(kMagic) + "key=" + key + "\nwriter=" + writer_ + "\nnonce=" +
                 std::to_string(instance_) + "-" + std::to_string(nonce) + "\n");
}

Result<uint64_t> NamespaceJournal::LastAfter(uint64_t after) {
  uint64_t last = after;
  RETURN_IF_ERROR(backend_->List(std::string(kPrefix), after ? Key(after) : "",
                                 [&](const ObjectInfo& o) {
                                   if (uint64_t s = SeqOf(o.key); s > last) last = s;
                                   return true;
                                 }));
  return last;
}

Result<uint64_t> NamespaceJournal::Head() {
  uint64_t oldest = 0;
  RETURN_IF_ERROR(backend_->List(std::string(kPrefix), "", [&](const ObjectInfo& o) {
    oldest = SeqOf(o.key);
    return oldest == 0;  // skip anything that is no entry
  }));
  if (oldest == 0) return uint64_t{0};
  auto exists = [&](uint64_t seq) -> Result<bool> {
    auto h = backend_->Head(Key(seq));
    if (h.ok()) return true;
    if (h.status().code() == Code::kNotFound) return false;
    return h.status();
  };
  uint64_t lo = oldest, step = 1, hi = oldest + 1;
  for (;;) {  // lo exists; find an hi that does not
    ASSIGN_OR_RETURN(bool e, exists(hi));
    if (!e) break;
    lo = hi;
    step *= 2;
    hi = lo + step;
  }
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(bool e, exists(mid));
    (e ? lo : hi) = mid;
  }
  // Confirmed by a listing after it: a truncation running meanwhile can delete what the HEADs
  // stood on and leave lo short of the newest (the newest itself is never deleted).
  ASSIGN_OR_RETURN(lo, LastAfter(lo));
  std::lock_guard lock(mu_);
  if (lo > head_hint_) head_hint_ = lo;
  return lo;
}

Status NamespaceJournal::Append(const std::string& key) {
  const std::string body = Body(key, next_nonce_++);
  uint64_t hint;
  {
    std::lock_guard lock(mu_);
    hint = head_hint_;
  }
  if (hint == 0) {
    ASSIGN_OR_RETURN(hint, Head());
  }
  // One past the newest entry, as a listing after the hint shows it: never a number the hint
  // alone suggests, which a truncation since may have freed (a number taken once is never
  // taken again, so a reader past it would miss the entry).
  ASSIGN_OR_RETURN(uint64_t seq, LastAfter(hint));
  ++seq;
  auto backoff = std::chrono::milliseconds(5);
  for (int attempt = 0; attempt < 10000; ++attempt) {
    Status st = backend_->PutIfAbsent(Key(seq), body.data(), body.size());
    if (st.code() == Code::kExists) {
      // Ours, from an attempt whose answer was lost? Else another writer's: after the newest.
      auto got = backend_->GetObject(Key(seq));
      if (got.ok() && *got == body) st = Status::Ok();
    }
    if (st.ok()) {
      std::lock_guard lock(mu_);
      if (seq > head_hint_) head_hint_ = seq;
      return Status::Ok();
    }
    if (st.code() == Code::kExists) {
      ASSIGN_OR_RETURN(uint64_t last, LastAfter(seq));
      seq = std::max(last, seq) + 1;
      continue;
    }
    if (st.code() != Code::kBusy) return st;
    std::this_thread::sleep_for(backoff);  // a concurrent create of this number: settle first
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  return Status(Code::kBusy, "journal: no free entry number after 10000 tries");
}

Result<NamespaceJournal::Batch> NamespaceJournal::ReadAfter(uint64_t cursor, size_t max) {
  Batch b;
  b.last = cursor;
  std::vector<uint64_t> seqs;
  bool broken = false;
  RETURN_IF_ERROR(backend_->List(std::string(kPrefix), cursor ? Key(cursor) : "",
                                 [&](const ObjectInfo& o) {
                                   const uint64_t s = SeqOf(o.key);
                                   if (s == 0) return true;
                                   if (s != cursor + 1 + seqs.size()) {
                                     broken = seqs.empty();  // truncated past the cursor
                                     return false;           // else: the rest next time
                                   }
                                   seqs.push_back(s);
                                   return seqs.size() < max;
                                 }));
  if (broken) {
    b.gap = true;
    return b;
  }
  for (uint64_t s : seqs) {
    std::string key;
    for (int attempt = 0; attempt < 3 && key.empty(); ++attempt) {
      auto body = backend_->GetObject(Key(s));
      if (!body.ok() && body.status().code() == Code::kNotFound) break;
      if (!body.ok()) {
        // What was read so far is a batch; the rest waits for the next pass (on a backend that
        // fails now and then, a long batch read whole would rarely get through).
        if (b.keys.empty()) return body.status();
        std::lock_guard lock(mu_);
        if (b.last > head_hint_) head_hint_ = b.last;
        return b;
      }
      key = TextField(VerifiedBody(*body, kMagic), "key");  // damaged on the way: read it again
    }
    if (key.empty()) {  // gone since the listing (truncated), or damaged for good
      b.gap = true;
      return b;
    }
    b.keys.push_back(std::move(key));
    b.last = s;
  }
  std::lock_guard lock(mu_);
  if (b.last > head_hint_) head_hint_ = b.last;
  return b;
}

Result<bool> NamespaceJournal::CreatesAreExclusive() {
  const std::string key = std::string(kPrefix) + "probe-" + writer_ + "-" + std::to_string(instance_);
  RETURN_IF_ERROR(backend_->PutIfAbsent(key, "1", 1));
  Status again = backend_->PutIfAbsent(key, "2", 1);
  (void)backend_->Delete(key);
  if (again.ok()) return false;
  if (again.code() == Code::kExists) return true;
  return again;
}

Result<uint64_t> NamespaceJournal::Truncate(uint64_t keep, uint64_t keep_after) {
  if (keep == 0) keep = 1;
  std::vector<uint64_t> seqs;
  RETURN_IF_ERROR(backend_->List(std::string(kPrefix), "", [&](const ObjectInfo& o) {
    if (uint64_t s = SeqOf(o.key)) seqs.push_back(s);
    return true;
  }));
  if (seqs.size() <= keep) return uint64_t{0};
  const size_t drop = seqs.size() - keep;
  uint64_t dropped = 0;
  for (size_t i = 0; i < drop && seqs[i] <= keep_after; ++i, ++dropped) {
    RETURN_IF_ERROR(backend_->Delete(Key(seqs[i])));
  }
  return dropped;
}

}  // namespace ckptfs
