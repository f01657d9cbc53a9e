// dcp::ParseMetadata on arbitrary bytes: refused with kCorrupt, or a description whose every
// chunk lies inside its tensor and whose chunks cover each tensor exactly once.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/dcp.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto md = ckptfs::dcp::ParseMetadata(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!md.ok()) {
    FUZZ_CHECK(md.status().code() == ckptfs::Code::kCorrupt);
    return 0;
  }
  for (const auto& t : md->tensors) {
    unsigned __int128 numel = 1, covered = 0;
    for (int64_t d : t.size) numel *= static_cast<uint64_t>(d);
    for (const auto& c : t.chunks) {
      FUZZ_CHECK(c.offsets.size() == t.size.size() && c.sizes.size() == t.size.size());
      unsigned __int128 vol = 1;
      for (size_t d = 0; d < t.size.size(); ++d) {
        FUZZ_CHECK(c.offsets[d] >= 0 && c.sizes[d] >= 0);
        FUZZ_CHECK(c.offsets[d] + c.sizes[d] <= t.size[d]);
        vol *= static_cast<uint64_t>(c.sizes[d]);
      }
      covered += vol;
    }
    FUZZ_CHECK(covered == numel);
  }
  (void)md->Files();
  return 0;
}
