// layout::Detect on a listing made from arbitrary bytes: one entry per line, "path" for a file,
// "path/" for a directory, "path=content" for a file whose content the caller read. Detection
// either rejects the listing as kInvalid or describes it, and the description does not depend on
// the order of the listing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "formats/layout.h"
#include "fuzz/fuzz_check.h"

using ckptfs::Code;
namespace layout = ckptfs::layout;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<layout::Entry> listing;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    layout::Entry e;
    if (const size_t eq = line.find('='); eq != std::string_view::npos) {
      e.content = std::string(line.substr(eq + 1));
      line = line.substr(0, eq);
    } else if (!line.empty() && line.back() == '/') {
      e.is_dir = true;
      line.remove_suffix(1);
    }
    e.path = std::string(line);
    listing.push_back(std::move(e));
  }
  auto l = layout::Detect(listing);
  if (!l.ok()) {
    FUZZ_CHECK(l.status().code() == Code::kInvalid);
    return 0;
  }
  // Sizes are consistent with completeness.
  if (l->megatron) {
    for (const layout::MegatronIteration& it : l->megatron->iterations) {
      if (it.naming != layout::RankNaming::kNone && it.naming != layout::RankNaming::kMixed) {
        FUZZ_CHECK(it.tp >= 1 && it.pp >= 1 && it.ep >= 1);
      }
    }
  }
  if (l->deepspeed) {
    FUZZ_CHECK(!l->deepspeed->tags.empty());
    for (const layout::DeepSpeedTag& t : l->deepspeed->tags) {
      if (t.zero != layout::ZeroStage::kNone) FUZZ_CHECK(t.dp_size >= 1 && t.mp_size >= 1);
    }
  }
  FUZZ_CHECK(l->kind != layout::Kind::kUnknown || (l->hf.empty() && l->dcp.empty()));
  const std::string description = layout::Describe(*l);
  std::reverse(listing.begin(), listing.end());
  auto reversed = layout::Detect(listing);
  FUZZ_CHECK(reversed.ok());
  FUZZ_CHECK(layout::Describe(*reversed) == description);
  return 0;
}
