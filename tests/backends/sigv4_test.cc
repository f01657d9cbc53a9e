// SigV4 signing, differentially against botocore: many generated requests (odd paths, query
// strings, headers, session tokens, bodies) are signed by ckptfs and by botocore's
// S3SigV4Auth / SigV4Auth (tests/backends/s3_sigv4_reference.py under /usr/bin/python3), and the
// Authorization headers must be identical.
#include "backends/sigv4.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckptfs {
namespace {

std::string Hex(std::string_view s) {
  static const char* kDigits = "0123456789abcdef";
  if (s.empty()) return "-";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string Unhex(std::string_view s) {
  std::string out;
  for (size_t i = 0; i + 1 < s.size(); i += 2) {
    out += static_cast<char>(std::stoi(std::string(s.substr(i, 2)), nullptr, 16));
  }
  return out;
}

std::string Pairs(const HeaderList& list) {
  if (list.empty()) return "-";
  std::string out;
  for (const auto& [k, v] : list) {
    if (!out.empty()) out += ' ';
    // "-" marks an empty list; an empty name or value inside one is an empty hex string.
    out += (k.empty() ? "" : Hex(k)) + ":" + (v.empty() ? "" : Hex(v));
  }
  return out;
}

struct Case {
  bool s3 = true;
  std::string method, scheme, region, service;
  SigV4Request req;
  std::string body;
  AwsCredentials creds;
  std::time_t when = 0;
};

// Pieces the generator draws from: what S3 keys, listings and multipart uploads really carry.
// '|' separates them.
std::vector<std::string> SplitBars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t start = 0, bar; start <= s.size(); start = bar + 1) {
    bar = std::min(s.find('|', start), s.size());
    out.emplace_back(s.substr(start, bar - start));
  }
  return out;
}
const std::vector<std::string> kSegments = SplitBars(
    "chunks|ab|a b|a+b|x=y|tilde~|per%cent|caf\xc3\xa9|\xe6\x97\xa5\xe6\x9c\xac|"
    "\xf0\x9f\x98\x80|q?s|h#f|!*'()|semi;colon|at@dollar$|comma,|amp&|UPPER|dot.name|"
    "-_.~|sp  ace|plus+plus+");
const std::vector<std::string> kHosts = {"127.0.0.1:7480", "localhost:8000",
                                         "s3.us-east-1.amazonaws.com",
                                         "bucket.s3.eu-west-1.amazonaws.com", "example.com:8443"};
const std::vector<std::string> kMethods = {"GET", "PUT", "POST", "DELETE", "HEAD"};
const std::vector<std::string> kRegions = {"us-east-1", "eu-central-1", "default", "ap-south-2"};

Case Generate(test::SplitMix64& rng) {
  Case c;
  c.s3 = rng.Below(4) != 0;
  c.method = kMethods[rng.Below(kMethods.size())];
  c.scheme = rng.Below(2) ? "https" : "http";
  c.region = kRegions[rng.Below(kRegions.size())];
  c.service = c.s3 ? "s3" : (rng.Below(2) ? "sts" : "execute-api");
  c.req.method = c.method;
  c.req.host = kHosts[rng.Below(kHosts.size())];
  std::string path;
  size_t nseg = rng.Below(5);
  for (size_t i = 0; i < nseg; ++i) {
    path += '/';
    uint64_t r = rng.Below(20);
    // Empty and dot segments: kept by S3, removed by generic SigV4.
    const char* special[] = {"", ".", ".."};
    path += r < 3 ? special[r] : kSegments[rng.Below(kSegments.size())];
  }
  if (path.empty() || rng.Below(6) == 0) path += '/';
  c.req.path = path;

  switch (rng.Below(7)) {
    case 0:
      break;
    case 1:
      c.req.query = {{"list-type", "2"}, {"prefix", "a b"}, {"start-after", "x"}};
      break;
    case 2:
      c.req.query = {{"uploads", ""}};
      break;
    case 3:
      c.req.query = {{"partNumber", "1"}, {"uploadId", "2~Abc/d+e=f"}};
      break;
    case 4:
      c.req.query = {{"list-type", "2"},
                     {"continuation-token", "1/+Xy==z"},
                     {"encoding-type", "url"},
                     {"max-keys", "1000"},
                     {"prefix", "p/caf\xc3\xa9 +&=%"}};
      break;
    case 5:
      c.req.query = {{"b", "2"}, {"a", "z"}, {"a", "y"}, {"A", ""}, {"~", "-_."}};
      break;
    default:
      for (size_t i = 0, n = 1 + rng.Below(4); i < n; ++i) {
        c.req.query.emplace_back(kSegments[rng.Below(kSegments.size())],
                                 rng.Below(3) ? kSegments[rng.Below(kSegments.size())] : "");
      }
  }

  if (rng.Below(2)) c.req.headers.emplace_back("Content-Type", "application/octet-stream");
  if (rng.Below(3) == 0) c.req.headers.emplace_back("Range", "bytes=0-99");
  if (rng.Below(3) == 0) c.req.headers.emplace_back("x-amz-meta-Spaced", "  a   b \t c  ");
  if (rng.Below(4) == 0) c.req.headers.emplace_back("X-Amz-Storage-Class", "STANDARD");
  if (rng.Below(5) == 0) {
    c.req.headers.emplace_back("x-amz-meta-dup", "one");
    c.req.headers.emplace_back("X-Amz-Meta-Dup", " two ");
  }
  if (rng.Below(5) == 0) c.req.headers.emplace_back("Content-MD5", "1B2M2Y8AsgTpgAmY7PhCfg==");

  auto bytes = test::RandomBytes(rng.Below(3) ? rng.Below(300) : 0, rng.Next());
  c.body.assign(bytes.begin(), bytes.end());
  c.req.payload_sha256 = Sha256Hex(c.body.data(), c.body.size());

  c.creds.access_key_id = rng.Below(2) ? "AKIDEXAMPLE" : "0555b35654ad1656d804";
  c.creds.secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY" + std::to_string(rng.Below(1000));
  if (rng.Below(3) == 0)
    c.creds.session_token = "FwoGZXIvYXdzE/+tok==" + std::to_string(rng.Next());
  c.when = 1369353600 + static_cast<std::time_t>(rng.Below(400'000'000));
  return c;
}

