#include "store/gc.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "cache/chunk_cache.h"
#include "common/thread_pool.h"
#include "store/remote_tier.h"

namespace ckptfs {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kRoundMagic = "ckptfs-gc-round 1\n";

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void Say(const GcOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

// Every record's chunk ids, for `fn` (each record checks its own hash). kCorrupt-free: an
// unreadable record is counted in *bad and skipped; fn sees only the readable ones.
Status ForEachReference(Backend& b, const GcOptions& o, uint64_t* records, uint64_t* bad,
                        const std::function<Status(const ChunkId&)>& fn) {
  std::vector<std::string> keys;
  Status st = b.List("files/", "", [&](const ObjectInfo& info) {
    keys.push_back(info.key);
    return true;
  });
  if (!st.ok()) return Status(st.code(), "listing files/ of " + b.Describe() + ": " + st.message());
  *records = keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    Say(o, "reading records: " + std::to_string(i) + " of " + std::to_string(keys.size()));
    auto bytes = b.GetObject(keys[i]);
    if (!bytes.ok() && bytes.status().code() == Code::kNotFound) continue;  // deleted meanwhile
    auto rec = bytes.ok() ? FileRecord::Decode(*bytes) : Result<FileRecord>(bytes.status());
    if (!rec.ok()) {
      ++*bad;
      std::fprintf(stderr, "ckptfs gc: %s: %s\n", keys[i].c_str(), rec.status().ToString().c_str());
      continue;
    }
    for (const Extent& e : rec->manifest.extents()) {
      if (!e.hole()) RETURN_IF_ERROR(fn(e.id));
    }
  }
  return Status::Ok();
}

struct Spill {
  std::vector<std::FILE*> files = std::vector<std::FILE*>(256, nullptr);
  ~Spill() {
    for (std::FILE* f : files) {
      if (f) std::fclose(f);
    }
  }
};

// Pass 1: the chunks no record names, one prefix at a time (memory: one 256th of the references).
Status FindUnreferenced(Backend& b, const GcOptions& o, GcReport& r,
                        std::vector<std::pair<ChunkId, uint64_t>>& out) {
  if (o.spill_dir.empty()) return Invalid("gc needs a directory for its spill files");
  Spill spill;
  for (int i = 0; i < 256; ++i) {
    const std::string path = o.spill_dir + "/" + std::to_string(i);
    spill.files[i] = std::fopen(path.c_str(), "w+b");
    if (!spill.files[i]) return Status::FromErrno(errno, "creating spill file " + path);
  }
  RETURN_IF_ERROR(ForEachReference(b, o, &r.records, &r.bad_records, [&](const ChunkId& id) {
    uint8_t raw[16];
    id.ToBytes(raw);
    if (std::fwrite(raw, 1, sizeof(raw), spill.files[raw[0]]) != sizeof(raw)) {
      return Status::FromErrno(errno, "writing a spill file in " + o.spill_dir);
    }
    ++r.references;
    return Status::Ok();
  }));
  for (int p = 0; p < 256; ++p) {
    Say(o, "comparing chunks/: prefix " + std::to_string(p + 1) + " of 256");
    std::FILE* f = spill.files[p];
    // A reference lost in a spill file would make its chunk look unreferenced: any error stops.
    if (std::fflush(f) != 0 || std::ferror(f)) {
      return Status::FromErrno(errno, "writing a spill file in " + o.spill_dir);
    }
    std::rewind(f);
    std::vector<ChunkId> ids;
    uint8_t raw[16];
    while (std::fread(raw, 1, sizeof(raw), f) == sizeof(raw)) ids.push_back(ChunkId::FromBytes(raw));
    if (std::ferror(f)) return IoError("reading a spill file in " + o.spill_dir);
    std::fclose(f);
    spill.files[p] = nullptr;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    r.peak_ids = std::max(r.peak_ids, ids.size());
    char prefix[16];
    std::snprintf(prefix, sizeof(prefix), "chunks/%02x/", p);
    Status st = b.List(prefix, "", [&](const ObjectInfo& info) {
      auto id = ChunkId::FromHex(std::string_view(info.key).substr(std::strlen(prefix)));
      if (!id) return true;  // not a chunk object
      ++r.chunks;
      r.chunk_bytes += info.size;
      if (!std::binary_search(ids.begin(), ids.end(), *id)) {
        ++r.unreferenced;
        r.unreferenced_bytes += info.size;
        out.emplace_back(*id, info.size);
      }
      return true;
    });
    if (!st.ok()) return Status(st.code(), "listing " + std::string(prefix) + ": " + st.message());
  }
  r.peak_ids = std::max(r.peak_ids, out.size());
  return Status::Ok();
}

}  // namespace

