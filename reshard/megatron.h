// Megatron-LM views: one iteration of a legacy per-rank checkpoint (every rank's
// model_optim_rng.pt) resharded for another TP x PP, file by file, as recipes over the source
// files. The rules are in docs/views.md; this is the planner that follows them.
//
// Pure: the caller parses the source files (ReadTorchFile) and hands them in; the result reads
// only the sources' byte ranges it names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/torch_file.h"
#include "reshard/rules.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

struct MegatronRankFile {
  uint32_t tp = 0, pp = 0;
  uint32_t source = 0;  // the index Part::source uses for this file
  std::shared_ptr<const TorchFile> file;
  // The archive's records other than data.pkl and data/*: (name after the prefix, bytes), in
  // archive order. Copied into the target files.
  std::vector<std::pair<std::string, std::string>> extra_records;
};

struct MegatronSource {
  uint32_t tp = 0, pp = 0;
  std::vector<MegatronRankFile> ranks;  // every (tp, pp), any order
};

// What a target shape needs from the model's args, checked before any file is planned.
struct MegatronModel {
  int64_t num_layers = 0, hidden_size = 0, heads = 0, query_groups = 0, ffn_hidden_size = 0;
  bool swiglu = false;
  bool tied = true;  // untie_embeddings_and_output_weights false or absent
  int64_t vocab_size = 0;  // args.vocab_size, 0 when absent
  int64_t divisible_by = 128;
  int64_t padded_vocab_size = 0;
  bool gqa = false;
};

// Reads the model's description from a rank file's `args`. Errors (kInvalid): no args, a
// required field missing.
Result<MegatronModel> ReadMegatronModel(const TorchFile& f);
// Whether TP=T, PP=P can hold the model; the error names the reason.
Status CheckMegatronTarget(const MegatronModel& m, uint32_t T, uint32_t P);
// Padded vocabulary rows for TP=T (Megatron's _vocab_size_with_padding).
int64_t PaddedVocab(const MegatronModel& m, uint32_t T);

// The target rank directory's name: mp_rank_TT, or mp_rank_TT_PPP when P > 1.
std::string MegatronRankDir(uint32_t t, uint32_t p, uint32_t P);

// Plans every target file of TP=T, PP=P: result[p * T + t] is rank (t, p)'s model_optim_rng.pt,
// CRCs pending. Errors (kInvalid, naming the parameter or the reason): see docs/views.md.
Result<std::vector<ViewFile>> PlanMegatron(const MegatronSource& src, uint32_t T, uint32_t P,
                                           const Rules& rules);

}  // namespace ckptfs::reshard
