// Shared by layout.cc (the listing, DCP and safetensors) and layout_frameworks.cc (Megatron-LM and
// DeepSpeed). Not part of the formats/ API.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "formats/layout.h"

namespace ckptfs::layout::internal {

// Rank numbers at or above this are not taken as ranks, which bounds every grid walked below.
inline constexpr uint64_t kMaxRank = 1 << 20;

// The listing as a tree: every directory (the listed one is "") with its children's names.
class Tree {
 public:
  struct Dir {
    std::vector<std::string> files;    // sorted names
    std::vector<std::string> subdirs;  // sorted names
  };

  // Errors (Code::kInvalid): see Detect().
  static Result<Tree> Build(const std::vector<Entry>& listing);

  const Dir* FindDir(std::string_view path) const;
  const Entry* FindFile(std::string_view path) const;
  const std::map<std::string, Dir, std::less<>>& dirs() const { return dirs_; }

 private:
  std::map<std::string, Dir, std::less<>> dirs_;
  std::map<std::string, const Entry*, std::less<>> files_;
};

// "dir/name", or "name" when dir is the listed directory ("").
std::string Join(std::string_view dir, std::string_view name);

// Matches a file name against a pattern of literal text and number fields "{W}": decimal digits
// as Python's "{:0Wd}" formats a non-negative int (at least W digits, no leading zero beyond the
// padding). Stores up to `max` numbers in order. False on any mismatch or a number above 10^18.
bool MatchName(std::string_view name, std::string_view pattern, uint64_t* nums, size_t max);

// Python's "{:0Wd}".format(n).
std::string Pad(uint64_t n, int width);

void AddProblem(Layout* out, std::string path, std::string message);

// Each fills its part of `out` when its files are present. ScanMegatron leaves the tracker file to
// DeepSpeed when `deepspeed_owns_tracker` (Megatron-DeepSpeed writes it beside DeepSpeed's tags).
void ScanDeepSpeed(const Tree& tree, Layout* out);
void ScanMegatron(const Tree& tree, bool deepspeed_owns_tracker, Layout* out);

}  // namespace ckptfs::layout::internal
