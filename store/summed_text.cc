#include "store/summed_text.h"

#include "common/chunk_id.h"

namespace ckptfs {

std::string WithSum(std::string body) {
  const std::string sum = ChunkId::Of(body.data(), body.size()).Hex();
  return body + "sum=" + sum + "\n";
}

std::string_view VerifiedBody(std::string_view text, std::string_view magic) {
  const size_t at = text.rfind("\nsum=");
  if (at == std::string_view::npos || text.empty() || text.back() != '\n') return {};
  std::string_view covered = text.substr(0, at + 1);
  std::string_view sum = text.substr(at + 5, text.size() - at - 6);
  if (covered.rfind(magic, 0) != 0) return {};
  return ChunkId::Of(covered.data(), covered.size()).Hex() == sum ? covered : std::string_view{};
}

std::string TextField(std::string_view body, std::string_view name) {
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find('\n', at);
    if (end == std::string_view::npos) end = body.size();
    std::string_view line = body.substr(at, end - at);
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == '=') {
      return std::string(line.substr(name.size() + 1));
    }
    at = end + 1;
  }
  return {};
}

}  // namespace ckptfs
