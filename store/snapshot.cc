#include "store/snapshot.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <utility>

#include "common/chunk_id.h"
#include "store/journal.h"
#include "store/remote_tier.h"
#include "store/summed_text.h"

namespace ckptfs {
namespace {

constexpr std::string_view kManifestMagic = "ckptfs-snapshot 1\n";
constexpr std::string_view kPartMagic = "ckptfs-snapshot-part 1\n";
constexpr std::string_view kManifestName = "manifest";
constexpr size_t kMaxParts = 1 << 20;
constexpr uint32_t kMaxVersion = 1024;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads a u32-length-prefixed field of at most `max` bytes at *at; false past the end.
bool TakeField(std::string_view b, size_t* at, uint32_t max, std::string* out) {
  if (b.size() - *at < 4) return false;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{static_cast<uint8_t>(b[*at + i])} << (8 * i);
  *at += 4;
  if (n > max || b.size() - *at < n) return false;
  out->assign(b.substr(*at, n));
  *at += n;
  return true;
}

bool ParseU64(std::string_view s, uint64_t* v) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t r = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (r > (UINT64_MAX - d) / 10) return false;
    r = r * 10 + d;
  }
  *v = r;
  return true;
}

// "snapshot/<20 digits>-<16 hex>/": J, or 0 when dir is no snapshot's directory.
bool ParseDir(std::string_view dir, uint64_t* journal) {
  if (dir.substr(0, NamespaceSnapshot::kPrefix.size()) != NamespaceSnapshot::kPrefix) return false;
  std::string_view rest = dir.substr(NamespaceSnapshot::kPrefix.size());
  if (rest.size() != 20 + 1 + 16 + 1 || rest[20] != '-' || rest.back() != '/') return false;
  for (char c : rest.substr(21, 16)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return ParseU64(rest.substr(0, 20), journal);
}

std::string NewDir(uint64_t journal) {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%020llu-%08x%08x/", static_cast<unsigned long long>(journal),
                rd(), rd());
  return std::string(NamespaceSnapshot::kPrefix) + buf;
}

// The snapshots in the bucket: directory -> whether its manifest is there, and its keys.
struct Listed {
  uint64_t journal = 0;
  bool complete = false;
  std::vector<std::string> keys;
};

Result<std::map<std::string, Listed>> ListSnapshots(Backend& b) {
  std::map<std::string, Listed> out;
  RETURN_IF_ERROR(b.List(std::string(NamespaceSnapshot::kPrefix), "", [&](const ObjectInfo& o) {
    const size_t slash = o.key.find('/', NamespaceSnapshot::kPrefix.size());
    if (slash == std::string::npos) return true;
    const std::string dir = o.key.substr(0, slash + 1);
    uint64_t journal = 0;
    if (!ParseDir(dir, &journal)) return true;
    Listed& l = out[dir];
    l.journal = journal;
    l.keys.push_back(o.key);
    if (o.key.substr(slash + 1) == kManifestName) l.complete = true;
    return true;
  }));
  return out;
}

// Newest first: by J, then by directory name (two snapshots of one J are equally good).
std::vector<std::pair<std::string, Listed>> NewestFirst(std::map<std::string, Listed> all) {
  std::vector<std::pair<std::string, Listed>> v(std::make_move_iterator(all.begin()),
                                                std::make_move_iterator(all.end()));
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second.journal != b.second.journal ? a.second.journal > b.second.journal
                                                : a.first > b.first;
  });
  return v;
}

}  // namespace

uint64_t NamespaceSnapshot::Manifest::entries() const {
  uint64_t n = 0;
  for (const Part& p : parts) n += p.count;
  return n;
}

std::string NamespaceSnapshot::ManifestKey(std::string_view dir) {
  return std::string(dir) + std::string(kManifestName);
}

std::string NamespaceSnapshot::EncodeManifest(const Manifest& m) {
  std::string body = std::string(kManifestMagic) + "journal=" + std::to_string(m.journal) + "\n";
  for (const Part& p : m.parts) {
    body += "part=" + p.key.substr(m.dir.size()) + " " + std::to_string(p.size) + " " +
            std::to_string(p.count) + " " + p.sum + "\n";
  }
  return WithSum(std::move(body));
}

