// A torch.save file (or a DCP .distcp file) made of arbitrary bytes, read two ways: the streaming
// payload scanner, fed in pieces whose sizes come from the input, and the whole-file describer.
// Neither may crash; the scanner's ranges must come in order, not overlap and lie inside the file;
// every tensor the describer reports must lie inside the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/describe.h"
#include "formats/payload_scan.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the piece size of the feed (1..256 bytes, or everything at once).
  const size_t piece = data[0] == 0 ? size : data[0];
  ++data;
  --size;

  ckptfs::PayloadScanOptions opts;
  opts.min_payload_bytes = 1;
  opts.max_header_bytes = 1 << 20;
  auto scanner = ckptfs::NewPayloadScanner(opts);
  for (size_t off = 0; off < size; off += piece) {
    scanner->Feed(data + off, std::min(piece, size - off));
  }
  uint64_t pos = 0;
  while (auto r = scanner->NextPayload(pos)) {
    FUZZ_CHECK(r->begin >= pos && r->end > r->begin);
    pos = r->end;
  }

  const std::string file(reinterpret_cast<const char*>(data), size);
  auto read_at = [&](uint64_t off, size_t len) -> ckptfs::Result<std::string> {
    if (off > file.size() || len > file.size() - off) return ckptfs::Corrupt("past the end");
    return file.substr(off, len);
  };
  for (const char* name : {"model.pt", "__0_0.distcp", ".metadata"}) {
    auto d = ckptfs::DescribeFile(name, file.size(), read_at);
    if (!d.ok()) {
      FUZZ_CHECK(d.status().code() == ckptfs::Code::kCorrupt);
      continue;
    }
    for (const ckptfs::TensorInfo& t : d->tensors) {
      FUZZ_CHECK(t.offset <= file.size() && t.length <= file.size() - t.offset);
    }
  }
  return 0;
}
