#include "reshard/megatron_distopt.h"

#include <algorithm>
#include <numeric>

#include "reshard/megatron_args.h"

namespace ckptfs::reshard {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

Result<DistOptSource> ReadOneState(const TorchFile& f, const TensorIndex& tensors,
                                   const ValuePtr& root, uint32_t source,
                                   const std::string& where) {
  auto bad = [&](const std::string& why) { return Invalid(where + ": " + why); };
  if (!IsMapping(root)) return bad("does not hold a dict");
  ValuePtr coalesced = Get(root, "buckets_coalesced");
  if (!coalesced || coalesced->kind != Kind::kBool || !coalesced->b) {
    return bad("is in the per-bucket layout Megatron wrote before 2024 ('buckets_coalesced' "
               "absent), which views do not reshard");
  }
  ValuePtr buffer;
  size_t buffers = 0;
  for (const auto& [k, v] : PairsOf(*root)) {
    if (k->kind == Kind::kInt) {
      ++buffers;
      if (k->i == 0) buffer = v;
    } else if (KeyName(k) != "buckets_coalesced") {
      return bad("has an unknown key '" + KeyName(k) + "'");
    }
  }
  if (buffers != 1 || !buffer) {
    return bad("holds " + std::to_string(buffers) +
               " parameter buffers; views reshard one (one model chunk, one dtype)");
  }
  if (!IsMapping(buffer) || PairsOf(*buffer).size() != 1) {
    return bad("buffer 0 holds other than one (param dtype, grad dtype) entry");
  }
  const auto& [key, world] = PairsOf(*buffer)[0];
  if (!IsMapping(world)) return bad("buffer 0's state is not a dict");
  DistOptSource out;
  out.source = source;
  out.file = &f;
  out.tensors = tensors;
  out.dtype_key = key;
  bool have_numel = false;
  for (const auto& [k, v] : PairsOf(*world)) {
    const std::string name = KeyName(k);
    if (name == "numel_unpadded") {
      if (v->kind != Kind::kInt || v->i < 0) return bad("numel_unpadded is not a count");
      out.numel_unpadded = v->i;
      have_numel = true;
      continue;
    }
    auto it = out.tensors.find(v.get());
    if (it == out.tensors.end()) return bad("'" + name + "' is not a tensor");
    const TorchTensor* t = it->second;
    if (t->dtype != "float32" || t->shape.size() != 1 || !IsContiguous(t->shape, t->stride)) {
      return bad("'" + name + "' is not a flat float32 tensor");
    }
    out.states.emplace_back(name, t);
  }
  if (!have_numel) return bad("has no numel_unpadded");
  if (out.states.empty() || out.states[0].first != "param") {
    return bad("has no 'param' tensor ahead of the optimizer's state");
  }
  for (const auto& [name, t] : out.states) {
    if (t->shape[0] != out.numel_unpadded) {
      return bad("'" + name + "' holds " + std::to_string(t->shape[0]) + " elements, not " +
                 "numel_unpadded " + std::to_string(out.numel_unpadded));
    }
  }
  return out;
}

}  // namespace

Result<DistOptStates> ReadDistOpt(const TorchFile& f, uint32_t source, const std::string& where) {
  const TensorIndex tensors = IndexTensors(f);
  DistOptStates out;
  if (f.root && f.root->kind == Kind::kList) {
    out.list = true;
    for (size_t i = 0; i < f.root->items.size(); ++i) {
      const ValuePtr& v = f.root->items[i];
      if (!v || v->kind == Kind::kNone) {
        out.subs.emplace_back();
        continue;
      }
      ASSIGN_OR_RETURN(DistOptSource s, ReadOneState(f, tensors, v, source,
                                                     where + " (optimizer " + std::to_string(i) +
                                                         ")"));
      out.subs.emplace_back(std::move(s));
    }
    return out;
  }
  ASSIGN_OR_RETURN(DistOptSource s, ReadOneState(f, tensors, f.root, source, where));
  out.subs.emplace_back(std::move(s));
  return out;
}

DistOptLayout LayoutDistOpt(const std::vector<DistOptParam>& params,
                            std::optional<int64_t> bucket_size) {
  // Offsets relative to the bucket's start: a bucket starts at a multiple of lcm(DP, 128) in
  // Megatron's buffer, so a start padded to 64 there is padded to 64 relative to the bucket.
  auto pad64 = [](int64_t x) { return (x + 63) / 64 * 64; };
  DistOptLayout out;
  out.offset.assign(params.size(), 0);
  int64_t base = 0;   // the bucket's start in the flat tensors
  int64_t start = 0;  // the next parameter's start, relative to the bucket
  int64_t end = 0;
  bool open = false;
  auto close = [&](int64_t at) {
    base += at;
    ++out.buckets;
    start = 0;
    open = false;
  };
  for (size_t n = params.size(); n-- > 0;) {
    const DistOptParam& p = params[n];
    start = pad64(start);
    if (p.shared_embedding && open) close(start);
    end = start + p.numel;
    out.offset[n] = base + start;
    open = true;
    if ((bucket_size && end >= *bucket_size) || p.shared_embedding) {
      close(end);
    } else {
      start = end;
    }
  }
  if (open) close(end);
  out.numel_unpadded = base;
  return out;
}

