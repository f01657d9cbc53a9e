#include "store/publisher.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backends/timed_backend.h"
#include "common/utf8.h"
#include "store/tier_policy.h"

namespace ckptfs {
namespace {

// This node's name in the records it publishes: random, made once per cache directory.
Result<std::string> NodeId(const std::string& dir) {
  const std::string path = dir + "/node-id";
  std::ifstream in(path);
  std::string id;
  if (in >> id && id.size() == 16) return id;
  std::ifstream rnd("/dev/urandom", std::ios::binary);
  uint64_t v = 0;
  if (!rnd.read(reinterpret_cast<char*>(&v), sizeof(v))) return IoError("reading /dev/urandom");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  std::ofstream out(path + ".tmp", std::ios::trunc);
  out << hex << "\n";
  out.close();
  if (!out || ::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    return Status::FromErrno(errno, "writing " + path);
  }
  return std::string(hex);
}

}  // namespace

Publisher::Publisher(const Config& cfg, MetaStore* meta, ChunkCache* cache, Metrics* metrics,
                     Logger log)
    : cfg_(cfg), meta_(meta), cache_(cache), metrics_(metrics), log_(std::move(log)) {}

Status Publisher::Attach(std::vector<std::unique_ptr<Backend>> tiers) {
  ASSIGN_OR_RETURN(std::string node, NodeId(cfg_.cache_dir));
  node_id_ = node;
  static_assert(kMetricTiers == kMaxTiers);
  for (size_t t = 0; t < tiers.size(); ++t) {  // every request timed, by tier
    tiers[t] = std::make_unique<TimedBackend>(std::move(tiers[t]), metrics_, static_cast<int>(t));
  }
  backends_ = std::move(tiers);
  const int n = static_cast<int>(backends_.size());
  {
    // Each tier's state (queue, published versions, chunk marks, gc epoch) belongs to the
    // backend it was made for, found by name wherever it stands in the chain now; a backend new
    // to the chain starts empty (QueueUnpublished publishes its files), and a tier that left it is
    // forgotten (its marks would name chunks no tier of the chain holds).
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    std::vector<std::string> was(kMaxTiers);
    bool named = false;
    for (int o = 0; o < kMaxTiers; ++o) {
      ASSIGN_OR_RETURN(was[o], txn.GetTierName(o));
      named = named || !was[o].empty();
    }
    std::vector<int> from(n, -1);
    if (!named) {
      // A new store, or one from before the chain: its one backend's state is unnamed.
      ASSIGN_OR_RETURN(bool state, txn.TierHasState(0));
      if (state && n > 1) {
        return Invalid("this cache directory holds the upload state of one backend recorded "
                       "before chains of tiers; mount it once with that backend alone, then "
                       "with the chain");
      }
      if (n == 1) from[0] = 0;
    } else {
      for (int t = 0; t < n; ++t) {
        for (int o = 0; o < kMaxTiers; ++o) {
          if (!was[o].empty() && was[o] == backends_[t]->Identity()) from[t] = o;
        }
      }
    }
    bool same = true;
    for (int o = 0; o < kMaxTiers; ++o) {
      const bool kept = o < n && from[o] == o;
      same = same && (kept || was[o].empty());
    }
    if (!same) {
      for (int o = 0; o < kMaxTiers; ++o) {
        if (was[o].empty()) continue;
        int now = -1;
        for (int t = 0; t < n; ++t) now = from[t] == o ? t : now;
        if (now != o) {
          log_->info("remote tier {} ({}) is {} now: its state here moves with it", o + 1, was[o],
                     now < 0 ? std::string("out of the chain") : "tier " + std::to_string(now + 1));
        }
      }
      RETURN_IF_ERROR(txn.RemapTiers(from));
      // The farthest tier keeps everything: what a nearer tier's policy dropped goes there too.
      if (n > 0) RETURN_IF_ERROR(txn.ForgetDropped(n - 1));
    }
    for (int t = 0; t < n; ++t) RETURN_IF_ERROR(txn.PutTierName(t, backends_[t]->Identity()));
    RETURN_IF_ERROR(txn.Commit());
  }
  meta_->SetRemoteTiers(n);
  cache_->SetKeepFetched([this](const ChunkId& id) {
    auto txn = meta_->Begin(false);
    if (!txn.ok()) return true;
    auto r = txn->GetChunk(id);
    return !r.ok() || r->refs > 0;
  });
  if (n > 1) {
    {
      MutexLock lock(&restore_mu_);
      restore_pool_ = std::make_unique<ThreadPool>(1);
    }
    cache_->SetFetchedFromFar([this](const ChunkId& id, uint8_t missing, const ChunkRef& data) {
      RestoreNearer(id, missing, data);
    });
  }
  std::vector<Backend*> chain;
  for (auto& b : backends_) chain.push_back(b.get());
  cache_->AttachRemote(chain, cfg_.cache_bytes);
  std::vector<std::pair<ChunkId, uint8_t>> remote;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRecord& r) {
      if (r.remote()) remote.emplace_back(id, r.tiers);
    }));
  }
  for (const auto& [id, bits] : remote) {
    for (int t = 0; t < n; ++t) {
      if (bits & (1u << t)) cache_->MarkRemote(id, t);
    }
  }
  for (int t = 0; t < n; ++t) {
    auto tier = std::make_unique<RemoteTier>(backends_[t].get(), meta_, cache_, metrics_, node,
                                             cfg_.upload_threads, t);
    tier->SetGcWindow(cfg_.gc_window_s);
    tier->SetPublishedListener([this](uint64_t ino) { ReleaseUnpublished(ino); });
    if (t + 1 < n && static_cast<size_t>(t) < cfg_.tier_keep.size() && cfg_.tier_keep[t] > 0) {
      tier->SetIdleWork([this, t] {
        return ApplyTierPolicy(cfg_, *meta_, *backends_[t], t, remotes_.size(), *metrics_, log_);
      });
    }
    if (t + 1 == n) {  // the farthest tier is the namespace: its changes go in its journal
      journal_ = std::make_unique<NamespaceJournal>(backends_[t].get(), node);
      tier->SetJournal(journal_.get());
    }
    remotes_.push_back(std::move(tier));
  }
  return Status::Ok();
}

