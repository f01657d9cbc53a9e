#include "cache/packs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <unordered_set>

namespace ckptfs {

namespace {

// An index record: op ('+' or '-'), 7 bytes "CKPACK\0", the chunk id (16), offset (8), length
// (8), then the first 8 bytes of the XXH3-128 of those 40 bytes.
constexpr size_t kRecord = 48;
constexpr char kMagic[7] = {'C', 'K', 'P', 'A', 'C', 'K', 0};
constexpr const char* kPackExt = ".pack";
constexpr const char* kIndexExt = ".idx";

std::string Encode(char op, const ChunkId& id, uint64_t offset, uint64_t len) {
  uint8_t r[kRecord] = {};
  r[0] = static_cast<uint8_t>(op);
  std::memcpy(r + 1, kMagic, sizeof(kMagic));
  id.ToBytes(r + 8);
  std::memcpy(r + 24, &offset, 8);
  std::memcpy(r + 32, &len, 8);
  uint8_t check[16];
  ChunkId::Of(r, 40).ToBytes(check);
  std::memcpy(r + 40, check, 8);
  return std::string(reinterpret_cast<const char*>(r), kRecord);
}

// False for a torn or damaged record.
bool Decode(const uint8_t* r, char* op, Packs::Entry* e) {
  uint8_t check[16];
  ChunkId::Of(r, 40).ToBytes(check);
  if (std::memcmp(r + 40, check, 8) != 0 || std::memcmp(r + 1, kMagic, sizeof(kMagic)) != 0 ||
      (r[0] != '+' && r[0] != '-')) {
    return false;
  }
  *op = static_cast<char>(r[0]);
  e->id = ChunkId::FromBytes(r + 8);
  std::memcpy(&e->offset, r + 24, 8);
  std::memcpy(&e->len, r + 32, 8);
  return true;
}

bool EndsWith(const std::string& s, const char* ext) {
  const size_t n = std::strlen(ext);
  return s.size() > n && s.compare(s.size() - n, n, ext) == 0;
}

// The whole of a file; an error when it cannot be read.
Result<std::string> ReadAll(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// An index's live extents (records applied in order), and how many bytes of it parse.
std::unordered_map<ChunkId, Packs::Entry, ChunkIdHash> Parse(const std::string& bytes,
                                                             size_t* good) {
  std::unordered_map<ChunkId, Packs::Entry, ChunkIdHash> live;
  size_t at = 0;
  for (; at + kRecord <= bytes.size(); at += kRecord) {
    char op;
    Packs::Entry e;
    if (!Decode(reinterpret_cast<const uint8_t*>(bytes.data() + at), &op, &e)) break;
    if (op == '+') {
      live[e.id] = e;
    } else {
      live.erase(e.id);
    }
  }
  *good = at;
  return live;
}

// Whether any two of `ranges` overlap.
bool AnyOverlap(std::vector<Packs::Range> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Packs::Range& a, const Packs::Range& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].offset + ranges[i - 1].len > ranges[i].offset) return true;
  }
  return false;
}

Status FsyncPath(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  const int rc = dir ? ::fsync(fd) : ::fdatasync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno(err, "sync " + path);
  return Status::Ok();
}

std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

}  // namespace

Result<std::unique_ptr<Packs>> Packs::Open(const std::string& dir, Logger log) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir " + dir);
  }
  std::unique_ptr<Packs> p(new Packs(dir, std::move(log)));
  RETURN_IF_ERROR(p->Load());
  return p;
}

