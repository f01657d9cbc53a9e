// The parts of backends/backend.h that are not an implementation: the key rules and the default
// GetObject.
#include "backends/backend.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/mem_backend.h"

namespace ckptfs {
namespace {

TEST(CheckKeyTest, AcceptsKeysWithinTheRules) {
  for (const std::string& key :
       std::vector<std::string>{"a", "chunks/ab/0f3c", "...", ".a", "a.", "a..b", "a/.b/c", "x y",
                                "\xc3\xa9", std::string(1024, 'k')}) {
    EXPECT_TRUE(CheckKey(key).ok()) << key << ": " << CheckKey(key).ToString();
  }
}

TEST(CheckKeyTest, RejectsEachBrokenRuleWithItsReason) {
  struct Case {
    std::string key;
    std::string reason;
  } cases[] = {
      {"", "empty"},
      {std::string(1025, 'k'), "longer than 1024"},
      {"/a", "starts with '/'"},
      {"a//b", "empty path component"},
      {"a/", "empty path component"},
      {".", "'.' component"},
      {"a/./b", "'.' component"},
      {"..", "'..' component"},
      {"a/..", "'..' component"},
      {std::string("a\0b", 3), "NUL"},
      {"a\nb", "newline"},
  };
  for (const Case& c : cases) {
    Status s = CheckKey(c.key);
    EXPECT_EQ(s.code(), Code::kInvalid) << c.key;
    EXPECT_NE(s.message().find(c.reason), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << "the message quotes a raw newline";
  }
}

// A backend whose Head and Get disagree, to reach the default GetObject's checks.
class LyingBackend : public MemBackend {
 public:
  int64_t head_delta = 0;
  Result<ObjectInfo> Head(const std::string& key) override {
    ASSIGN_OR_RETURN(ObjectInfo info, MemBackend::Head(key));
    info.size += head_delta;
    return info;
  }
  // The default, not MemBackend's single-snapshot override.
  Result<std::string> GetObject(const std::string& key) override { return Backend::GetObject(key); }
};

TEST(DefaultGetObjectTest, ReadsWhatHeadPromised) {
  LyingBackend b;
  ASSERT_TRUE(b.Put("k", "hello", 5).ok());
  auto got = b.GetObject("k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "hello");
  EXPECT_EQ(b.GetObject("none").status().code(), Code::kNotFound);
}

TEST(DefaultGetObjectTest, SizeMismatchIsCorrupt) {
  LyingBackend b;
  ASSERT_TRUE(b.Put("k", "hello", 5).ok());
  b.head_delta = 1;  // the body comes up short
  EXPECT_EQ(b.GetObject("k").status().code(), Code::kCorrupt);
  b.head_delta = -1;  // the body is longer than promised
  EXPECT_EQ(b.GetObject("k").status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace ckptfs
