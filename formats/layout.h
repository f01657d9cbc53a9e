// Which checkpoint layout a directory holds, read from its listing alone.
//
// Training frameworks write a checkpoint as a directory tree whose file names encode the
// parallelism (tensor, pipeline, data, expert ranks) and small tracker files that name the latest
// step. ckptfs recognizes these layouts to offer resharded views and to prefetch, without opening
// the large files. The names follow the frameworks' save code exactly (cited in layout.cc next to
// each pattern); a name that deviates from it is not recognized rather than guessed at.
//
// Pure: the caller lists the directory (recursively) and passes the contents of the few small
// files WantsContent() names; nothing here touches a filesystem.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ckptfs::layout {

struct Entry {
  std::string path;  // relative to the listed directory, '/'-separated: "iter_0000100/mp_rank_00"
  bool is_dir = false;
  uint64_t size = 0;  // a file's bytes; detection goes by names and does not use it yet
  std::optional<std::string> content;  // the file's bytes, when the caller read them
};

// Whether Detect() looks at this file's content (tracker files, the sharded-safetensors index);
// `path` is relative to the listed directory. Callers read these (they are small) and pass them.
bool WantsContent(std::string_view path);

enum class Kind : uint8_t {
  kUnknown,
  kMegatron,       // Megatron-LM: iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
  kDeepSpeed,      // DeepSpeed: <tag>/mp_rank_TT_model_states.pt, zero_pp_rank_* files, `latest`
  kDcp,            // torch.distributed.checkpoint: .metadata + __R_N.distcp
  kHfSafetensors,  // model.safetensors or model-0000i-of-0000n.safetensors (+ index json)
};
std::string_view KindName(Kind k);

// Something a loader would trip over: a rank file missing from a grid, a tracker naming a step that
// is not there. Detection still describes what it found.
struct Problem {
  std::string path;  // the directory or file concerned ("" for the listed directory)
  std::string message;
};

// How a Megatron iteration names its rank directories.
enum class RankNaming : uint8_t {
  kNone,    // no rank directories
  kTp,      // mp_rank_TT: tensor parallel only
  kTpX,     // mp_rank_TT_XXX: Megatron writes this both for pipeline parallel without expert
            // parallel and for expert parallel without pipeline parallel; the names cannot tell
            // which (Megatron's own loader probes for files). `pp` holds the XXX axis's size.
  kTpPpEp,  // mp_rank_TT_PPP_EEE
  kMixed,   // more than one of the above in one iteration (a problem is reported)
};

struct MegatronIteration {
  std::string dir;         // "iter_0000100" or "release"
  int64_t iteration = -1;  // -1 for release
  bool release = false;
  RankNaming naming = RankNaming::kNone;
  uint32_t tp = 0, pp = 0, ep = 0;  // grid sizes (largest rank + 1); 1 for an axis not in names
  bool distrib_optim = false;       // distrib_optim.pt beside model_optim_rng.pt (dist. optimizer)
  bool dist_checkpoint = false;     // metadata.json: Megatron's dist_checkpointing format
  bool complete = false;            // every grid cell holds model_optim_rng.pt (or dist_checkpoint)
};

struct MegatronLayout {
  bool has_tracker = false;                  // latest_checkpointed_iteration.txt exists
  std::optional<std::string> tracker;        // its content, stripped, when supplied
  std::optional<int64_t> tracker_iteration;  // parsed as Megatron's read_metadata() parses it
  bool tracker_release = false;
  std::vector<MegatronIteration> iterations;  // release first, then by iteration
};

enum class ZeroStage : uint8_t {
  kNone,      // no partitioned optimizer files
  kOneOrTwo,  // [bf16_]zero_pp_rank_D_mp_rank_TT_optim_states.pt; stages 1 and 2 (and the bf16
              // optimizer at stage 0) name their files alike
  kThree,     // also zero_pp_rank_D_mp_rank_TT_model_states.pt: parameters partitioned
};
std::string_view ZeroStageName(ZeroStage z);

struct DeepSpeedTag {
  std::string tag;                     // the directory name, usually "global_step{N}"
  std::optional<int64_t> global_step;  // N when the tag is global_step{N}
  uint32_t mp_size = 0;  // model-parallel ranks in the file names; under the pipeline engine this
                         // is TP x PP (DeepSpeed numbers mp ranks within the pipe x model group)
  uint32_t dp_size = 0;  // data-parallel ranks of the ZeRO partition files (0: none)
  ZeroStage zero = ZeroStage::kNone;
  bool bf16 = false;                // the optimizer files carry the bf16_ prefix
  uint32_t pipeline_layers = 0;     // distinct layer_NN in pipeline layer files
  uint32_t layer_tp_size = 0;       // model_TT ranks in those files (1 when not in the names)
  uint32_t expert_files = 0;        // MoE expert model-state files
  uint32_t expert_optim_files = 0;  // MoE expp_rank_* optimizer files
  bool universal = false;           // a zero/ directory: ds_to_universal output
  bool complete = false;            // every expected rank file is present
};

struct DeepSpeedLayout {
  bool has_latest = false;  // the `latest` tag file exists
  std::optional<std::string> latest;
  bool has_latest_universal = false;
  std::optional<std::string> latest_universal;
  // Megatron-DeepSpeed also writes Megatron's tracker file beside DeepSpeed's tags.
  bool has_megatron_tracker = false;
  std::optional<std::string> megatron_tracker;
  std::vector<DeepSpeedTag> tags;  // by global step, then by name
};

struct DcpCheckpoint {
  std::string dir;            // "" for the listed directory itself
  bool has_metadata = false;  // `.metadata`: written last (renamed from .metadata.tmp)
  uint32_t ranks = 0;         // distinct R in __R_N.distcp (R is the rank's plan index)
  uint32_t files = 0;         // .distcp files
  bool complete = false;      // .metadata present and no save in flight
};

struct HfModel {
  std::string prefix;        // "model" for model.safetensors / model-00001-of-00002.safetensors
  bool single_file = false;  // <prefix>.safetensors exists
  uint32_t shard_count = 0;  // n of -0000i-of-0000n (0: not sharded)
  std::vector<std::string> shards;           // shard files present, in order
  bool has_index = false;                    // <prefix>.safetensors.index.json exists
  std::optional<uint64_t> index_total_size;  // its metadata.total_size, when supplied
  std::optional<uint64_t> index_tensors;     // entries of its weight_map, when supplied
  bool complete = false;  // all n shards present (and all the index names), or a single file
};

struct Layout {
  Kind kind = Kind::kUnknown;  // the primary layout; see below
  // Every layout whose files are present is described, since one directory can hold several
  // (a safetensors export beside a DeepSpeed tag, DCP data inside Megatron iterations). `kind`
  // picks one in this order: DeepSpeed, Megatron, safetensors, DCP.
  std::optional<MegatronLayout> megatron;
  std::optional<DeepSpeedLayout> deepspeed;
  std::vector<DcpCheckpoint> dcp;  // every directory holding DCP files, sorted
  std::vector<HfModel> hf;         // one per prefix, sorted
  std::vector<Problem> problems;   // sorted by path
};

// Errors (Code::kInvalid): a malformed listing: an empty, absolute or non-normalized path ("a//b",
// "./a", "a/.."), a path listed twice, a file that is also a parent directory.
Result<Layout> Detect(const std::vector<Entry>& listing);

// A deterministic, line-per-fact rendering for logs, tests and `ckptfs inspect`.
std::string Describe(const Layout& layout);

}  // namespace ckptfs::layout