std::string GcCondemnedKey(uint64_t epoch) { return "gc/condemned-" + std::to_string(epoch); }

std::string GcRound::Encode() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "epoch %llu\nstate %s\ndeadline_s %.3f\n",
                static_cast<unsigned long long>(epoch), active ? "active" : "done", deadline_s);
  return std::string(kRoundMagic) + buf;
}

Result<GcRound> GcRound::Decode(std::string_view text) {
  if (text.substr(0, kRoundMagic.size()) != kRoundMagic) {
    return Corrupt("gc/round is damaged or of another version");
  }
  text.remove_prefix(kRoundMagic.size());
  GcRound r;
  bool have_epoch = false, have_state = false, have_deadline = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return Corrupt("gc/round is truncated");
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) return Corrupt("gc/round has a malformed line");
    const std::string_view key = line.substr(0, sp), val = line.substr(sp + 1);
    if (key == "epoch") {
      auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), r.epoch);
      have_epoch = ec == std::errc() && p == val.data() + val.size();
    } else if (key == "state") {
      have_state = val == "active" || val == "done";
      r.active = val == "active";
    } else if (key == "deadline_s") {
      // from_chars for double is in GCC 12's libstdc++.
      auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), r.deadline_s);
      have_deadline = ec == std::errc() && p == val.data() + val.size() && r.deadline_s >= 0;
    }
  }
  if (!have_epoch || !have_state || !have_deadline) return Corrupt("gc/round lacks a field");
  return r;
}

Result<GcRound> ReadGcRound(Backend& backend) {
  auto bytes = backend.GetObject(kGcRoundKey);
  if (!bytes.ok() && bytes.status().code() == Code::kNotFound) return GcRound{};
  if (!bytes.ok()) return bytes.status();
  return GcRound::Decode(*bytes);
}

Result<std::vector<ChunkId>> ReadCondemned(Backend& backend, uint64_t epoch) {
  ASSIGN_OR_RETURN(std::string bytes, backend.GetObject(GcCondemnedKey(epoch)));
  if (bytes.size() % 16 != 0) return Corrupt(GcCondemnedKey(epoch) + " is truncated");
  std::vector<ChunkId> ids;
  ids.reserve(bytes.size() / 16);
  for (size_t at = 0; at < bytes.size(); at += 16) {
    ids.push_back(ChunkId::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data() + at)));
  }
  if (!std::is_sorted(ids.begin(), ids.end())) return Corrupt(GcCondemnedKey(epoch) + " is not sorted");
  return ids;
}