Status Packs::Load() {
  MutexLock lock(&mu_);
  std::set<std::string> pack_files, index_files;
  for (const std::string& n : ListNames(dir_)) {
    if (EndsWith(n, kPackExt)) pack_files.insert(n.substr(0, n.size() - std::strlen(kPackExt)));
    if (EndsWith(n, kIndexExt)) index_files.insert(n.substr(0, n.size() - std::strlen(kIndexExt)));
  }
  uint64_t dropped = 0;
  for (const std::string& name : index_files) {
    struct stat st;
    if (::stat(PackPath(name).c_str(), &st) != 0) {
      if (errno != ENOENT) return Status::FromErrno(errno, "stat " + PackPath(name));
      log_->warn("pack {} is gone: its index goes, and the chunks it held are lost here", name);
      ::unlink(IndexPath(name).c_str());
      continue;
    }
    ASSIGN_OR_RETURN(std::string bytes, ReadAll(IndexPath(name)));
    size_t good = 0;
    auto live = Parse(bytes, &good);
    if (good != bytes.size()) {
      // A record torn by a crash (or damaged): the index ends before it.
      log_->warn("pack {}: its index is cut at byte {} of {} (a torn record)", name, good,
                 bytes.size());
      if (::truncate(IndexPath(name).c_str(), static_cast<off_t>(good)) != 0) {
        return Status::FromErrno(errno, "truncate " + IndexPath(name));
      }
    }
    const uint32_t pack = next_pack_++;
    packs_[pack] = Pack{name, 0};
    by_name_[name] = pack;
    std::string drops;
    std::vector<Range> kept;
    for (const auto& [id, e] : live) {
      // Past the end of a pack cut short by a crash, or an extent some other pack holds too.
      if (e.offset + e.len > static_cast<uint64_t>(st.st_size) || extents_.count(id)) {
        drops += Encode('-', id, e.offset, e.len);
        ++dropped;
        continue;
      }
      extents_[id] = Loc{pack, e.offset, e.len};
      ++packs_[pack].live;
      packs_[pack].bytes += e.len;
      kept.push_back(Range{e.offset, e.len});
    }
    packs_[pack].overlapping = AnyOverlap(kept);
    // Synced: PunchUnused below may punch the ranges these records drop.
    if (!drops.empty()) RETURN_IF_ERROR(Append(name, drops, true));
    if (packs_[pack].live == 0) {
      ++packs_[pack].live;
      Release(pack);  // unlinks it
      continue;
    }
    packs_[pack].shrunk = true;  // SparsePacks looks at it once
    if (Status st = PunchUnused(name, std::move(kept)); !st.ok()) {
      log_->warn("pack {}: {}", name, st.ToString());
    }
  }
  for (const std::string& name : pack_files) {
    if (index_files.count(name)) continue;
    // Linked by a seal that died before it recorded anything: not a chunk's home.
    ::unlink(PackPath(name).c_str());
  }
  if (dropped) log_->warn("{} extents of packs cut short by a crash are dropped", dropped);
  return Status::Ok();
}

std::unordered_map<ChunkId, std::pair<std::string, Packs::Entry>, ChunkIdHash> Packs::Scan(
    const std::string& dir) {
  std::unordered_map<ChunkId, std::pair<std::string, Entry>, ChunkIdHash> out;
  for (const std::string& n : ListNames(dir)) {
    if (!EndsWith(n, kIndexExt)) continue;
    auto bytes = ReadAll(dir + "/" + n);
    if (!bytes.ok()) continue;
    size_t good = 0;
    const std::string pack = dir + "/" + n.substr(0, n.size() - std::strlen(kIndexExt)) + kPackExt;
    for (const auto& [id, e] : Parse(*bytes, &good)) out.emplace(id, std::make_pair(pack, e));
  }
  return out;
}

Status Packs::Append(const std::string& name, const std::string& records, bool sync) {
  const std::string path = IndexPath(name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "fstat " + path);
  }
  size_t done = 0;
  int err = 0;
  while (done < records.size()) {
    const ssize_t n = ::write(fd, records.data() + done, records.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && sync) {
    index_syncs_.fetch_add(1, std::memory_order_relaxed);
    if (::fdatasync(fd) != 0) err = errno;
  }
  // A write cut short (a full disk fills the index's last block, then fails) must not leave a
  // partial record: the records appended after it would be read from the wrong offset, and Open
  // cuts the index there, bringing back extents dropped (and punched) since. The index goes
  // back to what it said before; a crash meanwhile leaves the partial record at its end.
  if (err != 0 && ::ftruncate(fd, st.st_size) != 0) {
    log_->error("pack index {}: cannot cut back a failed append: {}", path, std::strerror(errno));
  }
  ::close(fd);
  if (err != 0) return Status::FromErrno(err, "append to " + path);
  return Status::Ok();
}

bool Packs::Alone(const std::string& name) const {
  struct stat st;
  return ::stat(PackPath(name).c_str(), &st) == 0 && st.st_nlink == 1;
}

void Packs::Release(uint32_t pack) {
  auto it = packs_.find(pack);
  if (it == packs_.end() || --it->second.live > 0 || it->second.appending) return;
  ::unlink(IndexPath(it->second.name).c_str());
  ::unlink(PackPath(it->second.name).c_str());
  by_name_.erase(it->second.name);
  packs_.erase(it);
}

