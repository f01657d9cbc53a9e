// The conformance suite of backends/backend.h: one set of tests that every Backend
// implementation must pass (JuiceFS's testStorage). The tests live in backend_conformance.cc,
// built once as the object library ckptfs_backend_conformance; a test binary links it and
// instantiates the suite for its backend:
//
//   INSTANTIATE_BACKEND_CONFORMANCE(Mem, [] {
//     return test::BackendUnderTest{std::make_unique<MemBackend>()};
//   });
//
// The factory runs once per test. A backend that starts empty gives prefix ""; one that cannot
// be emptied cheaply (an S3 bucket shared by runs) gives each call its own prefix inside it,
// e.g. "conformance/<run id>/<n>/": every key and List prefix a test uses starts with it, and the
// fixture deletes whatever is left under it when the test ends.
//
// Every test is bounded in objects, bytes (the largest object is 5 MiB) and threads (8), so the
// suite runs in seconds on a local backend and stays reasonable against a real object store.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace ckptfs::test {

struct BackendUnderTest {
  std::unique_ptr<Backend> backend;
  // Prepended to every key the test uses; ends in '/' unless empty.
  std::string prefix;
  // Runs after the backend is destroyed (removes a temporary directory, say); may be empty.
  std::function<void()> cleanup;
};

using BackendFactory = std::function<BackendUnderTest()>;

struct BackendConformanceParam {
  std::string name;  // the instantiation's name, shown in test names
  BackendFactory factory;
};

inline void PrintTo(const BackendConformanceParam& p, std::ostream* os) { *os << p.name; }

class BackendConformanceTest : public ::testing::TestWithParam<BackendConformanceParam> {
 protected:
  void SetUp() override;
  void TearDown() override;

  Backend& backend() { return *backend_; }
  // The key (or List prefix, or start_after) a test means, inside this test's prefix.
  std::string K(std::string_view key) const { return prefix_ + std::string(key); }

  // Put that must succeed.
  void MustPut(std::string_view key, std::string_view data);
  // Get of [offset, offset + len) that also checks the backend wrote nothing past buf[len).
  Result<std::string> GetRange(std::string_view key, uint64_t offset, size_t len);
  // (key without the test's prefix, size) of every object List reports, in the order reported.
  std::vector<std::pair<std::string, uint64_t>> ListAll(std::string_view prefix,
                                                        std::string_view start_after = "");
  std::vector<std::string> ListKeys(std::string_view prefix, std::string_view start_after = "");

  std::unique_ptr<Backend> backend_;
  std::string prefix_;
  std::function<void()> cleanup_;
};

}  // namespace ckptfs::test

// Instantiates the suite for one backend, at namespace scope. The factory (any callable returning
// BackendUnderTest) comes last, so a lambda with commas in it needs no extra parentheses. (gtest
// pastes the suite's name into identifiers, so it has to be named unqualified here.)
#define INSTANTIATE_BACKEND_CONFORMANCE(Name, ...)                                    \
  using ::ckptfs::test::BackendConformanceTest;                                       \
  INSTANTIATE_TEST_SUITE_P(                                                           \
      Name, BackendConformanceTest,                                                   \
      ::testing::Values(::ckptfs::test::BackendConformanceParam{#Name, __VA_ARGS__}), \
      [](const auto& info) { return info.param.name; })
