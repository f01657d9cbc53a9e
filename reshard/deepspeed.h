// DeepSpeed views: one tag (global_stepN) of a ZeRO checkpoint (stages 1 to 3), re-partitioned
// for another data-parallel size (stages 1/2: and tensor-parallel size), or laid out as the
// universal checkpoint that DeepSpeed's offline converter would write, file by file as recipes
// over the source files. The contract is in docs/views.md.
//
// Pure: the caller parses the source files (ReadTorchFile) and hands them in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/torch_file.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

// A file of the tag directory the views read.
struct DsSourceFile {
  std::string name;      // in the tag directory
  uint32_t source = 0;   // the index Part::source uses for this file
  uint64_t size = 0;     // bytes
  std::shared_ptr<const TorchFile> file;
  // The archive's records other than data.pkl and data/*: (name after the prefix, bytes).
  std::vector<std::pair<std::string, std::string>> extra_records;
};

// A pipeline module's layer file of the tag (IsDeepSpeedLayerName): one layer's state_dict
// (keys relative to the layer) on one TP rank, the same at every data-parallel size.
struct DsLayerFile {
  std::string name;
  uint32_t source = 0;  // the index Part::source uses for this file
  uint64_t size = 0;
  // Parsed only for the views that reshard it (tpT-dpD); null otherwise.
  std::shared_ptr<const TorchFile> file;
  std::vector<std::pair<std::string, std::string>> extra_records;
};

// A file of the checkpoint root that the dpD and tpT-dpD views carry as it is: DeepSpeed's
// engine copies zero_to_fp32.py there at every save (kDsRootFiles).
struct DsRootFile {
  std::string name;
  uint32_t source = 0;  // the index Part::source uses for this file
  uint64_t size = 0;
};
inline constexpr std::string_view kDsRootFiles[] = {"zero_to_fp32.py"};

struct DeepSpeedSource {
  std::string tag;                  // the tag directory, as `latest` names it
  std::vector<DsSourceFile> files;  // its model-states and optimizer-states files, any order
  std::vector<DsLayerFile> layers;  // its layer files (Megatron-DeepSpeed's GPTModelPipe)
  std::vector<DsRootFile> root_files;  // those of kDsRootFiles the root holds
  // Native MoE's expert files and expp_rank optimizer files (IsDeepSpeedMoeName), not parsed.
  std::vector<DsLayerFile> moe_files;
};

// Whether a file of a tag directory is one the views read (mp_rank_TT_model_states.pt,
// [bf16_]zero_pp_rank_D_mp_rank_TT_optim_states.pt, and stage 3's
// zero_pp_rank_D_mp_rank_TT_model_states.pt).
bool IsDeepSpeedSourceName(std::string_view name);

// Whether a file of a tag directory is a pipeline module's layer file
// (layer_XX[-model_TT]-model_states.pt, as DeepSpeed's PipelineModule names them).
bool IsDeepSpeedLayerName(std::string_view name);

// Whether a file of a tag directory is one of native DeepSpeed MoE's (deepspeed.moe.layer.MoE)
// files: an expert's layer_L_expert_G_mp_rank_TT_model_states.pt (or the older
// expert_G_mp_rank_TT_model_states.pt), or expp_rank_E_mp_rank_TT_optim_states.pt.
bool IsDeepSpeedMoeName(std::string_view name);

struct DsSpec {
  enum Kind { kDp, kTpDp, kUniversal } kind = kDp;
  uint32_t T = 0;  // kTpDp: the target tensor-parallel size
  uint32_t D = 0;  // kDp, kTpDp: the target data-parallel size
};
// "dpD", "tpT-dpD" or "universal"; false for anything else.
bool ParseDsSpec(std::string_view s, DsSpec* spec);

// Plans every file of the view `spec` of `src`, in path order (paths relative to the spec
// directory: "latest", "global_step10/mp_rank_00_model_states.pt", ...), CRCs pending. Errors (kInvalid, naming the
// file or the parameter): what the view cannot be made from (see docs/views.md).
Result<std::vector<ViewEntry>> PlanDeepSpeed(const DeepSpeedSource& src, const DsSpec& spec);
// The specs a listing of ROOT/.views offers for `src`: dpD for a few D, and universal.
// Errors: those PlanDeepSpeed gives for the source itself, before any spec.
Result<std::vector<std::string>> DeepSpeedSpecs(const DeepSpeedSource& src);

}  // namespace ckptfs::reshard
