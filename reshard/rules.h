// Parameter rules: how a tensor of a model is split across tensor-parallel ranks, and the
// geometry that turns a target shard into gathers of source shards' bytes.
//
// The built-in rules cover GPT/Llama-style Megatron-LM models in both naming eras (see
// docs/views.md); a user rules file ("REGEX RULE" per line, first match wins) covers others and is
// checked first. A parameter no rule covers is an error naming it: views never guess.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

enum class Rule : uint8_t {
  kColumn,      // dim 0 in equal chunks
  kSwiglu,      // dim 0 as two halves (gate, up), each in equal chunks
  kRow,         // dim 1 in equal chunks
  kVocab,       // dim 0 of the padded vocabulary
  kReplicated,  // whole on every rank
  kExtraState,  // passed through from one rank (module extra state)
};
std::string_view RuleName(Rule r);

class Rules {
 public:
  // Parses a rules file: "REGEX RULE" per line (RULE: column, swiglu, row, vocab, replicated,
  // extra_state), '#' starts a comment. Errors (kInvalid) name the line.
  static Result<std::shared_ptr<const Rules>> Parse(std::string_view text);
  static std::shared_ptr<const Rules> BuiltIn();
  ~Rules();

  // The rule for the tensor at key path `name` (dot-joined dict keys); `swiglu`: the model's
  // fc1 fuses gate and up. Errors (kInvalid): no rule covers the name.
  Result<Rule> Classify(const std::string& name, bool swiglu) const;

 private:
  struct User;
  std::vector<User> user_;
};

// One source shard of a tensor: where its bytes are (row-major, contiguous) and its shape.
struct Shard {
  uint32_t source = 0;
  uint64_t offset = 0;  // of its first byte in the source file
  std::vector<int64_t> shape;
};

// Vocabulary sizes for kVocab: the full padded rows of the source and of the target.
struct VocabSizes {
  int64_t source_rows = 0;
  int64_t target_rows = 0;
};

// The gathers that make shard t of T of a tensor split by `rule` whose source shards (one per
// source TP rank, in rank order) are `src`, and the target shard's shape. kReplicated and
// kExtraState copy src[0]. Errors (kInvalid, naming `name`): shards that disagree, sizes that T
// does not divide.
Status PlanShard(const std::string& name, Rule rule, const std::vector<Shard>& src, uint32_t itemsize,
                 uint32_t t, uint32_t T, const VocabSizes& vocab, std::vector<Gather>* out,
                 std::vector<int64_t>* shape);

// PlanShard's column (dim 0), row (dim 1) or, with `glu`, two-halves cut along any dimension: for
// tensors no Rule names, such as one expert's block of a grouped expert weight stored transposed.
Status PlanSplit(const std::string& name, size_t dim, bool glu, const std::vector<Shard>& src,
                 uint32_t itemsize, uint32_t t, uint32_t T, std::vector<Gather>* out,
                 std::vector<int64_t>* shape);

// The source TP rank that holds the first element of target shard t of T (for state that is
// not split, such as an optimizer's step count); `vocab` for kVocab.
uint32_t FirstSourceRank(Rule rule, uint32_t source_tp, uint32_t t, uint32_t T,
                         const VocabSizes& vocab = {});

}  // namespace ckptfs::reshard
