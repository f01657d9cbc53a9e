// S3Options without a server: the s3:// URL form, endpoints, addressing, and where region and
// credentials come from (environment, ~/.aws files, profiles).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "backends/credentials.h"
#include "backends/s3_backend.h"
#include "backends/s3_options_internal.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

// Sets (or, with nullopt, unsets) variables for one test and puts the old values back after.
using EnvVars = std::map<std::string, std::optional<std::string>>;

class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvVars& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Every variable the resolution reads, cleared, with HOME pointing at an empty directory.
std::map<std::string, std::optional<std::string>> CleanEnv(const std::string& home) {
  return {{"HOME", home},
          {"AWS_ACCESS_KEY_ID", std::nullopt},
          {"AWS_SECRET_ACCESS_KEY", std::nullopt},
          {"AWS_SESSION_TOKEN", std::nullopt},
          {"AWS_REGION", std::nullopt},
          {"AWS_DEFAULT_REGION", std::nullopt},
          {"AWS_PROFILE", std::nullopt},
          {"AWS_ENDPOINT_URL", std::nullopt},
          {"AWS_ENDPOINT_URL_S3", std::nullopt},
          {"AWS_SHARED_CREDENTIALS_FILE", std::nullopt},
          {"AWS_CONFIG_FILE", std::nullopt}};
}

TEST(S3OptionsTest, ParsesS3Urls) {
  S3Options o;
  ASSERT_TRUE(ParseS3Url("s3://bucket", &o).ok());
  EXPECT_EQ(o.bucket, "bucket");
  EXPECT_EQ(o.prefix, "");
  ASSERT_TRUE(ParseS3Url("s3://my.bucket/ckpt/run7/", &o).ok());
  EXPECT_EQ(o.bucket, "my.bucket");
  EXPECT_EQ(o.prefix, "ckpt/run7");
  for (const char* bad : {"bucket", "http://b/p", "s3://", "s3:///p", "s3://b/a//c", "s3://b/../x",
                          "s3://b c/p", "s3://b/./p"}) {
    EXPECT_EQ(ParseS3Url(bad, &o).code(), Code::kInvalid) << bad;
  }
}

TEST(S3OptionsTest, ParsesEndpoints) {
  auto e = ParseS3Endpoint("http://127.0.0.1:7480");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->scheme, "http");
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 7480);
  e = ParseS3Endpoint("HTTPS://S3.Example.COM/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->scheme, "https");
  EXPECT_EQ(e->host, "s3.example.com");
  EXPECT_EQ(e->port, 0);
  e = ParseS3Endpoint("http://[::1]:9000");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "[::1]");
  EXPECT_EQ(e->port, 9000);
  for (const char* bad : {"ftp://h", "h:80", "http://", "http://h:0", "http://h:99999",
                          "http://h:8x", "http://h/path", "http://[::1"}) {
    EXPECT_EQ(ParseS3Endpoint(bad).status().code(), Code::kInvalid) << bad;
  }
  auto secret = ParseS3Endpoint("http://user:hunter2@host");
  EXPECT_EQ(secret.status().code(), Code::kInvalid);
  EXPECT_EQ(secret.status().message().find("hunter2"), std::string::npos);
}

TEST(S3OptionsTest, AutoAddressing) {
  S3Options o;
  o.bucket = "bucket";
  auto style = [&](const char* url) { return UsePathStyle(o, *ParseS3Endpoint(url)); };
  EXPECT_TRUE(style("http://127.0.0.1:7480"));
  EXPECT_TRUE(style("http://localhost:9000"));
  EXPECT_TRUE(style("http://[::1]:9000"));
  EXPECT_FALSE(style("https://s3.us-east-1.amazonaws.com"));
  o.bucket = "with.dots";
  EXPECT_TRUE(style("https://s3.us-east-1.amazonaws.com"));
  o.bucket = "bucket";
  o.addressing = S3Options::Addressing::kPath;
  EXPECT_TRUE(style("https://s3.us-east-1.amazonaws.com"));
  o.addressing = S3Options::Addressing::kVirtual;
  EXPECT_FALSE(style("http://127.0.0.1:7480"));
}

