// FsckPass (store/fsck.h): the chunks and records of the committed files, on every tier.
#include "store/fsck.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "common/utf8.h"
#include "store/remote_tier.h"
#include "store/tree_walk.h"

namespace ckptfs {
namespace {

void Note(FsckReport* r, std::string line) {
  if (r->problems.size() < FsckReport::kMaxListed) r->problems.push_back(std::move(line));
}

}  // namespace

bool FsckReport::Clean() const {
  return local_missing + local_corrupt == local_repaired &&
         remote_missing + remote_corrupt == remote_repaired &&
         records_bad + records_missing == records_republished &&
         refcount_errors == 0 && damaged_files == 0;
}

std::string FsckReport::Json() const {
  std::string out = "{\"clean\":" + std::string(Clean() ? "true" : "false");
  auto num = [&](const char* k, uint64_t v) {
    out += ",\"" + std::string(k) + "\":" + std::to_string(v);
  };
  num("files", files);
  num("chunks", chunks);
  num("bytes", bytes);
  num("local_missing", local_missing);
  num("local_corrupt", local_corrupt);
  num("local_repaired", local_repaired);
  num("remote_missing", remote_missing);
  num("remote_corrupt", remote_corrupt);
  num("remote_repaired", remote_repaired);
  num("records", records);
  num("records_bad", records_bad);
  num("records_missing", records_missing);
  num("records_republished", records_republished);
  num("refcount_errors", refcount_errors);
  num("unreferenced_chunk_files", unreferenced_chunk_files);
  num("damaged_files", damaged_files);
  auto list = [&](const char* k, const std::vector<std::string>& v) {
    out += ",\"" + std::string(k) + "\":[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + JsonQuote(v[i]);
    out += "]";
  };
  list("damaged", damaged);
  list("problems", problems);
  return out + "}";
}

Result<FsckReport> FsckPass::Run(uint64_t ino, const FsckOptions& options) {
  FsckReport r;
  // The chunks under `ino`: their length, and their record as of this snapshot.
  std::map<ChunkId, std::pair<uint64_t, ChunkRecord>> chunks;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    RETURN_IF_ERROR(ForEachFile(txn, ino, true, [&](uint64_t, const Manifest& m) {
      ++r.files;
      for (const Extent& e : m.extents()) {
        if (!e.hole()) chunks.emplace(e.id, std::pair(e.len, ChunkRecord{}));
      }
    }));
    for (auto& [id, c] : chunks) {
      ASSIGN_OR_RETURN(c.second, txn.GetChunk(id));
      r.bytes += c.first;
    }
    r.chunks = chunks.size();
    if (ino == kRootIno) {
      // Every manifest, linked or held open after an unlink, against every chunk record.
      std::unordered_map<ChunkId, uint64_t, ChunkIdHash> counted;
      RETURN_IF_ERROR(txn.ForEachManifest([&](uint64_t, const Manifest& m) {
        for (const Extent& e : m.extents()) {
          if (!e.hole()) ++counted[e.id];
        }
      }));
      // Fallbacks (versions kept until a newer one is durable) hold references too.
      RETURN_IF_ERROR(txn.ForEachFallback([&](uint64_t, const FallbackRecord& fb) {
        for (const Extent& e : fb.manifest.extents()) {
          if (!e.hole()) ++counted[e.id];
        }
      }));
      RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRecord& rec) {
        auto it = counted.find(id);
        const uint64_t want = it == counted.end() ? 0 : it->second;
        if (it != counted.end()) counted.erase(it);
        if (rec.refs == want) return;
        ++r.refcount_errors;
        Note(&r, "chunk " + id.Hex() + ": " + std::to_string(rec.refs) + " references recorded, " +
                     std::to_string(want) + " in the manifests");
      }));
      for (const auto& [id, n] : counted) {
        ++r.refcount_errors;
        Note(&r, "chunk " + id.Hex() + ": no chunk record, " + std::to_string(n) +
                     " references in the manifests");
      }
      // Chunk files no record names: a session still writing holds some until its commit, so
      // they are counted, never removed here (the next start reclaims what stays unnamed).
      RETURN_IF_ERROR(cache_->ForEach([&](const ChunkId& id, uint64_t) {
        auto rec = txn.GetChunk(id);
        if (rec.ok() && rec->refs == 0) ++r.unreferenced_chunk_files;
      }));
    }
  }

  std::unordered_set<ChunkId, ChunkIdHash> lost;  // no verified copy anywhere after repair
  for (const auto& [id, c] : chunks) {
    const uint64_t len = c.first;
    ChunkRecord rec = c.second;
    // Local tier. A chunk the backend holds may have been evicted: absent is fine then.
    // Without --deep: a chunk file, or an extent whose pack is there, long enough to hold it.
    Status local = options.deep ? cache_->Verify(id, len) : cache_->Present(id);
    if (!local.ok()) {
      // The snapshot above is minutes old on a deep check of a live mount: a chunk uploaded and
      // evicted since, or reclaimed with a file deleted since, is not damage.
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
      ASSIGN_OR_RETURN(rec, txn.GetChunk(id));
      if (rec.refs == 0) continue;
    }
    const bool local_ok = local.ok();
    bool local_fixed = false;
    if (!local_ok && !(local.code() == Code::kNotFound && rec.remote())) {
      if (local.code() == Code::kCorrupt) {
        ++r.local_corrupt;
        Note(&r, "chunk " + id.Hex() + " on the local tier is corrupt (moved aside)");
      } else {
        ++r.local_missing;
        Note(&r, "chunk " + id.Hex() + " is missing from the local tier: " + local.ToString());
      }
      if (options.repair && publisher_->tiers() > 0) {
        // From the nearest tier with a good copy: fetched, verified, kept on disk.
        Status got = cache_->Warm(id, len);
        if (got.ok()) got = cache_->Verify(id, len);  // and there now, whatever Warm believed
        if (got.ok()) {
          ++r.local_repaired;
          local_fixed = true;
        } else {
          Note(&r, "chunk " + id.Hex() + " could not be fetched: " + got.ToString());
        }
      }
    }
    // Each tier: the chunks the store recorded as uploaded there.
    bool remote_has = false;
    for (size_t t = 0; t < publisher_->tiers(); ++t) {
      if (!(rec.tiers & (1u << t))) continue;
      Backend& backend = publisher_->backend(t);
      const std::string key = ChunkCache::ObjectKey(id);
      Status there;
      if (options.deep) {
        // One byte more than the chunk: an object that is too long is caught too.
        auto buf = ChunkData::Allocate(len + 1);
        auto n = backend.Get(key, 0, buf->bytes.get(), len + 1);
        if (!n.ok()) {
          there = n.status();
        } else if (*n != len || ChunkId::Of(buf->bytes.get(), len) != id) {
          there = Corrupt("its bytes are not the chunk's");
        }
      } else {
        auto head = backend.Head(key);
        there = head.ok() && head->size != len ? Corrupt("it has " + std::to_string(head->size) +
                                                         " bytes, not " + std::to_string(len))
                                               : head.status();
      }
      if (!there.ok() && there.code() != Code::kNotFound && there.code() != Code::kCorrupt) {
        return Status(there.code(), "checking chunk " + id.Hex() + " in " + backend.Describe() +
                                        ": " + there.message());
      }
      if (there.ok()) {
        remote_has = true;
        continue;
      }
      ++(there.code() == Code::kCorrupt ? r.remote_corrupt : r.remote_missing);
      Note(&r, "chunk " + id.Hex() + " in " + backend.Describe() + ": " + there.ToString());
      if (!options.repair) continue;
      // Put back from the local copy, or from another tier's (Get verifies what it reads, and
      // passes over a tier whose copy is bad).
      auto copy = cache_->Get(id, len);
      Status put = copy.ok() ? backend.Put(key, (*copy)->bytes.get(), len) : copy.status();
      if (put.ok()) {
        ++r.remote_repaired;
        remote_has = true;
      } else {
        Note(&r, "chunk " + id.Hex() + " could not be put back into " + backend.Describe() + ": " +
                     put.ToString());
      }
    }
    if (!local_ok && !local_fixed && !remote_has) lost.insert(id);
  }

  // The files that name a chunk no tier could supply (walked again: rare, and no list of every
  // chunk's files is kept for it).
  if (!lost.empty()) {
    std::set<uint64_t> hurt;
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    RETURN_IF_ERROR(ForEachFile(txn, ino, true, [&](uint64_t file, const Manifest& m) {
      for (const Extent& e : m.extents()) {
        if (!e.hole() && lost.count(e.id)) hurt.insert(file);
      }
    }));
    r.damaged_files = hurt.size();
    for (uint64_t file : hurt) {
      if (r.damaged.size() >= FsckReport::kMaxListed) break;
      auto path = txn.PathOf(file);
      r.damaged.push_back(path.ok() ? "/" + *path
                                    : "inode " + std::to_string(file) + " (unlinked)");
    }
  }

  // Each tier's records under the path: each must decode (it checks its own hash). A bad one is
  // published to that tier again from this node's copy when repairing and the node has the file.
  for (size_t t = 0; t < publisher_->tiers(); ++t) {
    RETURN_IF_ERROR(Records(static_cast<int>(t), ino, options, &r));
  }
  log_->info("fsck of inode {}{}{}: {} files, {} chunks, {}", ino, options.deep ? " (deep)" : "",
             options.repair ? " (repair)" : "", r.files, r.chunks,
             r.Clean() ? "clean" : "damage found");
  return r;
}