Result<NamespaceSnapshot::Manifest> NamespaceSnapshot::DecodeManifest(std::string_view dir,
                                                                      std::string_view bytes) {
  const std::string where = "snapshot manifest " + ManifestKey(dir);
  std::string_view body = VerifiedBody(bytes, kManifestMagic);
  if (body.empty()) return Corrupt(where + ": its sum does not check");
  Manifest m;
  m.dir = std::string(dir);
  uint64_t dir_journal = 0;
  if (!ParseDir(dir, &dir_journal) || !ParseU64(TextField(body, "journal"), &m.journal) ||
      m.journal != dir_journal) {
    return Corrupt(where + ": its journal entry is not its directory's");
  }
  size_t at = kManifestMagic.size();
  while (at < body.size()) {
    size_t end = body.find('\n', at);
    if (end == std::string_view::npos) end = body.size();
    std::string_view line = body.substr(at, end - at);
    at = end + 1;
    if (line.rfind("part=", 0) != 0) continue;
    line.remove_prefix(5);
    // "<name> <size> <count> <sum>"
    std::vector<std::string_view> f;
    while (!line.empty() && f.size() < 5) {
      const size_t sp = line.find(' ');
      f.push_back(line.substr(0, sp));
      line = sp == std::string_view::npos ? std::string_view{} : line.substr(sp + 1);
    }
    Part p;
    if (f.size() != 4 || f[0].rfind("part-", 0) != 0 || f[0].size() > 32 ||
        f[0].find('/') != std::string_view::npos || !ParseU64(f[1], &p.size) ||
        !ParseU64(f[2], &p.count) || f[3].size() != 32 || p.size > kMaxPartBytes ||
        m.parts.size() >= kMaxParts) {
      return Corrupt(where + ": a part line does not parse");
    }
    p.key = std::string(dir) + std::string(f[0]);
    p.sum = std::string(f[3]);
    m.parts.push_back(std::move(p));
  }
  return m;
}

Result<std::optional<NamespaceSnapshot::Manifest>> NamespaceSnapshot::Newest(Backend& backend) {
  ASSIGN_OR_RETURN(auto all, ListSnapshots(backend));
  for (auto& [dir, l] : NewestFirst(std::move(all))) {
    if (!l.complete) continue;  // being written, or its writer died
    const std::string key = ManifestKey(dir);
    std::string bytes(kMaxManifestBytes + 1, '\0');
    auto n = backend.Get(key, 0, bytes.data(), bytes.size());
    if (!n.ok()) return n.status();
    if (*n > kMaxManifestBytes) return Corrupt("snapshot manifest " + key + " is oversized");
    bytes.resize(*n);
    ASSIGN_OR_RETURN(Manifest m, DecodeManifest(dir, bytes));
    return std::optional<Manifest>(std::move(m));
  }
  return std::optional<Manifest>();
}

Status NamespaceSnapshot::ReadPart(Backend& backend, const Part& p,
                                   const std::function<Status(Entry&&)>& fn) {
  if (p.size > kMaxPartBytes) return Corrupt("snapshot part " + p.key + " is oversized");
  std::string bytes(p.size, '\0');
  ASSIGN_OR_RETURN(size_t n, backend.GetExact(p.key, bytes.data(), bytes.size()));
  if (n != p.size) {
    return Corrupt("snapshot part " + p.key + ": " + std::to_string(n) +
                   " bytes, the manifest says " + std::to_string(p.size));
  }
  if (ChunkId::Of(bytes.data(), bytes.size()).Hex() != p.sum) {
    return Corrupt("snapshot part " + p.key + ": its sum does not check");
  }
  std::string_view b = bytes;
  if (b.rfind(kPartMagic, 0) != 0) return Corrupt("snapshot part " + p.key + ": no part");
  size_t at = kPartMagic.size();
  uint64_t count = 0;
  while (at < b.size()) {
    Entry e;
    if (!TakeField(b, &at, 1024, &e.key) || !TakeField(b, &at, kMaxVersion, &e.version) ||
        !TakeField(b, &at, static_cast<uint32_t>(kMaxPartBytes), &e.record) ||
        !(e.key.rfind("files/", 0) == 0 || e.key.rfind("dirs/", 0) == 0) ||
        !CheckKey(e.key).ok()) {
      return Corrupt("snapshot part " + p.key + ": entry " + std::to_string(count) +
                     " does not parse");
    }
    ++count;
    RETURN_IF_ERROR(fn(std::move(e)));
  }
  if (count != p.count) {
    return Corrupt("snapshot part " + p.key + ": " + std::to_string(count) +
                   " entries, the manifest says " + std::to_string(p.count));
  }
  return Status::Ok();
}