std::string InputLine(const Case& c) {
  std::ostringstream o;
  o << (c.s3 ? "s3" : "generic") << '\t' << c.method << '\t' << c.scheme << '\t' << Hex(c.req.host)
    << '\t' << Hex(c.req.path) << '\t' << Pairs(c.req.query) << '\t' << Pairs(c.req.headers) << '\t'
    << Hex(c.body) << '\t' << Hex(c.creds.access_key_id) << '\t' << Hex(c.creds.secret_access_key)
    << '\t' << Hex(c.creds.session_token) << '\t' << c.region << '\t' << c.service << '\t'
    << AmzDate(c.when) << '\n';
  return o.str();
}

// Runs the botocore reference over `input` and returns its output lines.
std::vector<std::string> RunReference(const std::string& input) {
  test::TempDir dir;
  std::string in_path = dir.Sub("cases.tsv");
  std::ofstream(in_path) << input;
  std::string cmd =
      "/usr/bin/python3 " CKPTFS_SOURCE_DIR "/tests/backends/s3_sigv4_reference.py < " + in_path;
  std::vector<std::string> lines;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return lines;
  std::string cur;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) cur.append(buf, n);
  int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << "the botocore reference failed (is python3-botocore installed?)";
  std::istringstream s(cur);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  return lines;
}

TEST(SigV4Test, MatchesBotocoreOnGeneratedRequests) {
  constexpr int kCases = 800;
  test::SplitMix64 rng(20240607);
  std::vector<Case> cases;
  std::string input;
  for (int i = 0; i < kCases; ++i) {
    cases.push_back(Generate(rng));
    input += InputLine(cases.back());
  }
  std::vector<std::string> ref = RunReference(input);
  ASSERT_EQ(ref.size(), cases.size());
  int s3 = 0, tokens = 0, mismatches = 0;
  for (int i = 0; i < kCases; ++i) {
    const Case& c = cases[i];
    SigV4Signer signer(c.creds, c.region, c.service,
                       c.s3 ? SigV4Signer::Flavor::kS3 : SigV4Signer::Flavor::kGeneric);
    SigV4Signature sig = signer.Sign(c.req, c.when);
    std::vector<std::string> f;
    std::istringstream fs(ref[i]);
    for (std::string x; std::getline(fs, x, '\t');) f.push_back(x);
    ASSERT_EQ(f.size(), 3u) << ref[i];
    s3 += c.s3;
    tokens += !c.creds.session_token.empty();
    if (sig.authorization != f[0]) {
      ++mismatches;
      ADD_FAILURE() << "case " << i << " " << c.method << " " << c.req.path
                    << "\nckptfs:   " << sig.authorization << "\nbotocore: " << f[0]
                    << "\nckptfs canonical request:\n"
                    << sig.canonical_request << "\nbotocore canonical request:\n"
                    << Unhex(f[1]);
      if (mismatches > 5) break;
    }
    if (c.s3) {
      EXPECT_EQ(f[2], c.req.payload_sha256) << "case " << i;
    }
  }
  // The generator must have covered both flavors and session tokens.
  EXPECT_GT(s3, kCases / 2);
  EXPECT_GT(tokens, kCases / 5);
}

TEST(SigV4Test, AddsTheHeadersItSigned) {
  SigV4Signer signer({"AK", "SK", "TOKEN"}, "us-east-1", "s3");
  SigV4Request req;
  req.method = "PUT";
  req.host = "127.0.0.1:7480";
  req.path = "/b/k";
  req.payload_sha256 = Sha256Hex("", 0);
  SigV4Signature sig = signer.Sign(req, 0);
  ASSERT_EQ(sig.headers.size(), 5u);
  EXPECT_EQ(sig.headers[0].first, "host");
  EXPECT_EQ(sig.headers[1],
            (std::pair<std::string, std::string>("x-amz-date", "19700101T000000Z")));
  EXPECT_EQ(sig.headers[2].second, req.payload_sha256);
  EXPECT_EQ(sig.headers[3].second, "TOKEN");
  EXPECT_EQ(sig.headers[4].second, sig.authorization);
  EXPECT_NE(sig.authorization.find("SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                                   "x-amz-security-token,"),
            std::string::npos);
  EXPECT_EQ(sig.authorization.find("SK"), std::string::npos);
  EXPECT_EQ(sig.canonical_request.find("SK"), std::string::npos);
}

TEST(SigV4Test, Encoding) {
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(EncodePath("/a b/c+d=e~f/\xc3\xa9"), "/a%20b/c%2Bd%3De~f/%C3%A9");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(CanonicalQuery({{"prefix", "a b"}, {"list-type", "2"}, {"start-after", "x"}}),
            "list-type=2&prefix=a%20b&start-after=x");
  EXPECT_EQ(UriDecode("a%20b+c%2Bd%zz%4", true), "a b c+d%zz%4");
  EXPECT_EQ(UriDecode("a+b", false), "a+b");
  EXPECT_EQ(AmzDate(1369353600), "20130524T000000Z");
}

}  // namespace
}  // namespace ckptfs
