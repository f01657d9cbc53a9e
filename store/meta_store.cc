#include "store/meta_store.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "store/meta_codec.h"

namespace ckptfs {
namespace {

// Inode records: version 1 has 12 fields, or 13 when written by the binaries that added data_bytes
// without a new version; version 2 has 13; version 3 has 14 (path_epoch).
constexpr uint8_t kInodeVersion = 3;
constexpr std::string_view kFormatKey = "format";
constexpr std::string_view kNextInoKey = "next_ino";

using meta_codec::GetU64;
using meta_codec::InoKey;
using meta_codec::LmdbError;
using meta_codec::PutU64;
using meta_codec::TierKey;

std::string NameKey(uint64_t ino, std::string_view name) {
  std::string k = InoKey(ino);
  k.append(name);
  return k;
}

MDB_val Val(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }
std::string_view View(const MDB_val& v) { return {static_cast<const char*>(v.mv_data), v.mv_size}; }

std::string EncodeInode(const InodeRecord& r) {
  std::string out;
  out.push_back(static_cast<char>(kInodeVersion));
  for (uint64_t v : {r.ino, uint64_t{r.mode}, uint64_t{r.uid}, uint64_t{r.gid}, uint64_t{r.nlink},
                     r.size, r.rdev, static_cast<uint64_t>(r.atime_ns),
                     static_cast<uint64_t>(r.mtime_ns), static_cast<uint64_t>(r.ctime_ns),
                     r.next_cookie, r.generation, r.data_bytes, r.path_epoch}) {
    PutU64(out, v);
  }
  return out;
}

Result<InodeRecord> DecodeInode(std::string_view b) {
  const size_t fields = b.empty() ? 0 : (b.size() - 1) / 8;
  const uint8_t version = b.empty() ? 0 : static_cast<uint8_t>(b[0]);
  if (version > kInodeVersion) {
    return Status(Code::kUnsupported, "inode record version " + std::to_string(version) +
                                          " is from a newer ckptfs (this binary reads up to " +
                                          std::to_string(kInodeVersion) + ")");
  }
  const bool known = (version == 1 && (fields == 12 || fields == 13)) ||
                     (version == 2 && fields == 13) || (version == 3 && fields == 14);
  if (!known || b.size() != 1 + fields * 8) return Corrupt("inode record is damaged");
  uint64_t f[14] = {};
  for (size_t i = 0; i < fields; ++i) f[i] = GetU64(b.data() + 1 + 8 * i);
  if (fields == 12) f[12] = f[5];
  InodeRecord r;
  r.ino = f[0];
  r.mode = static_cast<uint32_t>(f[1]);
  r.uid = static_cast<uint32_t>(f[2]);
  r.gid = static_cast<uint32_t>(f[3]);
  r.nlink = static_cast<uint32_t>(f[4]);
  r.size = f[5];
  r.rdev = f[6];
  r.atime_ns = static_cast<int64_t>(f[7]);
  r.mtime_ns = static_cast<int64_t>(f[8]);
  r.ctime_ns = static_cast<int64_t>(f[9]);
  r.next_cookie = f[10];
  r.generation = f[11];
  r.data_bytes = f[12];
  r.path_epoch = f[13];
  return r;
}

Result<ChunkRecord> DecodeChunk(const ChunkId& id, std::string_view v) {
  if (v.size() != 16 && v.size() != 17) return Corrupt("chunk record " + id.Hex() + " is damaged");
  return ChunkRecord{GetU64(v.data()), GetU64(v.data() + 8),
                     v.size() == 17 ? static_cast<uint8_t>(v[16]) : uint8_t{0}};
}

}  // namespace

Result<std::unique_ptr<MetaStore>> MetaStore::Open(const std::string& dir, uint64_t map_bytes,
                                                   bool read_only) {
  if (!read_only && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir " + dir);
  }
  std::unique_ptr<MetaStore> s(new MetaStore);
  int rc = mdb_env_create(&s->env_);
  if (rc) return LmdbError(rc, "mdb_env_create");
  mdb_env_set_maxdbs(s->env_, 32);
  mdb_env_set_maxreaders(s->env_, 1024);
  mdb_env_set_mapsize(s->env_, map_bytes);
  // NOTLS: FUSE worker threads come and go. NOMETASYNC: a commit syncs the data pages only; a
  // system crash may undo the last commit but never damages the database. Sync() flushes the
  // meta page for fsync(2).
  unsigned flags = MDB_NOTLS | MDB_NOMETASYNC | (read_only ? MDB_RDONLY : 0);
  rc = mdb_env_open(s->env_, dir.c_str(), flags, 0600);
  if (rc) return LmdbError(rc, "opening metadata in " + dir);

  MDB_txn* txn;
  rc = mdb_txn_begin(s->env_, nullptr, read_only ? MDB_RDONLY : 0, &txn);
  if (rc) return LmdbError(rc, "mdb_txn_begin");
  struct {
    const char* name;
    MDB_dbi* dbi;
  } tables[] = {{"inodes", &s->inodes_},       {"dentries", &s->dentries_},
                {"dircookies", &s->dircookies_}, {"manifests", &s->manifests_},
                {"symlinks", &s->symlinks_},   {"xattrs", &s->xattrs_},
                {"chunks", &s->chunks_},       {"orphans", &s->orphans_},
                {"meta", &s->meta_}};
  for (auto& t : tables) {
    rc = mdb_dbi_open(txn, t.name, read_only ? 0 : MDB_CREATE, t.dbi);
    if (rc) {
      mdb_txn_abort(txn);
      return LmdbError(rc, std::string("opening table ") + t.name);
    }
  }
  s->has_remote_tables_ = true;
  auto open_new = [&](const std::string& name, MDB_dbi* dbi, bool* present) -> Status {
    rc = mdb_dbi_open(txn, name.c_str(), read_only ? 0 : MDB_CREATE, dbi);
    if (rc == MDB_NOTFOUND && read_only) {
      *present = false;
      return Status::Ok();
    }
    if (rc) {
      mdb_txn_abort(txn);
      return LmdbError(rc, "opening table " + name);
    }
    *present = true;
    return Status::Ok();
  };
  for (auto& t : std::initializer_list<std::pair<const char*, MDB_dbi*>>{
           {"parents", &s->parents_}, {"staged", &s->staged_}}) {
    bool present = false;
    RETURN_IF_ERROR(open_new(t.first, t.second, &present));
    if (!present) s->has_remote_tables_ = false;
  }
  {
    bool present = false;
    RETURN_IF_ERROR(open_new("fallbacks", &s->fallbacks_, &present));
    s->has_fallbacks_ = present;
  }
  for (int tier = 0; tier < kMaxTiers; ++tier) {
    bool ops = false, published = false;
    RETURN_IF_ERROR(open_new(TierKey("remote_ops", tier), &s->remote_ops_[tier], &ops));
    RETURN_IF_ERROR(open_new(TierKey("published", tier), &s->published_[tier], &published));
    s->has_tier_tables_[tier] = ops && published;
  }
  // The store's format: refused when newer than this binary, raised when older (every older
  // format is read as it is).
  MDB_val key = Val(kFormatKey), val;
  rc = mdb_get(txn, s->meta_, &key, &val);
  if (rc != 0 && rc != MDB_NOTFOUND) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "reading the store's format");
  }
  uint64_t format = 1;  // stores made before the format was recorded
  if (rc == 0) {
    if (val.mv_size != 8) {
      mdb_txn_abort(txn);
      return Corrupt("the store's format record in " + dir + " is damaged");
    }
    format = GetU64(static_cast<const char*>(val.mv_data));
  }
  if (format > kStoreFormat) {
    mdb_txn_abort(txn);
    return Status(Code::kUnsupported,
                  "the metadata in " + dir + " was written by ckptfs format " +
                      std::to_string(format) + "; this binary reads up to format " +
                      std::to_string(kStoreFormat) + " (use a newer ckptfs)");
  }
  s->format_ = format;
  if (!read_only && format < kStoreFormat) {
    std::string v;
    PutU64(v, kStoreFormat);
    MDB_val nv = Val(v);
    rc = mdb_put(txn, s->meta_, &key, &nv, 0);
    if (rc) {
      mdb_txn_abort(txn);
      return LmdbError(rc, "recording the store's format");
    }
    s->format_ = kStoreFormat;
  }
  rc = mdb_txn_commit(txn);
  if (rc) return LmdbError(rc, "mdb_txn_commit");
  return s;
}