Result<std::vector<size_t>> Packs::Adopt(const std::string& src, const std::string& name,
                                         const std::vector<Entry>& entries) {
  MutexLock lock(&mu_);
  std::vector<size_t> skipped;
  std::string records;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (extents_.count(entries[i].id)) {
      skipped.push_back(i);
    } else {
      records += Encode('+', entries[i].id, entries[i].offset, entries[i].len);
    }
  }
  if (records.empty()) return skipped;
  const std::string path = PackPath(name);
  bool made = false;
  if (::link(src.c_str(), path.c_str()) == 0) {
    made = true;
  } else {
    // A link made before a crash, or by a seal of the same staging file that did not commit.
    const int err = errno;
    struct stat a, b;
    if (err != EEXIST || ::stat(src.c_str(), &a) != 0 || ::stat(path.c_str(), &b) != 0 ||
        a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
      return Status::FromErrno(err, "link " + src + " to " + path);
    }
  }
  if (Status st = Append(name, records, false); !st.ok()) {
    if (made && !by_name_.count(name)) {
      ::unlink(path.c_str());
      ::unlink(IndexPath(name).c_str());
    }
    return st;
  }
  auto [it, fresh] = by_name_.emplace(name, next_pack_);
  if (fresh) packs_[next_pack_++] = Pack{name, 0};
  Pack& p = packs_[it->second];
  if (!fresh && !p.overlapping) {
    // Sealed again: cut otherwise (other chunking options), its new extents may overlap those
    // that stayed.
    std::vector<Range> ranges;
    for (const auto& [id, loc] : extents_) {
      if (loc.pack == it->second) ranges.push_back(Range{loc.offset, loc.len});
    }
    for (size_t i = 0, s = 0; i < entries.size(); ++i) {
      if (s < skipped.size() && skipped[s] == i) {
        ++s;
      } else {
        ranges.push_back(Range{entries[i].offset, entries[i].len});
      }
    }
    p.overlapping = AnyOverlap(std::move(ranges));
  }
  for (size_t i = 0, s = 0; i < entries.size(); ++i) {
    if (s < skipped.size() && skipped[s] == i) {
      ++s;
      continue;
    }
    extents_[entries[i].id] = Loc{it->second, entries[i].offset, entries[i].len};
    ++p.live;
    p.bytes += entries[i].len;
  }
  return skipped;
}

Status Packs::PunchRanges(const std::string& name, const std::vector<Range>& ranges) {
  const std::string path = PackPath(name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::Ok() : Status::FromErrno(errno, "open " + path);
  struct stat st;
  const uint64_t block = ::fstat(fd, &st) == 0 && st.st_blksize > 0 ? st.st_blksize : 4096;
  Status out;
  for (const Range& r : ranges) {
    // Whole blocks only: a partial one would be zeroed in place (written), and its other bytes
    // may be a live neighbour's.
    const uint64_t begin = (r.offset + block - 1) / block * block;
    const uint64_t end = (r.offset + r.len) / block * block;
    if (end <= begin) continue;
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin),
                    static_cast<off_t>(end - begin)) != 0) {
      if (errno == EOPNOTSUPP) break;  // the room stays taken until the pack goes
      out = Status::FromErrno(errno, "punch a hole in " + path);
      break;
    }
  }
  ::close(fd);
  return out;
}

