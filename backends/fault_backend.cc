#include "backends/fault_backend.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>
#include <utility>

namespace ckptfs {

namespace {

struct OpName {
  uint32_t bit;
  const char* name;
};
constexpr OpName kOpNames[] = {
    {kOpPut, "put"}, {kOpGet, "get"}, {kOpHead, "head"}, {kOpDelete, "delete"}, {kOpList, "list"}};

bool ValidProbability(double p) { return p >= 0 && p <= 1; }  // false for NaN too

Status ParseDouble(std::string_view key, std::string_view v, double* out) {
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty() || !std::isfinite(*out)) {
    return Invalid("fault spec: " + std::string(key) + "=" + std::string(v) + " is not a number");
  }
  return Status::Ok();
}

Status ParseUint(std::string_view key, std::string_view v, uint64_t* out) {
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty()) {
    return Invalid("fault spec: " + std::string(key) + "=" + std::string(v) +
                   " is not a non-negative integer");
  }
  return Status::Ok();
}

Status ParseOps(std::string_view v, uint32_t* out) {
  *out = 0;
  if (v == "all") {
    *out = kOpAll;
    return Status::Ok();
  }
  while (true) {
    size_t plus = v.find('+');
    std::string_view name = v.substr(0, plus);
    uint32_t bit = 0;
    for (const OpName& op : kOpNames) {
      if (name == op.name) bit = op.bit;
    }
    if (bit == 0) {
      return Invalid("fault spec: unknown operation '" + std::string(name) +
                     "' in ops (put, get, head, delete, list joined by '+', or all)");
    }
    *out |= bit;
    if (plus == std::string_view::npos) return Status::Ok();
    v.remove_prefix(plus + 1);
  }
}

std::string FormatDouble(double d) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);  // shortest form that reads back
  return ec == std::errc() ? std::string(buf, end) : "nan";
}

}  // namespace

Status FaultSpec::Validate() const {
  const std::pair<const char*, double> probs[] = {
      {"fail", fail}, {"truncate", truncate}, {"flip", flip}, {"delay", delay}};
  for (const auto& [name, p] : probs) {
    if (!ValidProbability(p)) {
      return Invalid("fault spec: " + std::string(name) + "=" + FormatDouble(p) +
                     " is not a probability in [0, 1]");
    }
  }
  // A little slack, so that 0.1 + 0.2 + 0.7 does not fail on rounding.
  if (fail + truncate + flip > 1 + 1e-9) {
    return Invalid("fault spec: fail + truncate + flip = " + FormatDouble(fail + truncate + flip) +
                   " exceeds 1 (at most one of them hits a call)");
  }
  if (delay_ms > kMaxDelayMs) {
    return Invalid("fault spec: delay_ms=" + std::to_string(delay_ms) + " exceeds " +
                   std::to_string(kMaxDelayMs));
  }
  if (ops == 0 || (ops & ~static_cast<uint32_t>(kOpAll)) != 0) {
    return Invalid("fault spec: ops must name some of put, get, head, delete, list");
  }
  return Status::Ok();
}

Result<FaultSpec> FaultSpec::Parse(std::string_view text) {
  FaultSpec spec;
  std::set<std::string, std::less<>> seen;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) {
      return Invalid("fault spec: trailing ','");
    }
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Invalid("fault spec: '" + std::string(item) + "' is not key=value");
    }
    std::string_view key = item.substr(0, eq);
    std::string_view v = item.substr(eq + 1);
    if (!seen.emplace(key).second) {
      return Invalid("fault spec: '" + std::string(key) + "' given twice");
    }
    uint64_t u = 0;
    if (key == "fail") {
      RETURN_IF_ERROR(ParseDouble(key, v, &spec.fail));
    } else if (key == "truncate") {
      RETURN_IF_ERROR(ParseDouble(key, v, &spec.truncate));
    } else if (key == "flip") {
      RETURN_IF_ERROR(ParseDouble(key, v, &spec.flip));
    } else if (key == "delay") {
      RETURN_IF_ERROR(ParseDouble(key, v, &spec.delay));
    } else if (key == "delay_ms") {
      RETURN_IF_ERROR(ParseUint(key, v, &u));
      if (u > kMaxDelayMs) {
        return Invalid("fault spec: delay_ms=" + std::string(v) + " exceeds " +
                       std::to_string(kMaxDelayMs));
      }
      spec.delay_ms = static_cast<uint32_t>(u);
    } else if (key == "seed") {
      RETURN_IF_ERROR(ParseUint(key, v, &spec.seed));
    } else if (key == "count") {
      RETURN_IF_ERROR(ParseUint(key, v, &spec.count));
    } else if (key == "ops") {
      RETURN_IF_ERROR(ParseOps(v, &spec.ops));
    } else {
      return Invalid("fault spec: unknown key '" + std::string(key) +
                     "' (fail, truncate, flip, delay, delay_ms, seed, count, ops)");
    }
  }
  RETURN_IF_ERROR(spec.Validate());
  return spec;
}

std::string FaultSpec::ToString() const {
  std::string s = "fail=" + FormatDouble(fail) + ",truncate=" + FormatDouble(truncate) +
                  ",flip=" + FormatDouble(flip) + ",delay=" + FormatDouble(delay) +
                  ",delay_ms=" + std::to_string(delay_ms) + ",seed=" + std::to_string(seed) +
                  ",count=" + std::to_string(count) + ",ops=";
  if (ops == kOpAll) return s + "all";
  const char* sep = "";
  for (const OpName& op : kOpNames) {
    if (ops & op.bit) {
      s += sep;
      s += op.name;
      sep = "+";
    }
  }
  return s;
}