void Publisher::Start() {
  for (auto& r : remotes_) {
    r->Start();
    log_->info("writing back to {} (tier {}) as node {}", r->backend()->Describe(), r->tier() + 1,
               node_id_);
  }
}

void Publisher::StopRestores() {
  // Restores queued and not begun are dropped (a later read asks again); the one running ends
  // first. Reset outside the lock: a task takes it as it ends.
  std::unique_ptr<ThreadPool> restores;
  {
    MutexLock lock(&restore_mu_);
    restores = std::move(restore_pool_);
  }
  restores.reset();
}

void Publisher::StopTiers() {
  for (auto& r : remotes_) r->Stop();
}

Status Publisher::QueueUnpublished() {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  std::vector<uint64_t> files;
  RETURN_IF_ERROR(txn.ForEachManifest([&](uint64_t ino, const Manifest&) { files.push_back(ino); }));
  size_t queued = 0;
  for (uint64_t ino : files) {
    auto rec = txn.GetInode(ino);
    if (!rec.ok() || !S_ISREG(rec->mode) || rec->nlink == 0) continue;
    bool held = false;
    for (size_t t = 0; t < remotes_.size(); ++t) {
      const int tier = static_cast<int>(t);
      ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(tier, ino));
      if (published >= rec->generation) continue;
      ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
      if (m && !held) HoldUnpublished(ino, rec->generation, *m);
      held = true;
      RETURN_IF_ERROR(
          txn.QueueRemoteOpFor(tier, remote_op::PublishFile(ino, rec->path_epoch)).status());
      ++queued;
    }
  }
  RETURN_IF_ERROR(txn.Commit());
  if (queued) log_->info("{} uploads of files committed locally are queued", queued);
  return Status::Ok();
}