Result<std::optional<int64_t>> DistOptBucketSize(const std::vector<DistOptParam>& params,
                                                 const ValuePtr& args, uint32_t pp) {
  int64_t num_parameters = 0;
  bool aligned = true;
  for (const DistOptParam& p : params) {
    num_parameters += p.numel;
    aligned &= p.numel % 64 == 0;
  }
  if (aligned) return std::optional<int64_t>();
  ValuePtr d = ArgsDict(args);
  if (!d) return Invalid("the rank file has no args");
  if (!Get(d, "overlap_grad_reduce")) {
    return Invalid("args.overlap_grad_reduce is absent: the distributed optimizer's bucket layout "
                   "depends on it");
  }
  if (!BoolArg(d, "overlap_grad_reduce") || pp > 0 ||
      BoolArg(d, "overlap_param_gather_with_optimizer_step")) {
    return std::optional<int64_t>();
  }
  if (auto n = IntArg(d, "ddp_num_buckets"); n && *n > 0) {
    return std::optional<int64_t>(num_parameters / *n);
  }
  if (auto size = IntArg(d, "ddp_bucket_size"); size && *size > 0) {
    return std::optional<int64_t>(*size);
  }
  auto dp = IntArg(d, "data_parallel_size");
  if (!dp) {
    return Invalid("args.data_parallel_size is absent: the default bucket size depends on it");
  }
  // The data-parallel group of the gradient buffers spans the context-parallel ranks too.
  const int64_t cp = std::max<int64_t>(1, IntArg(d, "context_parallel_size").value_or(1));
  return std::optional<int64_t>(std::max<int64_t>(40000000, 1000000 * *dp * cp));
}

namespace {

Result<ValuePtr> WriteOneState(TorchOut* out, const DistOptPlan& plan) {
  const DistOptSource& like = *plan.like;
  const DistOptLayout& layout = plan.layout;
  // The parameters in the order of their offsets (reverse registration order).
  std::vector<size_t> order(plan.numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return layout.offset[a] < layout.offset[b]; });
  const uint64_t n = static_cast<uint64_t>(layout.numel_unpadded);
  ValuePtr world = pickle::MakeDict({});
  for (size_t s = 0; s < like.states.size(); ++s) {
    std::vector<Gather> flat;
    uint64_t at = 0;  // elements placed so far
    for (size_t i : order) {
      const uint64_t off = static_cast<uint64_t>(layout.offset[i]);
      if (off < at) return Invalid("distributed optimizer layout: parameters overlap");
      if (off > at) flat.push_back(Gather{.rows = 1, .parts = {}, .zeros = (off - at) * 4});
      for (const Gather& g : plan.gathers[s][i]) flat.push_back(g);
      at = off + static_cast<uint64_t>(plan.numels[i]);
    }
    if (at > n) return Invalid("distributed optimizer layout: parameters past numel_unpadded");
    if (at < n) flat.push_back(Gather{.rows = 1, .parts = {}, .zeros = (n - at) * 4});
    const TorchTensor& t = *like.states[s].second;
    Put(world, pickle::MakeStr(like.states[s].first),
        out->NewTensor(*t.node, std::move(flat), {static_cast<int64_t>(n)}, {1}, n * 4));
  }
  Put(world, pickle::MakeStr("numel_unpadded"), pickle::MakeInt(layout.numel_unpadded));
  ASSIGN_OR_RETURN(ValuePtr key, out->Copy(like.tensors, like.source, like.dtype_key));
  ValuePtr root = pickle::MakeDict({});
  Put(root, pickle::MakeStr("buckets_coalesced"), pickle::MakeBool(true));
  Put(root, pickle::MakeInt(0), pickle::MakeDict({{key, world}}));
  return root;
}

}  // namespace

Result<ViewFile> WriteDistOpt(const std::string& prefix, const std::vector<DistOptPlan>& subs,
                              bool list,
                              const std::vector<std::pair<std::string, std::string>>& extra_records) {
  TorchOut out;
  std::vector<ValuePtr> items;
  for (const DistOptPlan& plan : subs) {
    if (!plan.like) {
      items.push_back(pickle::MakeNone());
      continue;
    }
    ASSIGN_OR_RETURN(ValuePtr v, WriteOneState(&out, plan));
    items.push_back(std::move(v));
  }
  if (!list && (items.size() != 1 || !subs[0].like)) {
    return Internal("distrib_optim.pt: one state expected");
  }
  return out.Finish(prefix, list ? pickle::MakeList(std::move(items)) : items[0], extra_records);
}

}  // namespace ckptfs::reshard
