#include "store/retention.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

namespace ckptfs {
namespace {

std::optional<uint64_t> Number(const std::string& s) {
  if (s.empty() || s.size() > 19 || !std::all_of(s.begin(), s.end(), ::isdigit)) return {};
  return std::stoull(s);
}

// The last run of digits in a name ("step_100" -> 100).
std::optional<uint64_t> LastNumber(const std::string& name) {
  size_t end = name.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
  return Number(name.substr(begin, end - begin));
}

std::optional<uint64_t> StepOf(const CheckpointDir& d) {
  if (d.name.rfind("iter_", 0) == 0) return Number(d.name.substr(5));
  if (d.name.rfind("global_step", 0) == 0) return Number(d.name.substr(11));
  if (d.dcp_metadata) return LastNumber(d.name);
  return {};
}

}  // namespace

bool IsRecognizedCheckpoint(const CheckpointDir& d) { return StepOf(d) || d.dcp_metadata; }

std::vector<RetentionDecision> DecideRetention(const std::vector<CheckpointDir>& dirs,
                                               const Trackers& trackers,
                                               const RetentionPolicy& policy) {
  std::vector<const CheckpointDir*> recognized, plain;
  for (const CheckpointDir& d : dirs) (IsRecognizedCheckpoint(d) ? recognized : plain).push_back(&d);
  std::vector<const CheckpointDir*> ckpts = recognized.empty() ? plain : recognized;
  const bool by_step = !recognized.empty() &&
                       std::all_of(ckpts.begin(), ckpts.end(), [](auto* d) { return StepOf(*d); });
  std::sort(ckpts.begin(), ckpts.end(), [&](const CheckpointDir* a, const CheckpointDir* b) {
    if (by_step) return *StepOf(*a) < *StepOf(*b);
    return a->mtime_ns != b->mtime_ns ? a->mtime_ns < b->mtime_ns : a->name < b->name;
  });

  std::set<std::string> tracked;
  if (!trackers.megatron.empty()) {
    if (auto n = Number(trackers.megatron)) {
      char name[32];
      std::snprintf(name, sizeof(name), "iter_%07llu", static_cast<unsigned long long>(*n));
      tracked.insert(name);
    } else {
      tracked.insert(trackers.megatron);  // "release"
    }
  }
  for (const std::string* tag : {&trackers.deepspeed, &trackers.universal}) {
    if (!tag->empty()) tracked.insert(*tag);
  }

  std::vector<RetentionDecision> out;
  for (size_t i = 0; i < ckpts.size(); ++i) {
    RetentionDecision c{ckpts[i]->name, ckpts[i]->ino, StepOf(*ckpts[i]), ""};
    if (i + policy.keep_last >= ckpts.size()) {
      c.keep = "newest " + std::to_string(policy.keep_last);
    } else if (policy.keep_every && c.step && *c.step % policy.keep_every == 0) {
      c.keep = "every " + std::to_string(policy.keep_every);
    } else if (tracked.count(c.name)) {
      c.keep = "named by a tracker file";
    }
    out.push_back(std::move(c));
  }
  return out;
}

Result<RetentionPolicy> ParseRetainXattr(std::string_view value) {
  RetentionPolicy p;
  bool have_last = false;
  size_t start = 0;
  const std::string v(value);
  while (start < v.size()) {
    size_t end = v.find_first_of(", ", start);
    if (end == std::string::npos) end = v.size();
    const std::string item = v.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string num = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (num.empty() || num.size() > 18 || num.find_first_not_of("0123456789") != std::string::npos) {
      return Invalid("user.ckptfs.retain: '" + item + "' is not KEY=COUNT");
    }
    if (key == "keep_last") {
      p.keep_last = std::stoull(num);
      have_last = true;
    } else if (key == "keep_every") {
      p.keep_every = std::stoull(num);
    } else {
      return Invalid("user.ckptfs.retain: unknown key '" + key + "' (keep_last, keep_every)");
    }
  }
  if (!have_last || p.keep_last == 0) {
    return Invalid("user.ckptfs.retain needs keep_last=N with N >= 1");
  }
  return p;
}

}  // namespace ckptfs
