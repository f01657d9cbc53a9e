#include "backends/backend.h"

#include <string>

namespace ckptfs {

Status CheckKey(std::string_view key) {
  constexpr size_t kMaxKeyBytes = 1024;
  if (key.empty()) return Invalid("empty object key");
  if (key.size() > kMaxKeyBytes) {
    return Invalid("object key of " + std::to_string(key.size()) + " bytes is longer than " +
                   std::to_string(kMaxKeyBytes));
  }
  // The key itself may be unprintable, so messages quote only a bounded, sanitized head of it.
  auto shown = [key] {
    std::string s(key.substr(0, 64));
    for (char& c : s) {
      if (c == '\0' || c == '\n') c = '?';
    }
    return "'" + s + (key.size() > 64 ? "...'" : "'");
  };
  if (key.find('\0') != std::string_view::npos) {
    return Invalid("object key " + shown() + " has a NUL");
  }
  if (key.find('\n') != std::string_view::npos) {
    return Invalid("object key " + shown() + " has a newline");
  }
  if (key.front() == '/') return Invalid("object key " + shown() + " starts with '/'");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view part = key.substr(start, end - start);
    if (part.empty()) return Invalid("object key " + shown() + " has an empty path component");
    if (part == "." || part == "..") {
      return Invalid("object key " + shown() + " has a '" + std::string(part) + "' component");
    }
    start = end + 1;
  }
  return Status::Ok();
}

Result<std::string> Backend::GetObject(const std::string& key) {
  ASSIGN_OR_RETURN(ObjectInfo info, Head(key));
  if (info.size >= std::string().max_size()) {
    return Status(Code::kTooBig, "object " + key + " (" + Describe() + ") claims " +
                                     std::to_string(info.size) + " bytes, more than fit in memory");
  }
  // One byte more than promised: a Get that fills it shows the object grew since the Head.
  std::string data(info.size + 1, '\0');
  ASSIGN_OR_RETURN(size_t n, Get(key, 0, data.data(), data.size()));
  if (n != info.size) {
    return Corrupt("object " + key + " (" + Describe() + ") read " + std::to_string(n) +
                   " bytes where its size is " + std::to_string(info.size) +
                   " (changed during the read, or a short body)");
  }
  data.resize(n);
  return data;
}

}  // namespace ckptfs
