// NamespaceSync (store/namespace_sync.h): the sync thread, its passes over the change journal or
// a full listing, and the records they apply.
#include "store/namespace_sync.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/chunk_refs.h"
#include "store/snapshot.h"
#include "store/staged_meta.h"

namespace ckptfs {

NamespaceSync::NamespaceSync(const Config& cfg, MetaStore* meta, Publisher* publisher,
                             OpenTable* files, ChunkCache* cache, LocalChunks* chunks,
                             Fallbacks* fallbacks, Mutex& ns_mu, Logger log, Hooks hooks)
    : cfg_(cfg),
      meta_(meta),
      publisher_(publisher),
      files_(files),
      cache_(cache),
      chunks_(chunks),
      fallbacks_(fallbacks),
      ns_mu_(ns_mu),
      log_(std::move(log)),
      hooks_(std::move(hooks)) {}

NamespaceSync::~NamespaceSync() { Stop(); }

std::string NamespaceSync::mode() const {
  const int mode = mode_.load();
  return mode == 1 ? "journal" : mode == 2 ? "listing" : "";
}

void NamespaceSync::Start() {
  if (publisher_->tiers() == 0 || cfg_.sync_interval_s <= 0 || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void NamespaceSync::Stop() {
  {
    MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NamespaceSync::Loop() {
  int failures = 0;
  for (;;) {
    Status st = SyncFromRemote(nullptr, nullptr);
    if (!st.ok() && failures++ % 30 == 0) {
      log_->warn("syncing from {}: {}", sync_backend().Describe(), st.ToString());
    }
    if (st.ok()) failures = 0;
    MutexLock lock(&stop_mu_);
    const auto wait = std::chrono::milliseconds(static_cast<int64_t>(cfg_.sync_interval_s * 1000));
    if (stop_cv_.wait_for(lock.native(), wait, [&]() REQUIRES(stop_mu_) { return stop_; })) return;
  }
}

namespace {

// The directory holding the last of `parts`, 0 when some directory on the way is gone.
uint64_t ParentDir(MetaStore::Txn& txn, const std::vector<std::string>& parts) {
  uint64_t dir = kRootIno;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto e = txn.GetEntry(dir, parts[i]);
    if (!e.ok() || !S_ISDIR(e->mode)) return 0;
    dir = e->ino;
  }
  return dir;
}

std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

}  // namespace

Status NamespaceSync::InitialSync(double timeout_s, const Progress& progress) {
  if (publisher_->tiers() == 0) return Status::Ok();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto backoff = std::chrono::milliseconds(200);
  for (int attempt = 1;; ++attempt) {
    bool listed = false;
    Status st = SyncFromRemote(progress, &listed);
    if (st.ok() || (listed && st.code() != Code::kIo)) {
      if (!st.ok()) log_->error("first sync from {}: {}", sync_backend().Describe(), st.ToString());
      log_->info("first sync from {} done (attempt {})", sync_backend().Describe(), attempt);
      return Status::Ok();
    }
    if (std::chrono::steady_clock::now() + backoff >= deadline) {
      return Status(st.code(), "the namespace in " + sync_backend().Describe() +
                                   " could not be read within " + std::to_string(timeout_s) +
                                   " s: " + st.message());
    }
    log_->warn("first sync from {} (attempt {}): {}; retrying", sync_backend().Describe(), attempt,
               st.ToString());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

Status NamespaceSync::SyncFromRemote(const Progress& progress, bool* listed) {
  if (publisher_->tiers() == 0) return Status::Ok();
  MutexLock pass(&pass_mu_);  // one pass at a time, whoever runs it
  if (!journal_exclusive_ && cfg_.sync_full_interval_s > 0) {
    // The journal's numbers rest on exclusive creates; a gateway that ignores If-None-Match
    // would let two writers take one number and hide an entry. Then every pass lists.
    auto probe = publisher_->journal()->CreatesAreExclusive();
    if (!probe.ok()) {
      // Puts failing now (the backend is down, or refuses writes): this pass lists, and the
      // probe runs again at the next.
      log_->debug("probing {} for exclusive creates: {}", sync_backend().Describe(),
                  probe.status().ToString());
    } else {
      journal_exclusive_ = *probe;
      if (!*probe) {
        log_->error("{} does not refuse a second create of one key (If-None-Match): its change "
                    "journal cannot be trusted, so every sync pass lists the bucket",
                    sync_backend().Describe());
      }
    }
  }
  const bool journal = cfg_.sync_full_interval_s > 0 && journal_exclusive_.value_or(false);
  mode_ = journal ? 1 : 2;
  const auto now = std::chrono::steady_clock::now();
  const bool due = !journal ||
                   now - last_full_sync_ >= std::chrono::duration<double>(cfg_.sync_full_interval_s);
  if (journal && !journal_cursor_ && synced_.empty()) {
    // A new mount: the bucket's snapshot and the journal after it, when they can be trusted.
    bool used = false;
    Status st = SnapshotSync(progress, &used);
    if (used) {
      if (listed) *listed = true;
      last_full_sync_ = now;
      return st;
    }
  }
  if (journal_cursor_ && !due) {
    bool gap = false;
    Status st = JournalSync(&gap);
    if (!gap) {
      if (listed) *listed = true;
      return st;
    }
    log_->info("the journal in {} was truncated past what this node read: listing everything",
               sync_backend().Describe());
  }
  // A full pass. The journal's newest entry first: what changes while the listing runs is read
  // from the journal after it (applying a change twice ends in the same state).
  // (With sync_full_interval 0 every pass lists: the journal is not read.)
  uint64_t head = 0;
  if (journal) {
    ASSIGN_OR_RETURN(head, publisher_->journal()->Head());
  }
  bool ok_listing = false;
  Status st = FullSync(progress, &ok_listing);
  if (listed) *listed = ok_listing;
  if (ok_listing && journal) {
    journal_cursor_ = head;
    last_full_sync_ = now;
    journal_entry_ = head;
  }
  return st;
}

Status NamespaceSync::JournalSync(bool* gap) {
  ASSIGN_OR_RETURN(NamespaceJournal::Batch b, publisher_->journal()->ReadAfter(*journal_cursor_));
  if (b.gap) {
    *gap = true;
    return Status::Ok();
  }
  return ApplyBatch(b);
}

Status NamespaceSync::ApplyBatch(const NamespaceJournal::Batch& b) {
  // Each key once, at its last place, in journal order (a directory's removal comes after its
  // files'): the bucket's state now is what gets applied. Keys that failed before go first.
  std::vector<std::string> keys;
  keys.swap(journal_retry_);
  journal_retry_set_.clear();
  keys.insert(keys.end(), b.keys.begin(), b.keys.end());
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < keys.size(); ++i) last[keys[i]] = i;
  Status first;
  std::vector<std::string> failed_files;  // "files/<path>" keys that failed in this pass
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    if (last[key] != i) continue;
    // A directory after a failed file inside it waits with it: its removal needs the file gone.
    if (key.rfind("dirs/", 0) == 0) {
      const std::string under = "files/" + key.substr(5) + "/";
      if (std::any_of(failed_files.begin(), failed_files.end(),
                      [&](const std::string& f) { return f.rfind(under, 0) == 0; })) {
        RetryKey(key);
        continue;
      }
    }
    Status st = SyncKey(key);
    if (st.ok() || st.code() == Code::kExists) continue;
    if (key.rfind("files/", 0) == 0) failed_files.push_back(key);
    // A name that can never be applied here is left to the full listings' report.
    if (st.code() != Code::kInvalid) RetryKey(key);
    if (st.code() != Code::kBusy && first.ok()) first = Status(st.code(), key + ": " + st.message());
  }
  journal_cursor_ = b.last;
  journal_entry_ = b.last;
  return first;
}

void NamespaceSync::RetryKey(const std::string& key) {
  if (journal_retry_set_.insert(key).second) journal_retry_.push_back(key);
}

Status NamespaceSync::SyncKey(const std::string& key) {
  if (key.rfind("dirs/", 0) == 0) {
    auto h = sync_backend().Head(key);
    if (h.ok()) {
      RETURN_IF_ERROR(ApplyRemoteDir(key.substr(5)));
      synced_[key] = ListedVersion(*h);
      return Status::Ok();
    }
    if (h.status().code() != Code::kNotFound) return h.status();
    synced_.erase(key);
    return ApplyRemoteRmdir(key.substr(5));
  }
  if (key.rfind("files/", 0) != 0) return Status::Ok();  // no key of the namespace
  const uint64_t gc_generation = sync_tier().gc_generation();
  auto bytes = sync_backend().GetObject(key);
  if (!bytes.ok()) {
    if (bytes.status().code() != Code::kNotFound) return bytes.status();
    synced_.erase(key);
    return ApplyRemoteDelete(key.substr(6));
  }
  auto rec = FileRecord::Decode(*bytes);
  if (!rec.ok()) {
    // Not applied: read again at the next pass (the damage may have been on the way).
    if (journal_damaged_.insert(key).second) {
      log_->error("{} in {}: {}", key, sync_backend().Describe(), rec.status().ToString());
    }
    return rec.status();
  }
  // The listing's version is not known from a GET: the next full pass reads it once more.
  synced_[key] = "";
  journal_damaged_.erase(key);
  // This node's own records too: a slow publish of an older version may have landed over
  // another node's newer one, and the bucket's version is the one every node ends with.
  // (ApplyRemoteFile leaves what this node already has, and local changes not yet published.)
  return ApplyRemoteFile(key.substr(6), *rec, gc_generation);
}

Status NamespaceSync::FullSync(const Progress& progress, bool* listed) {
  // One listing of each tree; what changed since the last pass is applied.
  std::map<std::string, std::string> seen;
  for (const char* tree : {"dirs/", "files/"}) {
    RETURN_IF_ERROR(sync_backend().List(tree, "", [&](const ObjectInfo& o) {
      seen[o.key] = ListedVersion(o);
      return true;
    }));
  }
  if (listed) *listed = true;
  Status first;
  auto note = [&](const Status& st, const std::string& key) REQUIRES(pass_mu_) {
    if (st.ok()) return;
    RetryKey(key);  // the passes over the journal try it again
    if (first.ok()) first = Status(st.code(), key + ": " + st.message());
  };
  size_t done = 0;
  for (const auto& [key, version] : seen) {
    if (progress && ++done % 256 == 0) progress(done, seen.size());
    auto known = synced_.find(key);
    if (known != synced_.end() && known->second == version) continue;
    if (key.rfind("dirs/", 0) == 0) {
      note(ApplySeen(key, version, std::string(), 0), key);
      continue;
    }
    const uint64_t gc_generation = sync_tier().gc_generation();
    auto bytes = sync_backend().GetObject(key);
    if (!bytes.ok() && bytes.status().code() == Code::kNotFound) continue;
    note(ApplySeen(key, version, std::move(bytes), gc_generation), key);
  }
  // Keys gone since the last pass: another node deleted or moved them. Files first, then the
  // directories, deepest first (they sort after their parents), so that emptied ones can go.
  std::vector<std::string> gone_dirs;
  for (auto it = synced_.begin(); it != synced_.end();) {
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    if (it->first.rfind("files/", 0) == 0) note(ApplyRemoteDelete(it->first.substr(6)), it->first);
    if (it->first.rfind("dirs/", 0) == 0) gone_dirs.push_back(it->first.substr(5));
    it = synced_.erase(it);
  }
  for (auto d = gone_dirs.rbegin(); d != gone_dirs.rend(); ++d) {
    note(ApplyRemoteRmdir(*d), "dirs/" + *d);
  }
  return first;
}

Status NamespaceSync::ApplySeen(const std::string& key, const std::string& version,
                                Result<std::string> bytes, uint64_t gc_generation) {
  if (key.rfind("dirs/", 0) == 0) {
    RETURN_IF_ERROR(ApplyRemoteDir(key.substr(5)));
    synced_[key] = version;
    return Status::Ok();
  }
  if (!bytes.ok()) return bytes.status();
  auto rec = FileRecord::Decode(*bytes);
  if (!rec.ok()) {
    // Not applied. Read again at the next pass (the damage may have been on the way), but
    // reported once per version of the object.
    const std::string damaged = "damaged " + version;
    auto known = synced_.find(key);
    if (known == synced_.end() || known->second != damaged) {
      log_->error("{} in {}: {}", key, sync_backend().Describe(), rec.status().ToString());
    }
    synced_[key] = damaged;
    RetryKey(key);
    return Status::Ok();
  }
  Status st = ApplyRemoteFile(key.substr(6), *rec, gc_generation);
  if (st.ok() || st.code() == Code::kExists) {
    synced_[key] = version;
    return Status::Ok();
  }
  if (st.code() != Code::kBusy) return st;
  RetryKey(key);
  return Status::Ok();
}

Status NamespaceSync::SnapshotSync(const Progress& progress, bool* used) {
  *used = false;
  Backend& backend = sync_backend();
  auto newest = NamespaceSnapshot::Newest(backend);
  if (!newest.ok()) {
    log_->warn("the record snapshot in {} cannot be used ({}): listing the bucket",
               backend.Describe(), newest.status().ToString());
    return Status::Ok();
  }
  if (!*newest) return Status::Ok();
  const NamespaceSnapshot::Manifest& m = **newest;
  // The journal after J first: a hole sends the mount to the listing before any part is read,
  // and the keys named after J are left to the journal's own pass (the bucket's state now), not
  // set back to the snapshot's older state in between.
  auto batch = publisher_->journal()->ReadAfter(m.journal);
  if (!batch.ok()) {
    log_->warn("the journal in {} after record snapshot {} cannot be read ({}): listing the bucket",
               backend.Describe(), m.dir, batch.status().ToString());
    return Status::Ok();
  }
  if (batch->gap) {
    log_->info("the journal in {} was truncated past the entry of record snapshot {}: listing "
               "the bucket", backend.Describe(), m.dir);
    return Status::Ok();
  }
  const std::set<std::string> named(batch->keys.begin(), batch->keys.end());
  const uint64_t total = m.entries();
  uint64_t done = 0;
  Status first;
  for (const NamespaceSnapshot::Part& part : m.parts) {
    Status st = NamespaceSnapshot::ReadPart(
        backend, part, [&](NamespaceSnapshot::Entry&& e) REQUIRES(pass_mu_) {
          if (progress && ++done % 256 == 0) progress(done, total);
          if (named.count(e.key)) return Status::Ok();
          // Its records are as old as the snapshot: chunks they name may have been collected
          // since (a record replaced after J), so they mark no chunk as held by the bucket.
          Status applied = ApplySeen(e.key, e.version, std::move(e.record), kNoMarks);
          if (!applied.ok()) {
            RetryKey(e.key);
            if (first.ok()) first = Status(applied.code(), e.key + ": " + applied.message());
          }
          return Status::Ok();
        });
    if (!st.ok()) {
      log_->warn("the record snapshot {} in {} cannot be used ({}): listing the bucket", m.dir,
                 backend.Describe(), st.ToString());
      // What it applied is kept, but the listing that follows must read every key again and
      // delete what the bucket no longer holds.
      for (auto& [key, version] : synced_) version.clear();
      return Status::Ok();
    }
  }
  // Every change after J is read again from the bucket: the journal decides.
  journal_cursor_ = m.journal;
  Status st = ApplyBatch(*batch);
  *used = true;
  log_->info("read the record snapshot {} of {} ({} keys, journal entry {}) and the journal "
             "after it", m.dir, backend.Describe(), total, m.journal);
  return first.ok() ? st : first;
}

Status NamespaceSync::ApplyRemoteRmdir(const std::string& path) {
  std::vector<std::string> parts = Components(path);
  uint64_t parent = kRootIno;
  {
    MutexLock lock(&ns_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    parent = ParentDir(txn, parts);
    if (parent == 0) return Status::Ok();  // already gone here
    auto e = txn.GetEntry(parent, parts.back());
    if (!e.ok() || !S_ISDIR(e->mode)) return Status::Ok();
    // Something made or kept here since: the directory stays (its files will be published).
    if (!txn.DirEmpty(e->ino)) return Status::Ok();
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(e->ino));
    ASSIGN_OR_RETURN(InodeRecord dir, txn.GetInode(parent));
    RETURN_IF_ERROR(txn.DelEntry(parent, parts.back()));
    --dir.nlink;
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(hooks_.drop_link(txn, rec, nullptr));
    for (int t = 0; t < sync_tier().tier(); ++t) {
      RETURN_IF_ERROR(txn.QueueRemoteOpFor(t, remote_op::UnpublishDir(path)).status());
    }
    RETURN_IF_ERROR(txn.Commit());
  }
  if (sync_tier().tier() > 0) publisher_->Kick();
  hooks_.tell_change(parent, parts.back(), 0);
  return Status::Ok();
}

Result<uint64_t> NamespaceSync::MakeDirsForRemote(
    MetaStore::Txn& txn, const std::vector<std::string>& dirs,
    std::vector<std::pair<uint64_t, std::string>>* created) {
  uint64_t parent = kRootIno;
  for (const std::string& name : dirs) {
    if (name.empty() || name == "." || name == ".." || name.size() > 255) {
      return Invalid("a remote path component '" + name + "' is not a file name");
    }
    auto e = txn.GetEntry(parent, name);
    if (e.ok()) {
      if (!S_ISDIR(e->mode)) return Status(Code::kExists, name + " is not a directory here");
      parent = e->ino;
      continue;
    }
    if (e.status().code() != Code::kNotFound) return e.status();
    ASSIGN_OR_RETURN(InodeRecord dir, txn.GetInode(parent));
    InodeRecord rec;
    ASSIGN_OR_RETURN(rec.ino, txn.AllocIno());
    rec.mode = S_IFDIR | 0755;
    rec.uid = dir.uid;
    rec.gid = dir.gid;
    rec.nlink = 2;
    rec.atime_ns = rec.mtime_ns = rec.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutEntry(dir, name, rec.ino, rec.mode));
    ++dir.nlink;
    dir.mtime_ns = dir.ctime_ns = rec.ctime_ns;
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(txn.PutInode(rec));
    created->emplace_back(parent, name);
    parent = rec.ino;
  }
  return parent;
}

Status NamespaceSync::ApplyRemoteDir(const std::string& path) {
  std::vector<std::pair<uint64_t, std::string>> created;
  {
    MutexLock lock(&ns_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    auto made = MakeDirsForRemote(txn, Components(path), &created);
    if (!made.ok()) return made.status().code() == Code::kExists ? Status::Ok() : made.status();
    RETURN_IF_ERROR(txn.Commit());
  }
  for (const auto& [parent, name] : created) {
    hooks_.tell_change(parent, name, 0);
  }
  return Status::Ok();
}

Status NamespaceSync::ApplyRemoteFile(const std::string& path, const FileRecord& r,
                                      uint64_t gc_generation) {
  const int sync = sync_tier().tier();
  std::vector<std::string> parts = Components(path);
  const std::string name = parts.back();
  parts.pop_back();
  std::vector<std::pair<uint64_t, std::string>> created;
  std::vector<ChunkId> freed;
  uint64_t parent = 0, ino = 0;
  bool marked = false;
  {
    MutexLock lock(&ns_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    ASSIGN_OR_RETURN(parent, MakeDirsForRemote(txn, parts, &created));
    if (name.empty() || name == "." || name == ".." || name.size() > 255) {
      return Invalid("remote file name '" + name + "'");
    }
    InodeRecord rec;
    auto e = txn.GetEntry(parent, name);
    if (e.ok()) {
      ASSIGN_OR_RETURN(rec, txn.GetInode(e->ino));
      if (!S_ISREG(rec.mode)) return Status(Code::kExists, path + " is not a file here");
      // Open here: applied at a later pass, once nobody here has it open.
      if (files_->IsOpen(rec.ino)) return Status(Code::kBusy, path + " is open");
      ASSIGN_OR_RETURN(auto staged, txn.GetStaged(rec.ino));
      if (staged) return Status(Code::kBusy, path + " has staged bytes not yet sealed");
      ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(sync, rec.ino));
      // Local changes still to publish win over an older remote version; they overwrite it.
      if (published < rec.generation && rec.mtime_ns >= r.mtime_ns) return Status::Ok();
      ASSIGN_OR_RETURN(auto old, txn.GetManifest(rec.ino));
      // What this node already has (the first pass after a mount sees every file again).
      if (published == rec.generation && rec.mtime_ns == r.mtime_ns &&
          (rec.mode & 07777) == (r.mode & 07777) &&
          (old ? *old == r.manifest : r.manifest.empty())) {
        return Status::Ok();
      }
      if (old) RETURN_IF_ERROR(AddManifestRefs(txn, *old, -1, &freed));
      // The bucket's version replaces whatever this node would fall back to.
      RETURN_IF_ERROR(fallbacks_->Drop(txn, rec.ino, &freed));
    } else if (e.status().code() == Code::kNotFound) {
      ASSIGN_OR_RETURN(InodeRecord dir, txn.GetInode(parent));
      ASSIGN_OR_RETURN(rec.ino, txn.AllocIno());
      rec.nlink = 1;
      rec.atime_ns = NowNs();
      RETURN_IF_ERROR(txn.PutEntry(dir, name, rec.ino, S_IFREG));
      dir.mtime_ns = dir.ctime_ns = rec.atime_ns;
      RETURN_IF_ERROR(txn.PutInode(dir));
    } else {
      return e.status();
    }
    RETURN_IF_ERROR(AddManifestRefs(txn, r.manifest, +1, nullptr));
    // The record says the backend holds these chunks, unless a gc round began or ended here
    // since it was read (it may have been deleted and its chunks swept meanwhile). Checked in
    // this write transaction: a round taken into account after it clears what it marks.
    marked = sync_tier().gc_generation() == gc_generation;
    for (const Extent& x : r.manifest.extents()) {
      if (marked && !x.hole()) RETURN_IF_ERROR(txn.MarkChunkRemote(x.id, sync));
    }
    RETURN_IF_ERROR(txn.PutManifest(rec.ino, r.manifest));
    rec.mode = S_IFREG | (r.mode & 07777);
    rec.uid = r.uid;
    rec.gid = r.gid;
    rec.size = r.manifest.size();
    rec.data_bytes = r.manifest.DataBytes();
    rec.mtime_ns = r.mtime_ns;
    rec.ctime_ns = NowNs();
    ++rec.generation;
    RETURN_IF_ERROR(txn.PutInode(rec));
    // The tier it came from holds it; the node that published it publishes it to the others
    // (every node of one namespace has the same chain), so this one does not.
    for (int t = 0; t <= sync; ++t) RETURN_IF_ERROR(txn.PutPublished(t, rec.ino, rec.generation));
    RETURN_IF_ERROR(txn.Commit());
    ino = rec.ino;
  }
  for (const Extent& x : r.manifest.extents()) {
    if (marked && !x.hole()) cache_->MarkRemote(x.id, sync);
  }
  chunks_->Reclaim(freed);
  for (const auto& [p, n] : created) hooks_.tell_change(p, n, 0);
  hooks_.tell_change(parent, name, ino);
  return Status::Ok();
}

Status NamespaceSync::ApplyRemoteDelete(const std::string& path) {
  const int sync = sync_tier().tier();
  std::vector<std::string> parts = Components(path);
  std::vector<ChunkId> freed;
  uint64_t parent = kRootIno, ino = 0;
  {
    MutexLock lock(&ns_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    parent = ParentDir(txn, parts);
    if (parent == 0) return Status::Ok();  // already gone here
    auto e = txn.GetEntry(parent, parts.back());
    if (!e.ok()) return Status::Ok();
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(e->ino));
    if (!S_ISREG(rec.mode)) return Status::Ok();
    ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(sync, rec.ino));
    // Only a file that is what the backend had: local changes since are published again.
    if (published != rec.generation) return Status::Ok();
    ASSIGN_OR_RETURN(auto staged, txn.GetStaged(rec.ino));
    if (staged) return Status::Ok();  // so are bytes staged here
    ASSIGN_OR_RETURN(InodeRecord dir, txn.GetInode(parent));
    RETURN_IF_ERROR(txn.DelEntry(parent, parts.back()));
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(txn.DelPublished(rec.ino));
    RETURN_IF_ERROR(hooks_.drop_link(txn, rec, &freed));
    // The nearer tiers may hold it from this node (its publish there may even land after the
    // deletion reached the farthest tier): it goes from them too, after whatever is queued.
    for (int t = 0; t < sync; ++t) {
      RETURN_IF_ERROR(txn.QueueRemoteOpFor(t, remote_op::Unpublish(path)).status());
    }
    RETURN_IF_ERROR(txn.Commit());
    ino = rec.ino;
  }
  if (sync > 0) publisher_->Kick();
  chunks_->Reclaim(freed);
  hooks_.tell_change(parent, parts.back(), 0);
  (void)ino;
  return Status::Ok();
}

}  // namespace ckptfs