Status FsckPass::Records(int tier, uint64_t ino, const FsckOptions& options, FsckReport* r) {
  Backend& backend = publisher_->backend(tier);
  std::string prefix = "files/", exact;
  // The files under the path that this tier holds by this node's account: each needs its record.
  std::map<std::string, uint64_t> expected;  // key -> ino
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    std::string path;
    if (ino != kRootIno) {
      ASSIGN_OR_RETURN(path, txn.PathOf(ino));
      ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
      prefix += path;
      if (S_ISDIR(rec.mode)) {
        prefix += "/";
      } else {
        exact = prefix;
      }
    }
    RETURN_IF_ERROR(ForEachFile(txn, ino, true, [&](uint64_t file, const Manifest&) {
      auto rec = txn.GetInode(file);
      auto published = txn.GetPublished(tier, file);
      auto where = txn.PathOf(file);
      if (rec.ok() && published.ok() && where.ok() && rec->nlink > 0 && *published > 0 &&
          *published != kDroppedFromTier && *published >= rec->generation) {
        expected.emplace("files/" + *where, file);
      }
    }));
  }
  // Publishes file `file` to this tier again: its published mark goes first, so that the
  // publish does not skip a version it thinks the tier holds.
  auto republish = [&](uint64_t file) -> Status {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    RETURN_IF_ERROR(txn.PutPublished(tier, file, 0));
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(file));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(file));
    if (m) publisher_->HoldUnpublished(file, rec.generation, *m);
    RETURN_IF_ERROR(
        txn.QueueRemoteOpFor(tier, remote_op::PublishFile(file, rec.path_epoch)).status());
    RETURN_IF_ERROR(txn.Commit());
    publisher_->remote(tier)->Kick();
    ++r->records_republished;
    return Status::Ok();
  };
  std::vector<std::string> keys;
  RETURN_IF_ERROR(backend.List(prefix, "", [&](const ObjectInfo& o) {
    if (exact.empty() || o.key == exact) keys.push_back(o.key);
    return true;
  }));
  for (const std::string& key : keys) {
    expected.erase(key);
    auto bytes = backend.GetObject(key);
    if (!bytes.ok() && bytes.status().code() == Code::kNotFound) continue;  // deleted meanwhile
    // Only a record that was read and does not decode is bad: a failed read is no verdict.
    if (!bytes.ok()) {
      return Status(bytes.status().code(), "reading " + key + " from " + backend.Describe() +
                                               ": " + bytes.status().message());
    }
    ++r->records;
    Status st = FileRecord::Decode(*bytes).status();
    if (st.ok()) continue;
    ++r->records_bad;
    Note(r, key + " in " + backend.Describe() + ": " + st.ToString());
    if (!options.repair) continue;
    Result<uint64_t> file = kRootIno;
    {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
      for (size_t at = 6; file.ok() && at <= key.size();) {
        size_t slash = key.find('/', at);
        if (slash == std::string::npos) slash = key.size();
        auto entry = txn.GetEntry(*file, std::string_view(key).substr(at, slash - at));
        file = entry.ok() ? Result<uint64_t>(entry->ino) : Result<uint64_t>(entry.status());
        at = slash + 1;
      }
    }
    if (file.ok()) {
      RETURN_IF_ERROR(republish(*file));
    } else {
      Note(r, key + ": no local copy to publish again (" + file.status().ToString() + ")");
    }
  }
  // Published here, and no record: deleted behind ckptfs's back (a file moved or removed since
  // the snapshot above is checked again before it counts). Only on a nearer tier, and only for a
  // file this node published (its record in the farthest tier says so): the farthest tier's
  // listing is the namespace (a record gone there is a deletion another node made), and another
  // node's file may not have reached a nearer tier yet, or left it by its keep= policy.
  const int sync = publisher_->sync_tier().tier();
  for (const auto& [key, file] : expected) {
    if (tier >= sync) break;
    {
      auto there = publisher_->sync_backend().GetObject(key);
      if (!there.ok()) continue;
      auto rec = FileRecord::Decode(*there);
      if (!rec.ok() || rec->origin != publisher_->node_id()) continue;
    }
    {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
      auto where = txn.PathOf(file);
      auto published = txn.GetPublished(tier, file);
      if (!where.ok() || "files/" + *where != key || !published.ok() || *published == 0 ||
          *published == kDroppedFromTier) {
        continue;
      }
    }
    if (backend.Head(key).ok()) continue;  // put since the listing
    ++r->records_missing;
    Note(r, key + " is missing from " + backend.Describe());
    if (options.repair) RETURN_IF_ERROR(republish(file));
  }
  return Status::Ok();
}

}  // namespace ckptfs
