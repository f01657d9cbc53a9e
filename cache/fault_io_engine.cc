#include "cache/fault_io_engine.h"

#include <cerrno>
#include <cstring>

#include "common/config.h"

namespace ckptfs {

Result<CacheFaultSpec> CacheFaultSpec::Parse(std::string_view text) {
  CacheFaultSpec s;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    const size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string value(eq == std::string_view::npos ? "" : item.substr(eq + 1));
    auto bad = [&] { return Invalid("cache fault spec: bad item '" + std::string(item) + "'"); };
    if (key == "ops") {
      for (size_t at = 0; at <= value.size();) {
        size_t plus = value.find('+', at);
        if (plus == std::string::npos) plus = value.size();
        const std::string op = value.substr(at, plus - at);
        if (op == "read") {
          s.reads = true;
        } else if (op == "write") {
          s.writes = true;
        } else {
          return bad();
        }
        at = plus + 1;
      }
    } else if (key == "error" && (value == "eio" || value == "enospc")) {
      s.error = value == "eio" ? EIO : ENOSPC;
    } else if (key == "after" || key == "count") {
      auto n = ParseSize(value);
      if (!n.ok()) return bad();
      (key == "after" ? s.after : s.count) = *n;
    } else {
      return bad();
    }
  }
  if (!s.reads && !s.writes) return Invalid("cache fault spec: ops= names no read or write");
  return s;
}

std::string CacheFaultSpec::ToString() const {
  std::string ops = reads && writes ? "read+write" : reads ? "read" : "write";
  return "ops=" + ops + ",error=" + (error == EIO ? "eio" : "enospc") +
         ",after=" + std::to_string(after) + ",count=" + std::to_string(count);
}

Status FaultIoEngine::Submit(std::span<IoOp> ops) {
  Status first;
  for (IoOp& op : ops) {
    const bool faulted = op.kind == IoOp::Kind::kRead ? spec_.reads : spec_.writes;
    if (faulted && moved_.fetch_add(op.len) >= spec_.after &&
        (spec_.count == 0 || failed_.fetch_add(1) < spec_.count)) {
      op.done = 0;
      op.status = Status::FromErrno(spec_.error, "injected cache disk fault");
      if (first.ok()) first = op.status;
      continue;
    }
    Status st = inner_->Submit(std::span<IoOp>(&op, 1));
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

}  // namespace ckptfs
