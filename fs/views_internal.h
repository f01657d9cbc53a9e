// What fs/views.cc and fs/views_megatron.cc share: the view tree's nodes, the stored files a plan
// reads, and the helpers that read them. Internal to fs/views*.cc.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/torch_file.h"
#include "formats/zip.h"
#include "fs/views.h"
#include "fs/checkpoint_source.h"
#include "store/store.h"

namespace ckptfs::fs {

// The refused names a .views directory remembers for user.ckptfs.view_errors.
inline constexpr size_t kMaxViewErrors = 64;
inline constexpr std::string_view kTracker = "latest_checkpointed_iteration.txt";
inline constexpr std::string_view kDcpMetadata = ".metadata";
inline constexpr std::string_view kRankFile = "model_optim_rng.pt";
inline constexpr std::string_view kDistribFile = "distrib_optim.pt";  // the distributed optimizer
inline constexpr std::string_view kTorchDistConfig = "metadata.json";  // dist_checkpointing's
inline constexpr std::string_view kTorchDistCommon = "common.pt";
inline constexpr std::string_view kDsLatest = "latest";  // DeepSpeed's tag file
inline constexpr std::string_view kDsModelStates = "mp_rank_00_model_states.pt";
inline constexpr std::string_view kDsZero3ModelStates = "zero_pp_rank_0_mp_rank_00_model_states.pt";
inline constexpr uint64_t kMaxSmallFile = 64 << 20;  // tracker, .metadata, extra zip records
inline constexpr size_t kCrcThreads = 4;              // records whose CRCs one open computes at once
enum Type { kViewsDir, kSpecDir, kIterDir, kRankDir, kFile, kTreeDir };
enum class Kind { kMegatron, kMegatronHf, kDcp, kDeepSpeed };  // kMegatronHf: the hf spec

// The source files a plan reads: their ids and the versions it was planned against.
struct Sources {
  std::vector<uint64_t> inos;
  std::vector<std::shared_ptr<const SourceFile>> files;
  // Per source: data offset -> (length, CRC-32) of each zip record, for KnownCrcFn.
  std::vector<std::map<uint64_t, std::pair<uint64_t, uint32_t>>> records;
  uint32_t Add(uint64_t ino, std::shared_ptr<const SourceFile> f) {
    inos.push_back(ino);
    files.push_back(std::move(f));
    records.emplace_back();
    return static_cast<uint32_t>(inos.size() - 1);
  }
};

struct ViewTree::Body {
  std::mutex mu;
  bool ready = false;  // CRCs computed; guarded by mu, then read-only
  reshard::ViewFile file;
  std::shared_ptr<Sources> sources;  // null for a literal-only file
  // Readahead: per source, the offset up to which chunks have been asked for.
  std::mutex warm_mu;
  std::vector<uint64_t> warmed;  // guarded by warm_mu
};

struct ViewTree::Node {
  uint64_t ino = 0, parent = 0;
  int type = kViewsDir;
  Kind kind = Kind::kMegatron;
  uint64_t root = 0;  // the real checkpoint directory
  std::string name, spec;
  // The target's TP, PP and EP (spec and below; E 0 in a spec without ep: the source's, which
  // the iteration directory's planning sets there).
  uint32_t T = 0, P = 0, E = 0;
  std::map<std::string, uint64_t> children;  // looked up so far
  bool planned = false;
  std::vector<std::shared_ptr<Body>> plan;  // kIterDir: per target rank ((p * E + e) * T + t)
  std::shared_ptr<Body> body;               // kFile
  uint32_t t = 0, p = 0, e = 0;             // kRankDir
  std::map<std::string, std::string> errors;  // kViewsDir: spec -> why it failed (bounded)
  std::string tracker;  // the tracker file's bytes, for its view copy; DeepSpeed: `latest`'s
  std::shared_ptr<Sources> sources;  // a DeepSpeed spec's: what its files read
};

// Random access to one version of a source file.
zip::ReadAtFn ReadAtOf(std::shared_ptr<const SourceFile> f);
// The iteration directory a tracker file's bytes name ("iter_0000100" or "release").
Result<std::string> TrackedIteration(std::string tracker);
// Reads stored torch file `index` of `sources` (`where` names it in errors): its parse, the CRCs
// of its records (for KnownCrcFn), and its records other than data.pkl and data/*, which view
// files copy.
Result<std::shared_ptr<const TorchFile>> ReadSourceTorch(
    Sources* sources, uint32_t index, const std::string& where,
    std::vector<std::pair<std::string, std::string>>* extra_records);
// "iter_NNNNNNN" (seven digits) or "release".
bool IsIterationName(std::string_view n);
// "mp_rank_TT", "mp_rank_TT_NNN" or "mp_rank_TT_PPP_EEE": the numbers (1 to 3 of them). With
// two, the second is the pipeline rank or, without pipeline parallelism, the expert-parallel
// rank: only the checkpoint's args tell.
bool ParseRankDir(std::string_view n, std::vector<uint32_t>* numbers);

}  // namespace ckptfs::fs