Status Packs::Punch(const std::string& name, const std::vector<Range>& ranges) {
  if (ranges.empty()) return Status::Ok();
  MutexLock lock(&mu_);
  if (!Alone(name)) return Status::Ok();
  // Never a live extent's bytes: a staging file sealed again (after a seal that adopted it and
  // did not commit, its chunks named meanwhile by another file) finds its own extents stored.
  auto pack = by_name_.find(name);
  std::vector<Range> live, safe;
  if (pack != by_name_.end()) {
    for (const auto& [id, loc] : extents_) {
      if (loc.pack == pack->second) live.push_back(Range{loc.offset, loc.len});
    }
  }
  std::sort(live.begin(), live.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  for (const Range& r : ranges) {
    // The first live extent ending after r begins; r is safe unless it starts before r ends.
    auto it = std::lower_bound(live.begin(), live.end(), r.offset,
                               [](const Range& e, uint64_t at) { return e.offset + e.len <= at; });
    if (it == live.end() || it->offset >= r.offset + r.len) safe.push_back(r);
  }
  if (safe.empty()) return Status::Ok();
  // A '-' record appended without a sync (its pack then had another name) is made durable
  // first: after a power loss no dropped extent may come back over a range punched here.
  index_syncs_.fetch_add(1, std::memory_order_relaxed);
  if (Status st = FsyncPath(IndexPath(name), false); !st.ok() && st.code() != Code::kNotFound) {
    return st;
  }
  return PunchRanges(name, safe);
}

bool Packs::Contains(const ChunkId& id) const {
  MutexLock lock(&mu_);
  return extents_.count(id) > 0;
}

bool Packs::Holds(const std::string& name, const Entry& e) const {
  MutexLock lock(&mu_);
  auto pack = by_name_.find(name);
  if (pack == by_name_.end()) return false;
  auto it = extents_.find(e.id);
  return it != extents_.end() && it->second.pack == pack->second && it->second.offset == e.offset;
}

std::optional<uint64_t> Packs::Len(const ChunkId& id) const {
  MutexLock lock(&mu_);
  auto it = extents_.find(id);
  if (it == extents_.end()) return std::nullopt;
  return it->second.len;
}

size_t Packs::packs() const {
  MutexLock lock(&mu_);
  return packs_.size();
}

std::optional<std::pair<std::string, Packs::Entry>> Packs::Locate(const ChunkId& id) const {
  MutexLock lock(&mu_);
  auto it = extents_.find(id);
  if (it == extents_.end()) return std::nullopt;
  return std::make_pair(PackPath(packs_.at(it->second.pack).name),
                        Entry{id, it->second.offset, it->second.len});
}

Status Packs::Drop(const ChunkId& id, const std::optional<std::pair<std::string, Entry>>& at) {
  MutexLock lock(&mu_);
  auto it = extents_.find(id);
  if (it == extents_.end()) return Status::Ok();
  const Loc loc = it->second;
  const std::string name = packs_.at(loc.pack).name;
  if (at && (at->first != PackPath(name) || at->second.offset != loc.offset)) {
    return Status::Ok();  // dropped and stored anew elsewhere meanwhile: that extent stays
  }
  const bool alone = Alone(name) && !packs_.at(loc.pack).overlapping;
  // Synced before the punch: no crash may leave the extent recorded over a hole.
  RETURN_IF_ERROR(Append(name, Encode('-', id, loc.offset, loc.len), alone));
  if (alone) {
    if (Status st = PunchRanges(name, {Range{loc.offset, loc.len}}); !st.ok()) {
      log_->warn("pack {}: {}", name, st.ToString());
    }
  }
  extents_.erase(it);
  packs_.at(loc.pack).bytes -= loc.len;
  packs_.at(loc.pack).shrunk = true;
  Release(loc.pack);
  return Status::Ok();
}

Status Packs::Sync(const std::vector<ChunkId>& ids) {
  std::set<std::string> names;
  {
    MutexLock lock(&mu_);
    for (const ChunkId& id : ids) {
      auto it = extents_.find(id);
      if (it != extents_.end()) names.insert(packs_.at(it->second.pack).name);
    }
  }
  if (names.empty()) return Status::Ok();
  for (const std::string& name : names) {
    RETURN_IF_ERROR(FsyncPath(PackPath(name), false));
    RETURN_IF_ERROR(FsyncPath(IndexPath(name), false));
  }
  return FsyncPath(dir_, true);  // their names
}

void Packs::ForEach(const std::function<void(const ChunkId&, uint64_t len)>& fn) const {
  std::vector<std::pair<ChunkId, uint64_t>> all;
  {
    MutexLock lock(&mu_);
    all.reserve(extents_.size());
    for (const auto& [id, loc] : extents_) all.emplace_back(id, loc.len);
  }
  for (const auto& [id, len] : all) fn(id, len);
}

Status Packs::DropExtents(const std::vector<std::pair<ChunkId, Loc>>& extents) {
  std::map<uint32_t, std::vector<std::pair<ChunkId, Loc>>> by_pack;
  for (const auto& e : extents) by_pack[e.second.pack].push_back(e);
  Status out;
  for (auto& [pack, list] : by_pack) {
    const std::string name = packs_.at(pack).name;
    // Not where extents overlap: a dropped one's range may hold another's bytes (Drop).
    const bool alone = Alone(name) && !packs_.at(pack).overlapping;
    std::string records;
    std::vector<Range> ranges;
    for (const auto& [id, loc] : list) {
      records += Encode('-', id, loc.offset, loc.len);
      ranges.push_back(Range{loc.offset, loc.len});
    }
    // One sync for them all, before any range goes: no crash may leave an extent over a hole.
    if (Status st = Append(name, records, alone); !st.ok()) {
      if (out.ok()) out = st;
      continue;
    }
    if (alone) {
      // Neighbours dropped together are punched as one range: the block they share goes too.
      std::sort(ranges.begin(), ranges.end(),
                [](const Range& a, const Range& b) { return a.offset < b.offset; });
      std::vector<Range> joined;
      for (const Range& r : ranges) {
        if (!joined.empty() && joined.back().offset + joined.back().len == r.offset) {
          joined.back().len += r.len;
        } else {
          joined.push_back(r);
        }
      }
      if (Status st = PunchRanges(name, joined); !st.ok())
        log_->warn("pack {}: {}", name, st.ToString());
    }
    Pack& p = packs_.at(pack);
    p.shrunk = true;
    for (const auto& [id, loc] : list) p.bytes -= loc.len;
    for (const auto& [id, loc] : list) {
      extents_.erase(id);
      Release(pack);  // the last one may take the pack (and p) with it
    }
  }
  return out;
}

Status Packs::DropMany(const std::vector<ChunkId>& ids) {
  MutexLock lock(&mu_);
  std::vector<std::pair<ChunkId, Loc>> found;
  std::unordered_set<ChunkId, ChunkIdHash> seen;
  for (const ChunkId& id : ids) {
    auto it = extents_.find(id);
    if (it != extents_.end() && seen.insert(id).second) found.emplace_back(id, it->second);
  }
  return DropExtents(found);
}

Status Packs::DropMoved(const std::string& name, const std::vector<Entry>& moved) {
  MutexLock lock(&mu_);
  auto pack = by_name_.find(name);
  if (pack == by_name_.end()) return Status::Ok();
  std::vector<std::pair<ChunkId, Loc>> found;
  std::unordered_set<ChunkId, ChunkIdHash> seen;
  for (const Entry& e : moved) {
    auto it = extents_.find(e.id);
    // Dropped meanwhile (and maybe stored anew elsewhere): nothing of it to drop here.
    if (it == extents_.end() || it->second.pack != pack->second || it->second.offset != e.offset) {
      continue;
    }
    if (seen.insert(e.id).second) found.emplace_back(e.id, it->second);
  }
  return DropExtents(found);
}

std::vector<Packs::Sparse> Packs::SparsePacks(size_t max) {
  MutexLock lock(&mu_);
  std::vector<Sparse> out;
  std::unordered_map<uint32_t, size_t> at;
  for (auto& [pack, p] : packs_) {
    if (out.size() >= max) break;
    if (!p.shrunk || p.appending) continue;  // one still appended to is looked at once ended
    struct stat st;
    if (::stat(PackPath(p.name).c_str(), &st) != 0) continue;
    // One that still has another name (its staging file) is looked at again later.
    if (st.st_nlink != 1) continue;
    if (p.bytes >= static_cast<uint64_t>(st.st_size) / 4) {
      p.shrunk = false;  // dense: until it loses another extent
      continue;
    }
    at[pack] = out.size();
    out.push_back(Sparse{p.name, {}});
  }
  if (out.empty()) return out;
  for (const auto& [id, loc] : extents_) {
    auto it = at.find(loc.pack);
    if (it != at.end()) out[it->second].extents.push_back(Entry{id, loc.offset, loc.len});
  }
  for (Sparse& s : out) {
    std::sort(s.extents.begin(), s.extents.end(),
              [](const Entry& a, const Entry& b) { return a.offset < b.offset; });
  }
  return out;
}

Status Packs::PunchUnused(const std::string& name, std::vector<Range> live) {
  if (!Alone(name)) return Status::Ok();  // its staging file's bytes may be a staged version's
  const std::string path = PackPath(name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "stat " + path);
  }
  std::sort(live.begin(), live.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  // The gaps between live extents (their union: none overlaps a live byte), then within each
  // the parts with data (SEEK_DATA/SEEK_HOLE: what is a hole already is not asked again).
  std::vector<Range> gaps, unused;
  uint64_t covered = 0;
  for (const Range& r : live) {
    if (r.offset > covered) gaps.push_back(Range{covered, r.offset - covered});
    covered = std::max(covered, r.offset + r.len);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  const uint64_t block = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize) : 4096;
  if (size > covered) gaps.push_back(Range{covered, size - covered});
  for (const Range& g : gaps) {
    for (uint64_t at = g.offset; at < g.offset + g.len;) {
      const off_t data = ::lseek(fd, static_cast<off_t>(at), SEEK_DATA);
      if (data < 0) break;  // ENXIO: no data after `at`; EINVAL: no SEEK_DATA here
      const auto begin = static_cast<uint64_t>(data);
      if (begin >= g.offset + g.len) break;
      const off_t hole = ::lseek(fd, data, SEEK_HOLE);
      const uint64_t end =
          std::min(g.offset + g.len, hole < 0 ? size : static_cast<uint64_t>(hole));
      if (end <= begin) break;
      // Its whole blocks only (as PunchRanges keeps to): inside the gap, so no live byte.
      const uint64_t first = (begin + block - 1) / block * block, stop = end / block * block;
      if (stop > first) unused.push_back(Range{first, stop - first});
      at = end;
    }
  }
  ::close(fd);
  if (unused.empty()) return Status::Ok();
  uint64_t bytes = 0;
  for (const Range& r : unused) bytes += r.len;
  log_->info("pack {}: {} bytes no extent holds are punched (a seal stopped before its punch)",
             name, bytes);
  return PunchRanges(name, unused);
}

Status Packs::Check(const ChunkId& id) const {
  std::string path;
  uint64_t end = 0;
  {
    MutexLock lock(&mu_);
    auto it = extents_.find(id);
    if (it == extents_.end()) return NotFound("no chunk file and no extent in a pack");
    path = PackPath(packs_.at(it->second.pack).name);
    end = it->second.offset + it->second.len;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound("its pack " + path + " is missing");
    return Status::FromErrno(errno, "stat " + path);
  }
  if (static_cast<uint64_t>(st.st_size) < end) {
    return NotFound("its pack " + path + " is " + std::to_string(st.st_size) +
                    " bytes long, short of its extent's end at " + std::to_string(end));
  }
  return Status::Ok();
}

// Append packs (cache/append_pack.h).

Status Packs::StartAppend(const std::string& name) {
  MutexLock lock(&mu_);
  if (by_name_.count(name)) return Status(Code::kExists, "pack " + name + " exists");
  by_name_[name] = next_pack_;
  Pack& p = packs_[next_pack_++];
  p.name = name;
  p.appending = true;
  return Status::Ok();
}

Result<bool> Packs::Record(const std::string& name, const Entry& e) {
  MutexLock lock(&mu_);
  auto pack = by_name_.find(name);
  if (pack == by_name_.end() || !packs_.at(pack->second).appending) {
    return NotFound("pack " + name + " is not appended to");
  }
  if (extents_.count(e.id)) return false;
  // Not synced: SyncChunks makes it durable (after the pack's bytes) before a commit names it.
  RETURN_IF_ERROR(Append(name, Encode('+', e.id, e.offset, e.len), false));
  extents_[e.id] = Loc{pack->second, e.offset, e.len};
  unsure_.erase(e.id);  // a dropped extent's
  ++packs_.at(pack->second).live;
  packs_.at(pack->second).bytes += e.len;
  return true;
}

void Packs::EndAppend(const std::string& name) {
  MutexLock lock(&mu_);
  auto pack = by_name_.find(name);
  if (pack == by_name_.end()) return;
  Pack& p = packs_.at(pack->second);
  p.appending = false;
  ++p.live;
  Release(pack->second);  // the pack goes when it holds no extent
}

bool Packs::Appending(const std::string& name) const {
  MutexLock lock(&mu_);
  auto pack = by_name_.find(name);
  return pack != by_name_.end() && packs_.at(pack->second).appending;
}

void Packs::Distrust() {
  MutexLock lock(&mu_);
  for (const auto& [id, loc] : extents_) unsure_.insert(id);
}

bool Packs::Sure(const ChunkId& id) const {
  MutexLock lock(&mu_);
  return !unsure_.count(id);
}

void Packs::Trust(const ChunkId& id) {
  MutexLock lock(&mu_);
  unsure_.erase(id);
}

}  // namespace ckptfs
