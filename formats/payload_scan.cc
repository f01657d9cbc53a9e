#include "formats/payload_scan.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "formats/format.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"
#include "formats/zip.h"

namespace ckptfs {
namespace {

class FormatScanner final : public PayloadScanner {
 public:
  explicit FormatScanner(const PayloadScanOptions& opts) : opts_(opts) {}

  void Feed(const uint8_t* data, size_t len) override {
    while (len > 0 && state_ != State::kDone) Step(data, len);
    pos_ += len;  // whatever is left after kDone
  }

  std::optional<ByteRange> NextPayload(uint64_t pos) override {
    while (!ranges_.empty() && ranges_.front().end <= pos) ranges_.pop_front();
    if (ranges_.empty()) return std::nullopt;
    return ranges_.front();
  }

  std::string_view format() const override { return FormatName(format_); }

 private:
  enum class State {
    kSniff,          // the first bytes decide the format
    kZipLocal,       // a local header (or the central directory after the last record)
    kZipPickle,      // data.pkl's bytes, kept until its data descriptor
    kZipScan,        // a record of unknown size: looking for its data descriptor
    kZipSkip,        // a record of known size
    kZipDescriptor,  // the data descriptor after a record of known size
    kZipCentral,     // central directory records up to the end record
    kZipNext,        // after an archive: another one may follow (DCP .distcp)
    kSafetensorsHeader,
    kDone,
  };

  // Moves bytes from data into hold_ until it has `need`; true when it has.
  bool Gather(const uint8_t*& data, size_t& len, size_t need) {
    if (hold_.size() < need) {
      const size_t n = std::min(len, need - hold_.size());
      hold_.append(reinterpret_cast<const char*>(data), n);
      Advance(data, len, n);
    }
    return hold_.size() >= need;
  }
  void Advance(const uint8_t*& data, size_t& len, size_t n) {
    data += n;
    len -= n;
    pos_ += n;
  }
  const uint8_t* held() const { return reinterpret_cast<const uint8_t*>(hold_.data()); }
  void Become(State s) {
    state_ = s;
    hold_.clear();
  }
  void Stop() {
    Become(State::kDone);
    hold_.shrink_to_fit();
  }

  void Step(const uint8_t*& data, size_t& len) {
    switch (state_) {
      case State::kSniff:
        return Sniff(data, len);
      case State::kZipLocal:
        return ZipLocal(data, len);
      case State::kZipPickle:
      case State::kZipScan:
        return ZipScan(data, len);
      case State::kZipSkip: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(len, skip_));
        Advance(data, len, n);
        skip_ -= n;
        if (skip_ == 0) Become(descriptor_after_skip_ ? State::kZipDescriptor : State::kZipLocal);
        return;
      }
      case State::kZipDescriptor:
        if (!Gather(data, len, zip::DescriptorLen(record_zip64_))) return;
        if (!zip::IsDescriptorFor(held(), record_zip64_, record_size_)) return Stop();
        return Become(State::kZipLocal);
      case State::kZipCentral:
        return ZipCentral(data, len);
      case State::kZipNext:
        if (!Gather(data, len, 4)) return;
        if (zip::Le32(held()) != zip::kLocalSig) return Stop();
        storage_bytes_.clear();
        state_ = State::kZipLocal;  // keep the 4 bytes: they start the next header
        return;
      case State::kSafetensorsHeader:
        return SafetensorsHeader(data, len);
      case State::kDone:
        return;
    }
  }

  void Sniff(const uint8_t*& data, size_t& len) {
    if (!Gather(data, len, 9)) return;
    format_ = SniffFormat(held(), hold_.size(), "");
    if (format_ == FileFormat::kTorchZip) {
      state_ = State::kZipLocal;  // the sniffed bytes start the first local header
    } else if (format_ == FileFormat::kSafetensors) {
      state_ = State::kSafetensorsHeader;
    } else {
      Stop();
    }
  }

  void ZipLocal(const uint8_t*& data, size_t& len) {
    if (!Gather(data, len, 4)) return;
    const uint32_t sig = zip::Le32(held());
    if (sig != zip::kLocalSig) {
      if (sig == zip::kCentralSig || sig == zip::kEocd64Sig || sig == zip::kEocdSig) {
        state_ = State::kZipCentral;
        return;
      }
      return Stop();
    }
    size_t need = 0;
    auto h = zip::ParseLocalHeader(held(), hold_.size(), &need);
    if (!h.ok()) return Stop();
    if (!h->has_value()) {
      Gather(data, len, need);
      return;
    }
    const zip::LocalHeader& lh = **h;
    if (lh.method != 0) return Stop();  // torch never compresses; something else wrote this
    record_zip64_ = lh.zip64;
    const uint64_t begin = pos_;
    const std::string& name = lh.name;
    const size_t slash = name.find('/');
    const std::string rest = slash == std::string::npos ? name : name.substr(slash + 1);
    if (auto known = lh.known_size()) {
      // Sizes in the header and no descriptor (not how torch writes, but valid): skip the data.
      record_size_ = *known;
      skip_ = *known;
      descriptor_after_skip_ = false;
      Become(skip_ == 0 ? State::kZipLocal : State::kZipSkip);
      return;
    }
    if (rest == "data.pkl") {
      Become(State::kZipPickle);
      return;
    }
    if (rest.rfind("data/", 0) == 0) {
      auto it = storage_bytes_.find(rest.substr(5));
      if (it != storage_bytes_.end()) {
        record_size_ = it->second;
        if (record_size_ >= opts_.min_payload_bytes) {
          ranges_.push_back(ByteRange{begin, begin + record_size_});
        }
        skip_ = record_size_;
        descriptor_after_skip_ = true;
        Become(skip_ == 0 ? State::kZipDescriptor : State::kZipSkip);
        return;
      }
    }
    Become(State::kZipScan);
  }

