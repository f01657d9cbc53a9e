// Building a synthesized torch file from source pickle trees: mapping helpers for the trees, new
// tensors whose bytes are gathers of source ranges, and deep copies of source subtrees.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

// A dict or an OrderedDict (a call of collections.OrderedDict with SETITEMS).
bool IsMapping(const pickle::ValuePtr& v);
// The key/value pairs of a mapping.
std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>>& PairsOf(pickle::Value& v);
// A key as text: a str as it is, an int in decimal, anything else rendered.
std::string KeyName(const pickle::ValuePtr& k);
// The value of str key `key` in mapping m; nullptr when m is no mapping or lacks it.
pickle::ValuePtr Get(const pickle::ValuePtr& m, std::string_view key);
// A new, empty mapping of m's kind (an OrderedDict keeps its BUILD state).
pickle::ValuePtr EmptyLike(const pickle::ValuePtr& m);
void Put(const pickle::ValuePtr& m, pickle::ValuePtr k, pickle::ValuePtr v);
// A tuple/list of ints, or a torch.Size of one; false for anything else.
bool IntsOf(const pickle::ValuePtr& v, std::vector<int64_t>* out);

// Source tensors by their rebuild call node (TorchTensor::node).
using TensorIndex = std::unordered_map<const pickle::Value*, const TorchTensor*>;
TensorIndex IndexTensors(const TorchFile& f);

// Mapping entries by str key, in order.
using Entries = std::vector<std::pair<std::string_view, pickle::ValuePtr>>;

// One target torch file in the making: the storages its tensors get, in pickle order.
class TorchOut {
 public:
  // A new tensor shaped like source rebuild call `like` (its storage type, location,
  // requires_grad and Parameter wrapping), with a storage of its own of `nbytes` from `gathers`.
  pickle::ValuePtr NewTensor(const pickle::Value& like, std::vector<Gather> gathers,
                             const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                             uint64_t nbytes);
  // A deep copy of v from the file whose tensors are `tensors` (Part::source `source`): every
  // tensor in it gets a storage of its own holding the bytes it spans. Shared nodes stay shared.
  Result<pickle::ValuePtr> Copy(const TensorIndex& tensors, uint32_t source,
                                const pickle::ValuePtr& v);
  // A copy of mapping m (as Copy makes it, key order kept) in which the keys named in `with`
  // hold the given values instead of copies of theirs. REQUIRES: IsMapping(m).
  Result<pickle::ValuePtr> CopyWith(const TensorIndex& tensors, uint32_t source,
                                    const pickle::ValuePtr& m, const Entries& with);
  // CopyWith for a source subtree that is the template of several places in the target (one
  // source sub-group's optimizer state for each sub-group cut from it): the copy shares nothing
  // with earlier or later copies, since the framework writes a separate object for each place
  // and torch's optimizers update state in place (Adam's `step`). Sharing inside m is kept.
  Result<pickle::ValuePtr> CopyWithUnshared(const TensorIndex& tensors, uint32_t source,
                                            const pickle::ValuePtr& m, const Entries& with);
  // Records `location` (e.g. "cpu") for every tensor made from now on, in place of the source's
  // (a file saved after torch.load(map_location='cpu')). Empty: keep the source's.
  void set_location(std::string location) { location_ = std::move(location); }
  // Writes data.pkl (protocol 2) for `root`, the storages, then `extra_records`.
  Result<ViewFile> Finish(const std::string& prefix, const pickle::ValuePtr& root,
                          const std::vector<std::pair<std::string, std::string>>& extra_records);

 private:
  std::vector<std::vector<Gather>> storages_;  // by key
  std::unordered_map<const pickle::Value*, pickle::ValuePtr> memo_;
  std::string location_;
};

}  // namespace ckptfs::reshard