TEST(S3OptionsTest, ResolvesFromTheEnvironment) {
  test::TempDir home;
  ScopedEnv clean(CleanEnv(home.path()));
  ScopedEnv env({{"AWS_ACCESS_KEY_ID", "AKID"},
                 {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                 {"AWS_SESSION_TOKEN", "TOKEN"},
                 {"AWS_DEFAULT_REGION", "eu-west-3"},
                 {"AWS_ENDPOINT_URL", "http://127.0.0.1:1234/"}});
  S3Options o;
  o.bucket = "b";
  o.prefix = "p/q/";
  ASSERT_TRUE(o.Resolve().ok());
  EXPECT_EQ(o.prefix, "p/q/");
  EXPECT_EQ(o.region, "eu-west-3");
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:1234");
  EXPECT_EQ(o.credentials.access_key_id, "AKID");
  EXPECT_EQ(o.credentials.secret_access_key, "SECRET");
  EXPECT_EQ(o.credentials.session_token, "TOKEN");
  {
    ScopedEnv region({{"AWS_REGION", "ap-south-1"}, {"AWS_ENDPOINT_URL", std::nullopt}});
    S3Options d;
    d.bucket = "b";
    ASSERT_TRUE(d.Resolve().ok());
    EXPECT_EQ(d.region, "ap-south-1");
    EXPECT_EQ(d.endpoint, "https://s3.ap-south-1.amazonaws.com");
  }
  S3Options bad = o;
  bad.multipart_part_bytes = 1 << 20;
  EXPECT_EQ(bad.Resolve().code(), Code::kInvalid);
  bad = o;
  bad.max_connections = 0;
  EXPECT_EQ(bad.Resolve().code(), Code::kInvalid);
  bad = o;
  bad.prefix = "a//b";
  EXPECT_EQ(bad.Resolve().code(), Code::kInvalid);
}

TEST(S3OptionsTest, CredentialsFromSharedFilesAndProfiles) {
  test::TempDir home;
  ScopedEnv clean(CleanEnv(home.path()));
  std::filesystem::create_directories(home.Sub(".aws"));
  std::ofstream(home.Sub(".aws/credentials"))
      << "# comment\n[default]\naws_access_key_id = DEFKEY\naws_secret_access_key=DEFSECRET\n\n"
      << "[dev]\n  aws_access_key_id=DEVKEY  \naws_secret_access_key = DEVSECRET\n"
      << "aws_session_token = DEVTOKEN\n[half]\naws_access_key_id = ONLY\n";
  std::ofstream(home.Sub(".aws/config")) << "[default]\nregion = us-west-2\n[profile dev]\n"
                                         << "region=eu-north-1\n";
  auto c = LoadAwsCredentials("");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key_id, "DEFKEY");
  EXPECT_EQ(c->secret_access_key, "DEFSECRET");
  EXPECT_EQ(c->session_token, "");
  EXPECT_EQ(LoadAwsRegion(""), "us-west-2");
  {
    ScopedEnv profile(EnvVars{{"AWS_PROFILE", "dev"}});
    c = LoadAwsCredentials("");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->access_key_id, "DEVKEY");
    EXPECT_EQ(c->session_token, "DEVTOKEN");
    EXPECT_EQ(LoadAwsRegion(""), "eu-north-1");
  }
  {
    // The environment's keys win over the files, unless a profile is named explicitly.
    ScopedEnv keys({{"AWS_ACCESS_KEY_ID", "ENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "ENVSECRET"}});
    EXPECT_EQ(LoadAwsCredentials("")->access_key_id, "ENVKEY");
    EXPECT_EQ(LoadAwsCredentials("dev")->access_key_id, "DEVKEY");
  }
  EXPECT_EQ(LoadAwsCredentials("half").status().code(), Code::kInvalid);
  auto none = LoadAwsCredentials("nobody");
  EXPECT_EQ(none.status().code(), Code::kPermission);
  EXPECT_EQ(none.status().message().find("DEFSECRET"), std::string::npos);
}

TEST(S3OptionsTest, NoCredentialsAnywhereIsPermission) {
  test::TempDir home;
  ScopedEnv clean(CleanEnv(home.path()));
  S3Options o;
  o.bucket = "b";
  EXPECT_EQ(o.Resolve().code(), Code::kPermission);
  EXPECT_EQ(OpenS3Backend(o).status().code(), Code::kPermission);
}

}  // namespace
}  // namespace ckptfs