void Publisher::HoldUnpublished(uint64_t ino, uint64_t generation, const Manifest& m) {
  std::vector<ChunkId> ids;
  for (const Extent& e : m.extents()) {
    if (!e.hole()) ids.push_back(e.id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  cache_->Hold(ids);
  MutexLock lock(&unpublished_mu_);
  unpublished_[ino].emplace_back(generation, std::move(ids));
}

void Publisher::ReleaseUnpublished(uint64_t ino) {
  bool gone = false;
  uint64_t published = 0;
  {
    auto txn = meta_->Begin(false);
    if (!txn.ok()) return;  // held a little longer: the next publish of the file releases it
    auto rec = txn->GetInode(ino);
    if (!rec.ok() && rec.status().code() != Code::kNotFound) return;
    gone = !rec.ok() || rec->nlink == 0;
    // Held until every tier has the version: a tier that lacks it may have its chunks swept by
    // a round this node does not see.
    published = UINT64_MAX;
    for (size_t t = 0; t < remotes_.size(); ++t) {
      auto p = txn->GetPublished(static_cast<int>(t), ino);
      if (!p.ok()) return;
      published = std::min(published, *p);
    }
  }
  std::vector<ChunkId> ids;
  {
    MutexLock lock(&unpublished_mu_);
    auto it = unpublished_.find(ino);
    if (it == unpublished_.end()) return;
    auto& versions = it->second;
    for (auto v = versions.begin(); v != versions.end();) {
      if (gone || v->first <= published) {
        ids.insert(ids.end(), v->second.begin(), v->second.end());
        v = versions.erase(v);
      } else {
        ++v;
      }
    }
    if (versions.empty()) unpublished_.erase(it);
  }
  cache_->Unhold(ids);
}

void Publisher::RestoreNearer(const ChunkId& id, uint8_t missing, const ChunkRef& data) {
  uint8_t lost = 0;
  {
    // Only tiers this node counts as holding the chunk (a file it knows is there names it): one
    // past its keep= policy, or never given the file, is not this read's to fill.
    auto txn = meta_->Begin(false);
    if (!txn.ok()) return;
    auto rec = txn->GetChunk(id);
    if (!rec.ok()) return;
    lost = static_cast<uint8_t>(missing & rec->tiers);
  }
  if (!lost) return;
  MutexLock lock(&restore_mu_);
  if (!restore_pool_ || restore_bytes_ + data->size > kMaxRestoreBytes) return;
  restore_bytes_ += data->size;
  restore_pool_->Submit([this, id, lost, data] {
    for (size_t t = 0; t < backends_.size(); ++t) {
      if (!(lost & (1u << t)) || stopping_.load()) continue;  // closing: a later read asks again
      Status st = backends_[t]->Put(ChunkCache::ObjectKey(id), data->bytes.get(), data->size);
      if (st.ok()) {
        metrics_->tier_chunks_restored.Add(1);
        log_->info("chunk {} was missing from {}: put back from a farther tier", id.Hex(),
                   backends_[t]->Describe());
      } else {
        log_->warn("putting chunk {} back into {}: {}", id.Hex(), backends_[t]->Describe(),
                   st.ToString());
      }
    }
    MutexLock done(&restore_mu_);
    restore_bytes_ -= data->size;
  });
}

void Publisher::Kick() {
  for (auto& r : remotes_) r->Kick();
}

Status Publisher::Queue(MetaStore::Txn& txn, const std::string& op) {
  if (remotes_.empty()) return Status::Ok();
  return txn.QueueRemoteOp(op).status();
}

Status Publisher::QueueTree(MetaStore::Txn& txn, uint64_t ino, const std::string& path,
                             bool publish) {
  if (remotes_.empty() || path.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (S_ISREG(rec.mode)) {
    if (!publish) return txn.QueueRemoteOp(remote_op::Unpublish(path)).status();
    // A file that moves keeps its generation: publish it again under the new path (no record
    // may name its chunks meanwhile: they stay on the local tier until then). Its new path epoch
    // makes the publishes queued or running under an earlier path count for nothing: the
    // deletions queued before this one may undo what they put (remote_tier.h).
    ++rec.path_epoch;
    RETURN_IF_ERROR(txn.PutInode(rec));
    RETURN_IF_ERROR(txn.DelPublished(ino));
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
    if (m) HoldUnpublished(ino, rec.generation, *m);
    return txn.QueueRemoteOp(remote_op::PublishFile(ino, rec.path_epoch)).status();
  }
  if (!S_ISDIR(rec.mode)) return Status::Ok();
  RETURN_IF_ERROR(txn.QueueRemoteOp(publish ? remote_op::PublishDir(path)
                                            : remote_op::UnpublishDir(path)).status());
  std::vector<std::pair<std::string, uint64_t>> children;
  RETURN_IF_ERROR(txn.ListDir(ino, 0, [&](std::string_view name, const DirEntry& e) {
    children.emplace_back(std::string(name), e.ino);
    return true;
  }));
  for (const auto& [name, child] : children) {
    RETURN_IF_ERROR(QueueTree(txn, child, path + "/" + name, publish));
  }
  return Status::Ok();
}

Result<std::string> Publisher::RemoteState(uint64_t ino, bool dirty) {
  ASSIGN_OR_RETURN(std::vector<std::string> states, StatesOf(ino, dirty));
  if (states.empty()) return std::string("local");
  for (const std::string& st : states) {
    if (st != "remote" && st != "dropped") return st;
  }
  return std::string("remote");
}

Result<std::string> Publisher::TierStates(uint64_t ino, bool dirty) {
  ASSIGN_OR_RETURN(std::vector<std::string> states, StatesOf(ino, dirty));
  std::string out = "{\"tiers\":[";
  for (size_t t = 0; t < states.size(); ++t) {
    out += std::string(t ? "," : "") + "{\"backend\":" + JsonQuote(backends_[t]->Identity()) +
           ",\"state\":\"" + states[t] + "\"}";
  }
  return out + "]}";
}

Result<std::vector<std::string>> Publisher::StatesOf(uint64_t ino, bool dirty) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (!S_ISREG(rec.mode)) return Invalid("only files have a remote state");
  ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
  std::vector<std::string> out;
  for (size_t t = 0; t < remotes_.size(); ++t) {
    if (dirty) {
      out.emplace_back("local");  // bytes not committed yet
    } else if (staged) {
      out.emplace_back("uploading");  // closed: published once cut into chunks
    } else {
      ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(static_cast<int>(t), ino));
      out.emplace_back(published == kDroppedFromTier ? "dropped"  // past the tier's keep=
                       : published >= rec.generation && published > 0 ? "remote"
                                                                      : "uploading");
    }
  }
  return out;
}

}  // namespace ckptfs