Result<GcReport> CollectGarbage(Backend& b, const GcOptions& o) {
  GcReport r;
  std::vector<std::pair<ChunkId, uint64_t>> condemned;
  RETURN_IF_ERROR(FindUnreferenced(b, o, r, condemned));
  if (o.dry_run || r.bad_records > 0 || condemned.empty()) {
    if (r.bad_records > 0) r.error = "records could not be read: nothing is condemned";
    return r;
  }
  std::sort(condemned.begin(), condemned.end());

  // Condemn: the ids first, then the round that names them.
  ASSIGN_OR_RETURN(GcRound prev, ReadGcRound(b));
  GcRound round;
  round.epoch = prev.epoch + 1;
  round.active = true;
  round.deadline_s = o.deadline_s > 0 ? o.deadline_s : o.grace_s + 7200;
  if (round.deadline_s <= o.grace_s) return Invalid("the deadline must be longer than the grace");
  {
    std::string ids;
    ids.reserve(condemned.size() * 16);
    for (const auto& [id, size] : condemned) {
      uint8_t raw[16];
      id.ToBytes(raw);
      ids.append(reinterpret_cast<const char*>(raw), 16);
    }
    RETURN_IF_ERROR(b.Put(GcCondemnedKey(round.epoch), ids.data(), ids.size()));
  }
  const std::string active = round.Encode();
  RETURN_IF_ERROR(b.Put(kGcRoundKey, active.data(), active.size()));
  const Clock::time_point written = Clock::now();  // after the PUT: the round exists by now
  r.epoch = round.epoch;
  auto close_round = [&]() -> Status {
    GcRound done = round;
    done.active = false;
    const std::string text = done.Encode();
    Status st = b.Put(kGcRoundKey, text.data(), text.size());
    // The ids of the round before stay until now: a node may have been reading them.
    if (st.ok() && prev.epoch > 0) (void)b.Delete(GcCondemnedKey(prev.epoch));
    return st;
  };

  // Grace: every node that skipped an upload without having seen this round finishes its
  // record's PUT within its gc_window < grace_s of reading gc/round, so by then its record is
  // listed below.
  while (Since(written) < o.grace_s) {
    const double left = o.grace_s - Since(written);
    Say(o, "round " + std::to_string(round.epoch) + ": " + std::to_string(condemned.size()) +
               " chunks condemned; deleting in " + std::to_string(static_cast<int>(left + 1)) + " s");
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.2)));
  }

  // Read every record again: a condemned chunk named by any record now stays.
  std::vector<bool> named(condemned.size(), false);
  uint64_t records = 0, bad = 0;
  Status st = ForEachReference(b, o, &records, &bad, [&](const ChunkId& id) {
    auto it = std::lower_bound(condemned.begin(), condemned.end(), std::make_pair(id, uint64_t{0}),
                               [](const auto& a, const auto& k) { return a.first < k.first; });
    if (it != condemned.end() && it->first == id) named[it - condemned.begin()] = true;
    return Status::Ok();
  });
  if (!st.ok() || bad > 0) {
    r.error = !st.ok() ? st.ToString() : "a record could not be read on the second pass";
    r.left = condemned.size();
    RETURN_IF_ERROR(close_round());
    return r;
  }

  // Sweep, never past the deadline the nodes were promised.
  std::atomic<uint64_t> deleted{0}, deleted_bytes{0}, failed{0}, late{0};
  {
    ThreadPool pool(std::max<uint32_t>(o.threads, 1));
    for (size_t i = 0; i < condemned.size(); ++i) {
      if (named[i]) {
        ++r.rereferenced;
        continue;
      }
      pool.Submit([&, i] {
        if (Since(written) >= round.deadline_s) {
          ++late;
          return;
        }
        Status del = b.Delete(ChunkCache::ObjectKey(condemned[i].first));
        if (del.ok()) {
          ++deleted;
          deleted_bytes += condemned[i].second;
        } else {
          ++failed;
        }
      });
    }
    while (deleted + failed + late + r.rereferenced < condemned.size()) {
      Say(o, "round " + std::to_string(round.epoch) + ": deleted " + std::to_string(deleted.load()) +
                 " of " + std::to_string(condemned.size() - r.rereferenced));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  r.deleted = deleted;
  r.deleted_bytes = deleted_bytes;
  r.left = failed + late;
  if (late) r.error = "the deadline passed: " + std::to_string(late.load()) + " chunks wait for the next round";
  else if (failed) r.error = std::to_string(failed.load()) + " deletes failed: they wait for the next round";
  RETURN_IF_ERROR(close_round());
  return r;
}

}  // namespace ckptfs
