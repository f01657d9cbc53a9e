// pickle::Read on arbitrary bytes. The reader must refuse with kCorrupt or return a tree; a tree it
// accepts must write back with every protocol the writer has (the reader and writer share their
// limits), the written pickle must read back and write again to the same bytes, and at protocol 5
// (which has an opcode for every kind of value) read back to the same tree, compared through
// Debug, unless Python 2 names were renamed on the way.
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/pickle.h"
#include "fuzz/fuzz_check.h"

namespace pk = ckptfs::pickle;

namespace {
bool HasPy2Names(const std::string& shown) {
  for (const char* m : {"__builtin__", "copy_reg", "exceptions", "itertools", "UserDict",
                        "UserList", "UserString", "Queue", "cPickle", "StringIO", "cStringIO",
                        "repr", "_abcoll"}) {
    if (shown.find(m) != std::string::npos) return true;
  }
  return false;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Keep each run fast: small limits exercise the limit checks too.
  pk::Limits limits;
  limits.max_depth = 200;
  limits.max_values = 200'000;
  size_t consumed = 0;
  auto tree = pk::Read(data, size, &consumed, limits);
  if (!tree.ok()) {
    FUZZ_CHECK(tree.status().code() == ckptfs::Code::kCorrupt);
    return 0;
  }
  FUZZ_CHECK(consumed >= 1 && consumed <= size && data[consumed - 1] == '.');
  const std::string shown = pk::Debug(*tree, 1 << 16);
  for (int protocol = 2; protocol <= 5; ++protocol) {
    auto out = pk::Write(*tree, protocol, limits);
    if (!out.ok()) {
      // The documented refusals of a tree the reader built: text a protocol cannot carry
      // (a newline in a global's name below protocol 4) and cycles Python could not pickle.
      FUZZ_CHECK(out.status().code() == ckptfs::Code::kInvalid);
      continue;
    }
    size_t again_consumed = 0;
    auto again = pk::Read(*out, &again_consumed, limits);
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(again_consumed == out->size());
    // What the writer writes, it writes again unchanged: a protocol that lacks an opcode spells
    // the value another way (bytes below protocol 3 as _codecs.encode(...)), once.
    auto twice = pk::Write(*again, protocol, limits);
    FUZZ_CHECK(twice.ok() && *twice == *out);
    if (protocol == 5) FUZZ_CHECK(pk::Debug(*again, 1 << 16) == shown || HasPy2Names(shown));
  }
  return 0;
}