  // A record whose size follows its data: look for a data descriptor whose size field equals the
  // bytes seen since the data started. data.pkl's bytes are kept for parsing; others are not.
  void ZipScan(const uint8_t*& data, size_t& len) {
    const bool keep = state_ == State::kZipPickle;
    const size_t dlen = zip::DescriptorLen(record_zip64_);
    // hold_ holds the record's bytes (all of them when keeping, else a tail of them starting at
    // record offset scan_base_).
    const size_t before = hold_.size();
    const size_t n = std::min(len, size_t{1} << 20);
    hold_.append(reinterpret_cast<const char*>(data), n);
    for (size_t i = scan_from_; i + dlen <= hold_.size(); ++i) {
      const void* hit = std::memchr(hold_.data() + i, 'P', hold_.size() - dlen + 1 - i);
      if (hit == nullptr) break;
      i = static_cast<size_t>(static_cast<const char*>(hit) - hold_.data());
      if (zip::IsDescriptorFor(held() + i, record_zip64_, scan_base_ + i)) {
        // Found: the record ends at i, the descriptor after it; what follows is the next header.
        const size_t used = i + dlen - before;  // of the new bytes
        if (keep) OnPickle(held(), i);
        Advance(data, len, used);
        scan_from_ = 0;
        scan_base_ = 0;
        if (state_ != State::kDone) Become(State::kZipLocal);
        return;
      }
    }
    Advance(data, len, n);
    if (keep) {
      scan_from_ = hold_.size() >= dlen ? hold_.size() - dlen + 1 : 0;
      if (hold_.size() > opts_.max_header_bytes) Stop();
      return;
    }
    // Keep only a tail long enough to hold a descriptor that straddles the next Feed.
    if (hold_.size() > dlen) {
      const size_t drop = hold_.size() - (dlen - 1);
      hold_.erase(0, drop);
      scan_base_ += drop;
    }
    scan_from_ = 0;
  }

  void OnPickle(const uint8_t* p, size_t n) {
    auto root = pickle::Read(p, n);
    if (!root.ok()) return;
    auto desc = DescribeTorchPickle(*root);
    if (!desc.ok()) return;
    for (const auto& [key, s] : desc->storages) storage_bytes_[key] = s.nbytes();
  }

  void ZipCentral(const uint8_t*& data, size_t& len) {
    if (!Gather(data, len, 4)) return;
    const uint32_t sig = zip::Le32(held());
    size_t fixed = 0;
    switch (sig) {
      case zip::kCentralSig:
        fixed = zip::kCentralFixed;
        break;
      case zip::kEocd64Sig:
        fixed = 12;
        break;
      case zip::kLocator64Sig:
        fixed = 20;
        break;
      case zip::kEocdSig:
        fixed = zip::kEocdFixed;
        break;
      default:
        return Stop();
    }
    if (!Gather(data, len, fixed)) return;
    size_t total = fixed;
    if (sig == zip::kCentralSig) {
      total += size_t{zip::Le16(held() + 28)} + zip::Le16(held() + 30) + zip::Le16(held() + 32);
    } else if (sig == zip::kEocd64Sig) {
      const uint64_t rest = zip::Le64(held() + 4);
      if (rest > (1 << 20)) return Stop();
      total += static_cast<size_t>(rest);
    } else if (sig == zip::kEocdSig) {
      total += zip::Le16(held() + 20);
    }
    if (!Gather(data, len, total)) return;
    Become(sig == zip::kEocdSig ? State::kZipNext : State::kZipCentral);
  }

  // The header lists every tensor's bytes: all ranges are known before the first tensor byte.
  void SafetensorsHeader(const uint8_t*& data, size_t& len) {
    auto need = safetensors::HeaderBytesNeeded(held(), hold_.size());
    if (!need.ok() || *need > opts_.max_header_bytes) return Stop();
    if (!Gather(data, len, static_cast<size_t>(*need))) return;
    auto header = safetensors::ParseHeader(held(), hold_.size());
    if (header.ok()) {
      std::vector<ByteRange> found;
      for (const safetensors::TensorInfo& t : header->tensors) {
        if (t.length >= opts_.min_payload_bytes) found.push_back({t.offset, t.offset + t.length});
      }
      std::sort(found.begin(), found.end(),
                [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
      ranges_.insert(ranges_.end(), found.begin(), found.end());
    }
    Stop();
  }

  const PayloadScanOptions opts_;
  State state_ = State::kSniff;
  FileFormat format_ = FileFormat::kUnknown;
  uint64_t pos_ = 0;  // bytes consumed by the state machine
  std::string hold_;
  std::deque<ByteRange> ranges_;
  std::map<std::string, uint64_t> storage_bytes_;  // of the current archive, by storage key
  bool record_zip64_ = false;
  uint64_t record_size_ = 0;
  uint64_t skip_ = 0;
  bool descriptor_after_skip_ = true;
  size_t scan_from_ = 0;
  uint64_t scan_base_ = 0;
};

}  // namespace

std::unique_ptr<PayloadScanner> NewPayloadScanner(const PayloadScanOptions& opts) {
  return std::make_unique<FormatScanner>(opts);
}

}  // namespace ckptfs