Result<NamespaceSnapshot::Written> NamespaceSnapshot::Write(Backend& backend,
                                                            const WriteOptions& opts) {
  // J first, the listing after it: every change whose entry is <= J put its record before the
  // entry was taken, so before this listing (docs/journal.md).
  NamespaceJournal journal(&backend, "snapshot");
  ASSIGN_OR_RETURN(uint64_t j, journal.Head());
  std::vector<std::pair<std::string, std::string>> keys;  // key, listed version
  for (const char* tree : {"dirs/", "files/"}) {
    RETURN_IF_ERROR(backend.List(tree, "", [&](const ObjectInfo& o) {
      keys.emplace_back(o.key, ListedVersion(o));
      return true;
    }));
  }
  Written w;
  w.manifest.journal = j;
  w.manifest.dir = NewDir(j);
  std::string part(kPartMagic);
  uint64_t in_part = 0;
  auto flush = [&]() -> Status {
    if (in_part == 0) return Status::Ok();
    char name[32];
    std::snprintf(name, sizeof name, "part-%06zu", w.manifest.parts.size());
    Part p{w.manifest.dir + name, part.size(), in_part,
           ChunkId::Of(part.data(), part.size()).Hex()};
    RETURN_IF_ERROR(backend.Put(p.key, part.data(), part.size()));
    w.bytes += part.size();
    w.manifest.parts.push_back(std::move(p));
    part.assign(kPartMagic);
    in_part = 0;
    return Status::Ok();
  };
  size_t done = 0;
  for (const auto& [key, version] : keys) {
    if (opts.progress && ++done % 1024 == 0) {
      opts.progress("snapshot: " + std::to_string(done) + " of " + std::to_string(keys.size()) +
                    " records read");
    }
    std::string record;
    if (key.rfind("files/", 0) == 0) {
      bool gone = false, good = false;
      Status last;
      for (int attempt = 0; attempt < 3 && !good && !gone; ++attempt) {
        auto bytes = backend.GetObject(key);
        if (!bytes.ok()) {
          gone = bytes.status().code() == Code::kNotFound;
          last = bytes.status();
          continue;
        }
        auto rec = FileRecord::Decode(*bytes);
        if (rec.ok()) {
          record = std::move(*bytes);
          good = true;
        } else {
          last = rec.status();
        }
      }
      if (gone) continue;  // deleted since the listing: its entry is after J
      if (!good) return Status(last.code(), key + ": " + last.message());
      ++w.files;
    } else {
      ++w.dirs;
    }
    if (key.size() > 1024 || version.size() > kMaxVersion || record.size() > kMaxPartBytes / 2) {
      return Invalid(key + ": too large for a snapshot");
    }
    PutU32(&part, static_cast<uint32_t>(key.size()));
    part += key;
    PutU32(&part, static_cast<uint32_t>(version.size()));
    part += version;
    PutU32(&part, static_cast<uint32_t>(record.size()));
    part += record;
    ++in_part;
    if (part.size() >= opts.part_bytes || part.size() >= kMaxPartBytes / 2) {
      RETURN_IF_ERROR(flush());
    }
  }
  RETURN_IF_ERROR(flush());
  // Last: a snapshot exists for readers only once its manifest does.
  const std::string manifest = EncodeManifest(w.manifest);
  RETURN_IF_ERROR(backend.Put(ManifestKey(w.manifest.dir), manifest.data(), manifest.size()));
  ASSIGN_OR_RETURN(w.pruned, Prune(backend, opts.keep));
  return w;
}

Result<uint64_t> NamespaceSnapshot::Prune(Backend& backend, size_t keep) {
  if (keep == 0) keep = 1;
  ASSIGN_OR_RETURN(auto all, ListSnapshots(backend));
  auto sorted = NewestFirst(std::move(all));
  size_t complete = 0;
  uint64_t deleted = 0;
  for (const auto& [dir, l] : sorted) {
    // Everything newer than the oldest snapshot kept stays, complete or not (a writer may be
    // putting its parts now); everything older goes, manifest first, so that no reader starts
    // on a snapshot whose parts are going.
    if (complete < keep) {
      complete += l.complete;
      continue;
    }
    if (l.complete) {
      RETURN_IF_ERROR(backend.Delete(ManifestKey(dir)));
      ++deleted;
    }
    for (const std::string& key : l.keys) {
      if (key == ManifestKey(dir)) continue;
      RETURN_IF_ERROR(backend.Delete(key));
      ++deleted;
    }
  }
  return deleted;
}

}  // namespace ckptfs
