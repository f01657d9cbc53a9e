// json::Parse on arbitrary bytes: it either fails with kCorrupt or returns a value that writes,
// parses back to an equal value, and writes again to the same text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/json.h"
#include "fuzz/fuzz_check.h"

using ckptfs::Code;
namespace json = ckptfs::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  json::ParseOptions options;
  options.max_depth = 64;
  auto v = json::Parse(text, options);
  if (!v.ok()) {
    FUZZ_CHECK(v.status().code() == Code::kCorrupt);
    return 0;
  }
  auto out = json::Write(*v);
  FUZZ_CHECK(out.ok());  // parsed strings are valid UTF-8 and parsed numbers finite
  auto again = json::Parse(*out, options);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *v);
  auto out2 = json::Write(*again);
  FUZZ_CHECK(out2.ok() && *out2 == *out);
  // The writer never emits more than the compact form of the input, plus ".0" per number.
  FUZZ_CHECK(out->size() <= 3 * size + 2);
  return 0;
}
