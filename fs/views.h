// The virtual `.views` directories (docs/views.md): a recognized checkpoint directory ROOT shows
// ROOT/.views/SPEC/..., files resharded on read from ROOT's stored files.
//
// Virtual inodes carry kViewInoBit, so they never meet the store's inode numbers; a node, once
// looked up, keeps its number for the life of the mount. Plans are built on lookup of a spec
// (so an impossible one fails there, with the reason in the log) and cached; a view file's
// CRC-32s are computed on its first open (whose caller may keep the bytes that pass read).
// Reads walk the file's recipe and read the source byte ranges through the store: nothing is
// materialized.
//
// Thread-safe: one mutex guards the tree and planning; reads of a planned file take none.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>
#include <mutex>

#include "common/log.h"
#include "reshard/deepspeed.h"
#include "reshard/megatron.h"
#include "formats/dcp.h"
#include "reshard/megatron_hf.h"
#include "reshard/view_file.h"
#include "fs/checkpoint_source.h"
#include "store/store.h"

namespace ckptfs::fs {

inline constexpr uint64_t kViewInoBit = uint64_t{1} << 62;
inline bool IsViewIno(uint64_t ino) { return (ino & kViewInoBit) != 0; }
inline constexpr std::string_view kViewsName = ".views";

struct Sources;  // the stored files a plan reads (views.cc)

class ViewTree {
 public:
  // rules_file: a user rules file (Config::view_rules), "" for the built-in rules only.
  // Errors: the rules file cannot be read or parsed.
  // hf: the hf view's options (its shard size).
  static Result<std::shared_ptr<ViewTree>> Make(CheckpointSource* source, Logger log,
                                                const std::string& rules_file,
                                                const reshard::HfOptions& hf = {});
  ~ViewTree();

  // Whether real directory `dir` holds a checkpoint views are offered for (a name lookup or two).
  bool HasViews(uint64_t dir);
  // ROOT/.views for real directory `root`; kNotFound when it holds no such checkpoint.
  Result<InodeRecord> LookupViews(uint64_t root);
  // Under a virtual directory. An impossible spec is kInvalid, with the reason logged and kept
  // for ViewErrors.
  Result<InodeRecord> Lookup(uint64_t parent, std::string_view name);
  Result<InodeRecord> GetAttr(uint64_t ino);
  Status ReadDir(uint64_t dir, uint64_t offset, const std::function<bool(const DirItem&)>& fn);
  // Readies a view file for reads (its CRCs, once). kIsDir for a directory. The bytes the CRC
  // pass reads go to `seen` (if given), so that the caller can keep them for the reads to come.
  Status Open(uint64_t ino, const reshard::ViewBytesFn& seen = nullptr);
  // Appends slices of bytes [offset, offset + len) of view file `ino` to *out, without copying:
  // literal bytes and the source chunks' buffers, kept alive by the slices. REQUIRES: Open
  // succeeded.
  Status Read(uint64_t ino, uint64_t offset, size_t len, std::vector<ReadSlice>* out);
  // The ids (in the tree's CheckpointSource) of the source files view file `ino` reads.
  Result<std::vector<uint64_t>> SourceIds(uint64_t ino);
  // The reasons the specs looked up under `.views` directory `ino` failed, one "SPEC: reason"
  // line each (user.ckptfs.view_errors); kNoData when none failed.
  Result<std::string> ViewErrors(uint64_t ino);

  struct Node;
  struct Body;

 private:
  ViewTree(CheckpointSource* source, Logger log, std::shared_ptr<const reshard::Rules> rules,
           const reshard::HfOptions& hf);
  Node* Get(uint64_t ino);  // REQUIRES: mu_ held
  Result<std::shared_ptr<Body>> BodyOf(uint64_t ino);  // a view file's; takes mu_
  Node* AddChild(Node* parent, std::string name, int type);  // REQUIRES: mu_ held
  Result<InodeRecord> Attr(const Node& n);
  Status MakeSpec(Node* views, const std::string& spec, Node** out);  // REQUIRES: mu_ held
  // Whether a node still matches the stored checkpoint (the tracker's bytes, the source files'
  // manifests). REQUIRES: mu_ held.
  bool Fresh(const Node& n);
  Status PlanMegatronIter(Node* iter);  // REQUIRES: mu_ held
  Status PlanMegatronHf(Node* spec);    // REQUIRES: mu_ held
  // The rank files of iteration directory `iter_name` of `root`, read into *sources.
  // `with_distrib`: also the distributed optimizer's distrib_optim.pt files (tpT-ppP views).
  Result<reshard::MegatronSource> ReadMegatronIter(uint64_t root, const std::string& iter_name,
                                                   Sources* sources, bool with_distrib = false);
  Status PlanDcp(Node* spec);           // REQUIRES: mu_ held
  Status PlanDeepSpeed(Node* spec);     // REQUIRES: mu_ held
  // Makes spec's tree of `entries` (directories as their paths name them), reading `sources`,
  // and marks it planned. REQUIRES: mu_ held.
  void PlanTree(Node* spec, std::vector<reshard::ViewEntry> entries,
                std::shared_ptr<Sources> sources);
  // The files of the tag `latest` in `root` names, read into *sources; the layer files parsed
  // too with `parse_layers`.
  Result<reshard::DeepSpeedSource> ReadDeepSpeed(uint64_t root, Sources* sources,
                                                 std::string* latest, bool parse_layers = false);
  // The tag directory DeepSpeed's `latest` in `root` names, when it holds a model-states file;
  // *latest (if given) gets the file's bytes.
  Result<std::string> DeepSpeedTag(uint64_t root, std::string* latest);
  Result<std::string> ReadReal(uint64_t ino, uint64_t max_len);
  // The bytes of Megatron's tracker file in `root`.
  Result<std::string> ReadTracker(uint64_t root);
  // Asks the store to load the chunks of `source` after byte `reached` (readahead).
  void WarmAhead(Body& body, uint32_t source, uint64_t reached);
  // The model's shape, from a rank file (or torch_dist's common state) of the iteration the
  // tracker names.
  Result<reshard::MegatronModel> ReadModel(uint64_t root);
  // A torch_dist iteration: its common state (args; `md`, its .metadata when already parsed), and
  // its model tensors with the data files read into *sources.
  Result<TorchFile> ReadTorchDistCommon(uint64_t iter, const std::string& iter_name,
                                        const dcp::Metadata* md);
  Result<reshard::MegatronTensors> ReadTorchDist(uint64_t root, const std::string& iter_name,
                                                 Sources* sources);

  CheckpointSource* source_;  // outlives the tree
  Logger log_;
  std::shared_ptr<const reshard::Rules> rules_;
  reshard::HfOptions hf_options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Node>> nodes_;          // guarded by mu_; index = ino & ~kViewInoBit
  std::unordered_map<uint64_t, uint64_t> views_of_;   // guarded by mu_: real root -> .views ino
};

}  // namespace ckptfs::fs