FaultBackend::FaultBackend(Backend* base) : base_(base), rng_(spec_.seed) {}

FaultBackend::FaultBackend(std::unique_ptr<Backend> base)
    : owned_(std::move(base)), base_(owned_.get()), rng_(spec_.seed) {}

Result<std::unique_ptr<FaultBackend>> FaultBackend::Wrap(std::unique_ptr<Backend> base,
                                                         std::string_view spec_text) {
  ASSIGN_OR_RETURN(FaultSpec spec, FaultSpec::Parse(spec_text));
  auto fb = std::make_unique<FaultBackend>(std::move(base));
  RETURN_IF_ERROR(fb->SetSpec(spec));
  return fb;
}

Status FaultBackend::SetSpec(const FaultSpec& spec) {
  RETURN_IF_ERROR(spec.Validate());
  std::lock_guard lock(mu_);
  spec_ = spec;
  rng_.seed(spec.seed);
  injected_ = 0;
  return Status::Ok();
}

FaultSpec FaultBackend::spec() const {
  std::lock_guard lock(mu_);
  return spec_;
}

FaultCounts FaultBackend::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

bool FaultBackend::TakeLocked() {
  if (spec_.count != 0 && injected_ >= spec_.count) return false;
  ++injected_;
  return true;
}

double FaultBackend::UniformLocked() {
  // 53 random bits: fully specified, unlike std::uniform_real_distribution, so a seed faults the
  // same calls with every standard library.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

FaultBackend::Plan FaultBackend::Begin(uint32_t op) {
  Plan plan;
  {
    std::lock_guard lock(mu_);
    if ((spec_.ops & op) == 0) return plan;
    // Always two draws, whatever the outcome, so that one call's fate does not shift the next's.
    double u_delay = UniformLocked();
    double u_kind = UniformLocked();
    if (spec_.delay_ms > 0 && u_delay < spec_.delay && TakeLocked()) {
      plan.delay_ms = spec_.delay_ms;
      counts_.delay++;
    }
    bool damages = op == kOpPut || op == kOpGet;
    if (u_kind < spec_.fail) {
      if (TakeLocked()) {
        plan.fail = true;
        counts_.fail++;
      }
    } else if (damages && u_kind < spec_.fail + spec_.truncate) {
      plan.damage = Damage::kTruncate;
    } else if (damages && u_kind < spec_.fail + spec_.truncate + spec_.flip) {
      plan.damage = Damage::kFlip;
    }
  }
  if (plan.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(plan.delay_ms));
  return plan;
}

size_t FaultBackend::Apply(Damage damage, char* bytes, size_t n) {
  if (damage == Damage::kNone || n == 0) return n;
  std::lock_guard lock(mu_);
  if (!TakeLocked()) return n;
  if (damage == Damage::kTruncate) {
    counts_.truncate++;
    return rng_() % n;  // [0, n): at least one byte short
  }
  counts_.flip++;
  uint64_t bit = rng_() % (uint64_t{n} * 8);
  bytes[bit / 8] = static_cast<char>(bytes[bit / 8] ^ (1u << (bit % 8)));
  return n;
}

Status FaultBackend::Put(const std::string& key, const void* data, size_t len) {
  Plan plan = Begin(kOpPut);
  if (plan.fail) return IoError("injected fault: put " + key + " to " + Describe());
  switch (plan.damage) {
    case Damage::kNone:
      break;
    case Damage::kTruncate:
      return base_->Put(key, data, Apply(plan.damage, nullptr, len));
    case Damage::kFlip: {
      std::string copy(static_cast<const char*>(data), len);  // the caller's bytes stay intact
      Apply(plan.damage, copy.data(), copy.size());
      return base_->Put(key, copy.data(), copy.size());
    }
  }
  return base_->Put(key, data, len);
}

Status FaultBackend::PutIfAbsent(const std::string& key, const void* data, size_t len) {
  // Faults as Put's, except damage: a conditional create is for small records, checked whole.
  Plan plan = Begin(kOpPut);
  if (plan.fail) return IoError("injected fault: put " + key + " to " + Describe());
  return base_->PutIfAbsent(key, data, len);
}

Result<size_t> FaultBackend::Get(const std::string& key, uint64_t offset, void* buf, size_t len) {
  Plan plan = Begin(kOpGet);
  if (plan.fail) return IoError("injected fault: get " + key + " from " + Describe());
  ASSIGN_OR_RETURN(size_t n, base_->Get(key, offset, buf, len));
  return Apply(plan.damage, static_cast<char*>(buf), n);
}

Result<ObjectInfo> FaultBackend::Head(const std::string& key) {
  if (Begin(kOpHead).fail) return IoError("injected fault: head " + key + " in " + Describe());
  return base_->Head(key);
}

Status FaultBackend::Delete(const std::string& key) {
  if (Begin(kOpDelete).fail) {
    return IoError("injected fault: delete " + key + " from " + Describe());
  }
  return base_->Delete(key);
}

Status FaultBackend::List(const std::string& prefix, const std::string& start_after,
                          const std::function<bool(const ObjectInfo&)>& fn) {
  if (Begin(kOpList).fail) return IoError("injected fault: list " + prefix + " in " + Describe());
  return base_->List(prefix, start_after, fn);
}

std::string FaultBackend::Describe() const { return "fault(" + base_->Describe() + ")"; }

}  // namespace ckptfs
