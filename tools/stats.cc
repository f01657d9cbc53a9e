#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "store/meta_store.h"
#include "tools/commands.h"
#include "tools/mount_table.h"

namespace ckptfs {
namespace {

// Totals over a set of files: stored counts each distinct chunk once.
struct Tally {
  uint64_t files = 0, logical = 0, data = 0;
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> refs;  // chunk -> references from the set
  void Add(const Manifest& m) {
    ++files;
    logical += m.size();
    for (const Extent& e : m.extents()) {
      if (e.hole()) continue;
      data += e.len;
      ++refs[e.id];
    }
  }
};

struct ChunkTotals {
  uint64_t chunks = 0, stored = 0, exclusive = 0;
};

Result<ChunkTotals> Totals(MetaStore::Txn& txn, const Tally& t) {
  ChunkTotals c;
  for (const auto& [id, n] : t.refs) {
    ASSIGN_OR_RETURN(ChunkRecord r, txn.GetChunk(id));
    ++c.chunks;
    c.stored += r.len;
    if (r.refs <= n) c.exclusive += r.len;  // nothing outside the set needs it
  }
  return c;
}

double Ratio(uint64_t data, uint64_t stored) {
  return stored ? static_cast<double>(data) / static_cast<double>(stored) : 1.0;
}

// Adds every file under `dir` (hard links once) to the tally.
Status WalkTree(MetaStore::Txn& txn, uint64_t dir, Tally* t, std::unordered_set<uint64_t>* seen) {
  return txn.WalkTree(dir, true, [&](const DirEntry& e) -> Status {
    if (!S_ISREG(e.mode) || !seen->insert(e.ino).second) return Status::Ok();
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(e.ino));
    if (m) t->Add(*m);
    return Status::Ok();
  });
}

void PrintTotals(const Tally& t, const ChunkTotals& c) {
  std::printf("files            %lu\n", static_cast<unsigned long>(t.files));
  std::printf("logical_bytes    %lu\n", static_cast<unsigned long>(t.logical));
  std::printf("data_bytes       %lu\n", static_cast<unsigned long>(t.data));
  std::printf("stored_bytes     %lu\n", static_cast<unsigned long>(c.stored));
  std::printf("exclusive_bytes  %lu\n", static_cast<unsigned long>(c.exclusive));
  std::printf("chunks           %lu\n", static_cast<unsigned long>(c.chunks));
  std::printf("dedup_ratio      %.3f\n", Ratio(t.data, c.stored));
}

}  // namespace

int Stats(const std::vector<std::string>& args) {
  if (args.size() > 1) return Fail("stats takes one path: MOUNTPOINT, a path in it, or CACHE_DIR");
  const std::string path = AbsolutePath(args.empty() ? "." : args[0]);  // default: where we are
  // A path inside a mount: find the mount above it and the names below the mount point.
  std::string cache_dir = path, mount_root;
  std::vector<std::string> names;
  for (std::string p = path;;) {
    if (auto entry = FindMount(p)) {
      cache_dir = entry->cache_dir;
      mount_root = p;
      break;
    }
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos || p == "/") {
      names.clear();
      break;
    }
    names.insert(names.begin(), p.substr(slash + 1));
    p = slash == 0 ? "/" : p.substr(0, slash);
  }
  if (!mount_root.empty()) {
    // On a mount: files closed after a passthrough write are cut into chunks first, so that
    // what is counted is what is stored (their bytes are in staging files until then).
    // Every version made durable too: the ones kept as fallbacks until then are freed.
    if (::setxattr(mount_root.c_str(), "user.ckptfs.seal", "durable", 7, 0) != 0) {
      std::fprintf(stderr, "ckptfs stats: sealing staged files on %s: %s\n", mount_root.c_str(),
                   std::strerror(errno));
    }
  }
  auto meta = MetaStore::Open(cache_dir + "/meta", 64ull << 30, /*read_only=*/true);
  if (!meta.ok()) {
    return Fail(path + ": not in a ckptfs mount or cache directory (" + meta.status().ToString() +
                ")");
  }
  auto txn = (*meta)->Begin(false);
  if (!txn.ok()) return Fail(txn.status().ToString());
  uint64_t ino = kRootIno;
  for (const std::string& n : names) {
    auto e = txn->GetEntry(ino, n);
    if (!e.ok()) return Fail(path + ": " + e.status().ToString());
    ino = e->ino;
  }
  auto rec = txn->GetInode(ino);
  if (!rec.ok()) return Fail(path + ": " + rec.status().ToString());

  Tally all;
  std::unordered_set<uint64_t> seen;
  Status st;
  if (!S_ISDIR(rec->mode)) {
    auto m = txn->GetManifest(ino);
    if (!m.ok()) return Fail(m.status().ToString());
    if (*m) all.Add(**m);
  } else {
    st = WalkTree(*txn, ino, &all, &seen);
  }
  if (!st.ok()) return Fail(st.ToString());
  auto totals = Totals(*txn, all);
  if (!totals.ok()) return Fail(totals.status().ToString());
  std::printf("path             %s\n", path.c_str());
  PrintTotals(all, *totals);
  if (!S_ISDIR(rec->mode)) return 0;

  // Per directory below: each counts its own distinct chunks, so their stored bytes may add up to
  // more than the total (a chunk shared by two directories is stored once).
  std::vector<std::pair<std::string, uint64_t>> subdirs;
  st = txn->ListDir(ino, 0, [&](std::string_view n, const DirEntry& e) {
    if (S_ISDIR(e.mode)) subdirs.emplace_back(std::string(n), e.ino);
    return true;
  });
  if (!st.ok()) return Fail(st.ToString());
  if (subdirs.empty()) return 0;
  std::printf("\n%16s %16s %16s %8s  %s\n", "logical_bytes", "stored_bytes", "exclusive_bytes",
              "ratio", "directory");
  for (const auto& [n, dino] : subdirs) {
    Tally t;
    std::unordered_set<uint64_t> sub_seen;
    st = WalkTree(*txn, dino, &t, &sub_seen);
    if (!st.ok()) return Fail(st.ToString());
    auto c = Totals(*txn, t);
    if (!c.ok()) return Fail(c.status().ToString());
    std::printf("%16lu %16lu %16lu %8.3f  %s/\n", static_cast<unsigned long>(t.logical),
                static_cast<unsigned long>(c->stored), static_cast<unsigned long>(c->exclusive),
                Ratio(t.data, c->stored), n.c_str());
  }
  return 0;
}

}  // namespace ckptfs