MetaStore::~MetaStore() {
  if (env_) mdb_env_close(env_);
}

Result<MetaStore::Txn> MetaStore::Begin(bool write) {
  MDB_txn* txn;
  int rc = mdb_txn_begin(env_, nullptr, write ? 0 : MDB_RDONLY, &txn);
  if (rc) return LmdbError(rc, "mdb_txn_begin");
  return Txn(txn, this);
}

Status MetaStore::Sync() {
  int rc = mdb_env_sync(env_, 1);
  if (rc) return LmdbError(rc, "mdb_env_sync");
  return Status::Ok();
}

Status MetaStore::Txn::Commit() {
  int rc = mdb_txn_commit(txn_);
  txn_ = nullptr;
  if (rc) return LmdbError(rc, "mdb_txn_commit");
  return Status::Ok();
}

void MetaStore::Txn::Abort() {
  if (txn_) mdb_txn_abort(txn_);
  txn_ = nullptr;
}

Result<std::optional<std::string_view>> MetaStore::Txn::Get(MDB_dbi dbi, std::string_view key) {
  MDB_val k = Val(key), v;
  int rc = mdb_get(txn_, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return std::optional<std::string_view>();
  if (rc) return LmdbError(rc, "mdb_get");
  return std::optional<std::string_view>(View(v));
}

Status MetaStore::Txn::Put(MDB_dbi dbi, std::string_view key, std::string_view value) {
  MDB_val k = Val(key), v = Val(value);
  int rc = mdb_put(txn_, dbi, &k, &v, 0);
  if (rc) return LmdbError(rc, "mdb_put");
  return Status::Ok();
}

Status MetaStore::Txn::Del(MDB_dbi dbi, std::string_view key, bool missing_ok) {
  MDB_val k = Val(key);
  int rc = mdb_del(txn_, dbi, &k, nullptr);
  if (rc == MDB_NOTFOUND) return missing_ok ? Status::Ok() : NotFound("no such key");
  if (rc) return LmdbError(rc, "mdb_del");
  return Status::Ok();
}

Status MetaStore::Txn::Scan(MDB_dbi dbi, std::string_view prefix, std::string_view start,
                            const std::function<bool(std::string_view, std::string_view)>& fn) {
  MDB_cursor* cur;
  int rc = mdb_cursor_open(txn_, dbi, &cur);
  if (rc) return LmdbError(rc, "mdb_cursor_open");
  MDB_val k = Val(start.empty() ? prefix : start), v;
  rc = k.mv_size ? mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE) : mdb_cursor_get(cur, &k, &v, MDB_FIRST);
  while (rc == 0) {
    std::string_view key = View(k);
    if (key.substr(0, prefix.size()) != prefix) break;
    if (!fn(key, View(v))) break;
    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(cur);
  if (rc != 0 && rc != MDB_NOTFOUND) return LmdbError(rc, "mdb_cursor_get");
  return Status::Ok();
}

Result<InodeRecord> MetaStore::Txn::GetInode(uint64_t ino) {
  ASSIGN_OR_RETURN(auto v, Get(store_->inodes_, InoKey(ino)));
  if (!v) return NotFound("inode " + std::to_string(ino));
  return DecodeInode(*v);
}

Status MetaStore::Txn::PutInode(const InodeRecord& rec) {
  return Put(store_->inodes_, InoKey(rec.ino), EncodeInode(rec));
}

Status MetaStore::Txn::DelInode(uint64_t ino) { return Del(store_->inodes_, InoKey(ino), true); }

Result<uint64_t> MetaStore::Txn::AllocIno() {
  ASSIGN_OR_RETURN(auto v, Get(store_->meta_, kNextInoKey));
  uint64_t next = (v && v->size() == 8) ? GetU64(v->data()) : kRootIno + 1;
  std::string nv;
  PutU64(nv, next + 1);
  RETURN_IF_ERROR(Put(store_->meta_, kNextInoKey, nv));
  return next;
}

Result<DirEntry> MetaStore::Txn::GetEntry(uint64_t parent, std::string_view name) {
  ASSIGN_OR_RETURN(auto v, Get(store_->dentries_, NameKey(parent, name)));
  if (!v) return NotFound(std::string(name));
  if (v->size() != 20) return Corrupt("directory entry is damaged");
  DirEntry e;
  e.ino = GetU64(v->data());
  e.cookie = GetU64(v->data() + 8);
  std::memcpy(&e.mode, v->data() + 16, 4);
  return e;
}

Status MetaStore::Txn::PutEntry(InodeRecord& parent_rec, std::string_view name, uint64_t ino,
                                uint32_t mode) {
  auto old = GetEntry(parent_rec.ino, name);
  uint64_t cookie;
  if (old.ok()) {
    cookie = old->cookie;
  } else if (old.status().code() == Code::kNotFound) {
    cookie = parent_rec.next_cookie++;
    std::string ck = InoKey(parent_rec.ino);
    PutU64(ck, cookie);
    RETURN_IF_ERROR(Put(store_->dircookies_, ck, name));
  } else {
    return old.status();
  }
  std::string v;
  PutU64(v, ino);
  PutU64(v, cookie);
  uint32_t type = mode & S_IFMT;
  v.append(reinterpret_cast<const char*>(&type), 4);
  RETURN_IF_ERROR(Put(store_->dentries_, NameKey(parent_rec.ino, name), v));
  if (old.ok() && old->ino != ino) RETURN_IF_ERROR(DropParent(old->ino, parent_rec.ino, name));
  return Put(store_->parents_, InoKey(ino), NameKey(parent_rec.ino, name));
}

Status MetaStore::Txn::DropParent(uint64_t ino, uint64_t parent, std::string_view name) {
  ASSIGN_OR_RETURN(auto v, Get(store_->parents_, InoKey(ino)));
  if (v && *v == NameKey(parent, name)) return Del(store_->parents_, InoKey(ino), true);
  return Status::Ok();
}

Result<std::pair<uint64_t, std::string>> MetaStore::Txn::GetParent(uint64_t ino) {
  if (!store_->has_remote_tables_) return NotFound("no parent table");
  ASSIGN_OR_RETURN(auto v, Get(store_->parents_, InoKey(ino)));
  if (!v) return NotFound("no parent of inode " + std::to_string(ino));
  if (v->size() < 8) return Corrupt("parent record is damaged");
  return std::make_pair(GetU64(v->data()), std::string(v->substr(8)));
}

Status MetaStore::Txn::BackfillParents() {
  constexpr std::string_view kDone = "parents_v1";
  ASSIGN_OR_RETURN(auto done, Get(store_->meta_, kDone));
  if (done) return Status::Ok();
  std::vector<std::pair<std::string, std::string>> links;  // child key -> parent key + name
  RETURN_IF_ERROR(Scan(store_->dentries_, {}, {}, [&](std::string_view k, std::string_view v) {
    if (k.size() > 8 && v.size() == 20) links.emplace_back(std::string(v.substr(0, 8)), k);
    return true;
  }));
  for (const auto& [child, link] : links) RETURN_IF_ERROR(Put(store_->parents_, child, link));
  return Put(store_->meta_, kDone, "1");
}

Result<std::string> MetaStore::Txn::PathOf(uint64_t ino) {
  std::string path;
  for (int depth = 0; ino != kRootIno; ++depth) {
    if (depth > 4096) return Corrupt("a directory loop above inode " + std::to_string(ino));
    ASSIGN_OR_RETURN(auto p, GetParent(ino));
    path = path.empty() ? p.second : p.second + "/" + path;
    ino = p.first;
  }
  return path;
}

Status MetaStore::Txn::DelEntry(uint64_t parent, std::string_view name) {
  ASSIGN_OR_RETURN(DirEntry e, GetEntry(parent, name));
  std::string ck = InoKey(parent);
  PutU64(ck, e.cookie);
  RETURN_IF_ERROR(Del(store_->dircookies_, ck, true));
  RETURN_IF_ERROR(DropParent(e.ino, parent, name));
  return Del(store_->dentries_, NameKey(parent, name), false);
}

bool MetaStore::Txn::DirEmpty(uint64_t dir) {
  bool empty = true;
  Status st = Scan(store_->dircookies_, InoKey(dir), {}, [&](std::string_view, std::string_view) {
    empty = false;
    return false;
  });
  return st.ok() && empty;
}

Status MetaStore::Txn::ListDir(uint64_t dir, uint64_t after,
                               const std::function<bool(std::string_view, const DirEntry&)>& fn) {
  std::string prefix = InoKey(dir);
  std::string start = prefix;
  PutU64(start, after + 1);
  Status inner;
  RETURN_IF_ERROR(Scan(store_->dircookies_, prefix, start, [&](std::string_view, std::string_view name) {
    auto e = GetEntry(dir, name);
    if (!e.ok()) {
      inner = e.status();
      return false;
    }
    return fn(name, *e);
  }));
  return inner;
}

Status MetaStore::Txn::WalkTree(uint64_t dir, bool recursive,
                                const std::function<Status(const DirEntry&)>& fn) {
  std::deque<uint64_t> dirs{dir};
  while (!dirs.empty()) {
    const uint64_t d = dirs.front();
    dirs.pop_front();
    std::vector<DirEntry> entries;  // not called back inside the cursor: fn may read the txn
    RETURN_IF_ERROR(ListDir(d, 0, [&](std::string_view, const DirEntry& e) {
      entries.push_back(e);
      return true;
    }));
    for (const DirEntry& e : entries) {
      if (recursive && S_ISDIR(e.mode)) dirs.push_back(e.ino);
      RETURN_IF_ERROR(fn(e));
    }
  }
  return Status::Ok();
}

Result<std::optional<Manifest>> MetaStore::Txn::GetManifest(uint64_t ino) {
  ASSIGN_OR_RETURN(auto v, Get(store_->manifests_, InoKey(ino)));
  if (!v) return std::optional<Manifest>();
  ASSIGN_OR_RETURN(Manifest m, Manifest::Decode(*v));
  return std::optional<Manifest>(std::move(m));
}

Status MetaStore::Txn::PutManifest(uint64_t ino, const Manifest& m) {
  return Put(store_->manifests_, InoKey(ino), m.Encode());
}

Status MetaStore::Txn::ForEachManifest(
    const std::function<void(uint64_t, const Manifest&)>& fn) {
  Status inner;
  RETURN_IF_ERROR(Scan(store_->manifests_, {}, {}, [&](std::string_view k, std::string_view v) {
    auto m = Manifest::Decode(v);
    if (!m.ok() || k.size() != 8) {
      inner = m.ok() ? Corrupt("manifest key is damaged") : m.status();
      return false;
    }
    fn(GetU64(k.data()), *m);
    return true;
  }));
  return inner;
}

Status MetaStore::Txn::DelManifest(uint64_t ino) {
  return Del(store_->manifests_, InoKey(ino), true);
}

Result<std::string> MetaStore::Txn::GetSymlink(uint64_t ino) {
  ASSIGN_OR_RETURN(auto v, Get(store_->symlinks_, InoKey(ino)));
  if (!v) return NotFound("symlink target of inode " + std::to_string(ino));
  return std::string(*v);
}

Status MetaStore::Txn::PutSymlink(uint64_t ino, std::string_view target) {
  return Put(store_->symlinks_, InoKey(ino), target);
}

Status MetaStore::Txn::DelSymlink(uint64_t ino) { return Del(store_->symlinks_, InoKey(ino), true); }

Result<std::string> MetaStore::Txn::GetXattr(uint64_t ino, std::string_view name) {
  ASSIGN_OR_RETURN(auto v, Get(store_->xattrs_, NameKey(ino, name)));
  if (!v) return Status(Code::kNoData, std::string(name));
  return std::string(*v);
}

Status MetaStore::Txn::PutXattr(uint64_t ino, std::string_view name, std::string_view value) {
  return Put(store_->xattrs_, NameKey(ino, name), value);
}

Status MetaStore::Txn::DelXattr(uint64_t ino, std::string_view name) {
  Status st = Del(store_->xattrs_, NameKey(ino, name), false);
  if (st.code() == Code::kNotFound) return Status(Code::kNoData, std::string(name));
  return st;
}

Status MetaStore::Txn::ListXattrs(uint64_t ino, const std::function<void(std::string_view)>& fn) {
  return Scan(store_->xattrs_, InoKey(ino), {}, [&](std::string_view k, std::string_view) {
    fn(k.substr(8));
    return true;
  });
}

Status MetaStore::Txn::DelAllXattrs(uint64_t ino) {
  std::vector<std::string> names;
  RETURN_IF_ERROR(ListXattrs(ino, [&](std::string_view n) { names.emplace_back(n); }));
  for (const auto& n : names) RETURN_IF_ERROR(Del(store_->xattrs_, NameKey(ino, n), true));
  return Status::Ok();
}

Result<ChunkRecord> MetaStore::Txn::GetChunk(const ChunkId& id) {
  uint8_t key[16];
  id.ToBytes(key);
  ASSIGN_OR_RETURN(auto v, Get(store_->chunks_, std::string_view(reinterpret_cast<char*>(key), 16)));
  ChunkRecord r;
  if (!v) return r;
  return DecodeChunk(id, *v);
}

Status MetaStore::Txn::MarkChunkRemote(const ChunkId& id, int tier) {
  ASSIGN_OR_RETURN(ChunkRecord r, GetChunk(id));
  const uint8_t bit = static_cast<uint8_t>(1u << tier);
  if (r.refs == 0 || (r.tiers & bit)) return Status::Ok();
  r.tiers |= bit;
  return PutChunkRecord(id, r);
}

Status MetaStore::Txn::ClearChunkRemote(const ChunkId& id, int tier) {
  ASSIGN_OR_RETURN(ChunkRecord r, GetChunk(id));
  const uint8_t bit = static_cast<uint8_t>(1u << tier);
  if (r.refs == 0 || !(r.tiers & bit)) return Status::Ok();
  r.tiers = static_cast<uint8_t>(r.tiers & ~bit);
  return PutChunkRecord(id, r);
}

Status MetaStore::Txn::PutChunkRecord(const ChunkId& id, const ChunkRecord& r) {
  uint8_t key[16];
  id.ToBytes(key);
  std::string v;
  PutU64(v, r.refs);
  PutU64(v, r.len);
  // 16 bytes: no tier holds it (and records from before the remote tier); byte 17: the tiers.
  if (r.tiers) v.push_back(static_cast<char>(r.tiers));
  return Put(store_->chunks_, std::string_view(reinterpret_cast<char*>(key), 16), v);
}

Result<uint64_t> MetaStore::Txn::AddChunkRefs(const ChunkId& id, uint64_t len, int64_t delta) {
  ASSIGN_OR_RETURN(ChunkRecord r, GetChunk(id));
  if (delta < 0 && r.refs < static_cast<uint64_t>(-delta)) {
    return Internal("chunk " + id.Hex() + " would drop below zero references");
  }
  r.refs = static_cast<uint64_t>(static_cast<int64_t>(r.refs) + delta);
  uint8_t key[16];
  id.ToBytes(key);
  std::string_view k(reinterpret_cast<char*>(key), 16);
  if (r.refs == 0) {
    RETURN_IF_ERROR(Del(store_->chunks_, k, true));
    return uint64_t{0};
  }
  r.len = len;
  RETURN_IF_ERROR(PutChunkRecord(id, r));
  return r.refs;
}

Status MetaStore::Txn::ForEachChunk(
    const std::function<void(const ChunkId&, const ChunkRecord&)>& fn) {
  return Scan(store_->chunks_, {}, {}, [&](std::string_view k, std::string_view v) {
    if (k.size() != 16) return true;
    const ChunkId id = ChunkId::FromBytes(reinterpret_cast<const uint8_t*>(k.data()));
    if (auto r = DecodeChunk(id, v); r.ok()) fn(id, *r);
    return true;
  });
}

Status MetaStore::Txn::AddOrphan(uint64_t ino) { return Put(store_->orphans_, InoKey(ino), ""); }

Status MetaStore::Txn::DelOrphan(uint64_t ino) { return Del(store_->orphans_, InoKey(ino), true); }

namespace {
constexpr std::string_view kUnbornMark = "new";
}  // namespace

Status MetaStore::Txn::AddUnborn(uint64_t ino) {
  return Put(store_->orphans_, InoKey(ino), kUnbornMark);
}

Result<bool> MetaStore::Txn::IsUnborn(uint64_t ino) {
  ASSIGN_OR_RETURN(auto v, Get(store_->orphans_, InoKey(ino)));
  return v && *v == kUnbornMark;
}

Status MetaStore::Txn::ClearUnborn(uint64_t ino) {
  ASSIGN_OR_RETURN(auto v, Get(store_->orphans_, InoKey(ino)));
  if (!v || *v != kUnbornMark) return Status::Ok();
  return Del(store_->orphans_, InoKey(ino), true);
}

namespace {
// size, mtime, durable flag, data bytes, name length, name, boot id.
std::string EncodeStaged(const StagedRecord& r) {
  std::string out;
  PutU64(out, r.size);
  PutU64(out, static_cast<uint64_t>(r.mtime_ns));
  out.push_back(r.durable ? 1 : 0);
  PutU64(out, r.data_bytes);
  PutU64(out, r.name.size());
  out += r.name;
  out += r.boot_id;
  return out;
}

std::optional<StagedRecord> DecodeStaged(std::string_view v) {
  constexpr size_t kHead = 33;
  if (v.size() < kHead) return std::nullopt;
  StagedRecord r;
  r.size = GetU64(v.data());
  r.mtime_ns = static_cast<int64_t>(GetU64(v.data() + 8));
  r.durable = v[16] != 0;
  r.data_bytes = GetU64(v.data() + 17);
  const uint64_t n = GetU64(v.data() + 25);
  if (n > v.size() - kHead) return std::nullopt;
  r.name = std::string(v.substr(kHead, n));
  r.boot_id = std::string(v.substr(kHead + n));
  return r;
}
}  // namespace

Result<std::optional<StagedRecord>> MetaStore::Txn::GetStaged(uint64_t ino) {
  if (!store_->has_remote_tables_) return std::optional<StagedRecord>();
  ASSIGN_OR_RETURN(auto v, Get(store_->staged_, InoKey(ino)));
  if (!v) return std::optional<StagedRecord>();
  auto r = DecodeStaged(*v);
  if (!r) return Corrupt("staged record of inode " + std::to_string(ino) + " is damaged");
  return r;
}

Status MetaStore::Txn::PutStaged(uint64_t ino, const StagedRecord& r) {
  return Put(store_->staged_, InoKey(ino), EncodeStaged(r));
}

Status MetaStore::Txn::DelStaged(uint64_t ino) {
  if (!store_->has_remote_tables_) return Status::Ok();
  return Del(store_->staged_, InoKey(ino), true);
}

Status MetaStore::Txn::ForEachStaged(
    const std::function<void(uint64_t, const StagedRecord&)>& fn) {
  if (!store_->has_remote_tables_) return Status::Ok();
  Status bad;
  RETURN_IF_ERROR(Scan(store_->staged_, {}, {}, [&](std::string_view k, std::string_view v) {
    auto r = DecodeStaged(v);
    if (k.size() != 8 || !r) {
      bad = Corrupt("a staged record is damaged");
      return false;
    }
    fn(GetU64(k.data()), *r);
    return true;
  }));
  return bad;
}

Status MetaStore::Txn::ForEachOrphan(const std::function<void(uint64_t, bool)>& fn) {
  return Scan(store_->orphans_, {}, {}, [&](std::string_view k, std::string_view v) {
    if (k.size() == 8) fn(GetU64(k.data()), v == kUnbornMark);
    return true;
  });
}

}  // namespace ckptfs
