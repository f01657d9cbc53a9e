#include "formats/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace ckptfs::json {
namespace {

Value MustParse(std::string_view text) {
  auto r = Parse(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? std::move(r).value() : Value();
}

std::string MustWrite(const Value& v) {
  auto r = Write(v);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

// The error must be kCorrupt and name the byte offset where the input went wrong.
void ExpectCorruptAt(std::string_view text, size_t offset) {
  auto r = Parse(text);
  ASSERT_FALSE(r.ok()) << "accepted: " << text;
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("at byte " + std::to_string(offset)), std::string::npos)
      << text << " -> " << r.status().message();
}

TEST(JsonTest, ScalarsAndTypes) {
  EXPECT_TRUE(MustParse("null").is_null());
  EXPECT_EQ(MustParse("true"), Value::Bool(true));
  EXPECT_EQ(MustParse(" false "), Value::Bool(false));
  EXPECT_EQ(MustParse("0"), Value::Int(0));
  EXPECT_EQ(MustParse("-0"), Value::Int(0));
  EXPECT_EQ(MustParse("42"), Value::Int(42));
  EXPECT_EQ(MustParse("-17"), Value::Int(-17));
  EXPECT_EQ(MustParse("1.5"), Value::Double(1.5));
  EXPECT_EQ(MustParse("1e2"), Value::Double(100.0));
  EXPECT_EQ(MustParse("-2.5E-3"), Value::Double(-2.5e-3));
  EXPECT_EQ(MustParse("\"hi\""), Value::String("hi"));
  EXPECT_EQ(MustParse("1.0").type(), Type::kDouble);
  EXPECT_EQ(TypeName(Type::kObject), "object");
}

TEST(JsonTest, IntegersUseInt64UntilTheyOverflow) {
  EXPECT_EQ(MustParse("9223372036854775807"), Value::Int(INT64_MAX));
  EXPECT_EQ(MustParse("-9223372036854775808"), Value::Int(INT64_MIN));
  // One past either end no longer fits: it becomes the nearest double.
  EXPECT_EQ(MustParse("9223372036854775808"), Value::Double(9223372036854775808.0));
  EXPECT_EQ(MustParse("-9223372036854775809"), Value::Double(-9223372036854775808.0));
  EXPECT_EQ(MustParse("123456789012345678901234567890"), Value::Double(1.2345678901234568e29));
}

TEST(JsonTest, ObjectsKeepDocumentOrder) {
  Value v = MustParse(R"({"z": 1, "a": [true, null, "x"], "m": {"k": -1.25}})");
  ASSERT_TRUE(v.is_object());
  const Object& o = v.as_object();
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].first, "z");
  EXPECT_EQ(o[1].first, "a");
  EXPECT_EQ(o[2].first, "m");
  ASSERT_NE(v.Find("a"), nullptr);
  EXPECT_EQ(v.Find("a")->as_array().size(), 3u);
  EXPECT_EQ(v.Find("m")->Find("k")->as_double(), -1.25);
  EXPECT_EQ(v.Find("missing"), nullptr);
  EXPECT_EQ(v.Find("z")->Find("z"), nullptr);  // not an object
  EXPECT_EQ(MustWrite(v), R"({"z":1,"a":[true,null,"x"],"m":{"k":-1.25}})");
}

TEST(JsonTest, EmptyContainers) {
  EXPECT_EQ(MustParse("{}"), Value::MakeObject());
  EXPECT_EQ(MustParse("[ ]"), Value::MakeArray());
  EXPECT_EQ(MustParse("{ \t\r\n}"), Value::MakeObject());
  EXPECT_EQ(MustWrite(MustParse(" [ {} , [] ] ")), "[{},[]]");
}

TEST(JsonTest, StringEscapes) {
  EXPECT_EQ(MustParse(R"("a\"b\\c\/d\be\ff\ng\rh\ti")").as_string(), "a\"b\\c/d\be\ff\ng\rh\ti");
  EXPECT_EQ(MustParse(R"("\u0041\u00e9\u20AC")").as_string(), "A\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(MustParse(R"("\u0000")").as_string(), std::string(1, '\0'));
  // A surrogate pair names one code point above U+FFFF: U+1F600 is F0 9F 98 80 in UTF-8.
  EXPECT_EQ(MustParse(R"("\ud83d\ude00")").as_string(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(MustParse(R"("\uDBFF\uDFFF")").as_string(), "\xf4\x8f\xbf\xbf");
  // Raw UTF-8 passes through.
  EXPECT_EQ(MustParse("\"\xc3\xb1\xe2\x82\xac\xf0\x9f\x98\x80\"").as_string(),
            "\xc3\xb1\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST(JsonTest, BadSurrogatesAreRejected) {
  ExpectCorruptAt(R"("\ude00")", 1);        // lone low surrogate
  ExpectCorruptAt(R"("ab\ud83d")", 3);      // high surrogate at the end
  ExpectCorruptAt(R"("\ud83dx")", 1);       // high surrogate followed by a plain character
  ExpectCorruptAt(R"("\ud83d\u0041")", 1);  // followed by a non-surrogate escape
  ExpectCorruptAt(R"("\ud83d\ud83d")", 1);  // followed by another high surrogate
  ExpectCorruptAt(R"("\u12G4")", 5);        // bad hex digit
  ExpectCorruptAt(R"("\u12")", 3);          // truncated escape
}

TEST(JsonTest, InvalidUtf8IsRejected) {
  ExpectCorruptAt("\"\x80\"", 1);              // continuation byte first
  ExpectCorruptAt("\"a\xc0\xaf\"", 2);         // overlong '/'
  ExpectCorruptAt("\"\xed\xa0\x80\"", 1);      // UTF-8-encoded surrogate
  ExpectCorruptAt("\"\xf4\x90\x80\x80\"", 1);  // above U+10FFFF
  ExpectCorruptAt("\"\xe2\x82\"", 1);          // truncated sequence
  ExpectCorruptAt("\"\xff\"", 1);
}

TEST(JsonTest, GrammarViolationsNameTheirOffset) {
  ExpectCorruptAt("", 0);
  ExpectCorruptAt("   ", 3);
  ExpectCorruptAt("\xef\xbb\xbf{}", 0);  // a byte-order mark
  ExpectCorruptAt("{} x", 3);
  ExpectCorruptAt("[1,]", 3);
  ExpectCorruptAt("[1 2]", 3);
  ExpectCorruptAt("{\"a\":1,}", 7);
  ExpectCorruptAt("{\"a\" 1}", 5);
  ExpectCorruptAt("{a:1}", 1);
  ExpectCorruptAt("{\"a\":}", 5);
  ExpectCorruptAt("[", 1);
  ExpectCorruptAt("{\"a\":1", 6);
  ExpectCorruptAt("\"abc", 4);
  ExpectCorruptAt("\"a\nb\"", 2);  // raw control character
  ExpectCorruptAt("\"\\x\"", 1);   // unknown escape
  ExpectCorruptAt("tru", 0);
  ExpectCorruptAt("nul", 0);
  ExpectCorruptAt("True", 0);
  ExpectCorruptAt("NaN", 0);
  ExpectCorruptAt("Infinity", 0);
  ExpectCorruptAt("01", 1);
  ExpectCorruptAt("-", 1);
  ExpectCorruptAt("+1", 0);
  ExpectCorruptAt("1.", 2);
  ExpectCorruptAt(".5", 0);
  ExpectCorruptAt("1e", 2);
  ExpectCorruptAt("1e+", 3);
  ExpectCorruptAt("[1]/*c*/", 3);
  ExpectCorruptAt("1e400", 0);  // out of the range of a double
}

TEST(JsonTest, DuplicateNamesAreRejectedUnlessAllowed) {
  ExpectCorruptAt(R"({"a":1,"b":2,"a":3})", 13);
  // Past the pairwise-check size the whole object is checked at its end.
  std::string big = "{";
  for (int i = 0; i < 100; ++i) big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  big += "\"k57\":0}";
  auto r = Parse(big);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate member name \"k57\""), std::string::npos);
  ParseOptions lax;
  lax.allow_duplicate_keys = true;
  auto ok = Parse(R"({"a":1,"a":2})", lax);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->as_object().size(), 2u);
  EXPECT_EQ(ok->Find("a")->as_int(), 1);  // Find returns the first
}

TEST(JsonTest, DepthLimit) {
  ParseOptions opt;
  opt.max_depth = 4;
  EXPECT_TRUE(Parse("[[[[1]]]]", opt).ok());
  auto r = Parse("[[[[[1]]]]]", opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at byte 4"), std::string::npos);
  // The default limit stops a deep document long before the stack would run out.
  std::string deep(100000, '[');
  EXPECT_EQ(Parse(deep).status().code(), Code::kCorrupt);
  std::string ok_depth = std::string(128, '[') + std::string(128, ']');
  EXPECT_TRUE(Parse(ok_depth).ok());
  std::string too_deep = std::string(129, '[') + std::string(129, ']');
  EXPECT_FALSE(Parse(too_deep).ok());
}

TEST(JsonTest, WriterEscapesLikeSerdeJson) {
  std::string out;
  ASSERT_TRUE(AppendQuoted("q\"b\\s/\b\f\n\r\t\x01\x1f\x7f\xc3\xa9", &out).ok());
  EXPECT_EQ(out, "\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xc3\xa9\"");
  std::string bad = "keep";
  Status st = AppendQuoted("\xc3", &bad);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_EQ(bad, "keep");
}

TEST(JsonTest, WriterNumbers) {
  EXPECT_EQ(MustWrite(Value::Int(INT64_MIN)), "-9223372036854775808");
  EXPECT_EQ(MustWrite(Value::Double(1.0)), "1.0");
  EXPECT_EQ(MustWrite(Value::Double(-0.0)), "-0.0");
  EXPECT_EQ(MustWrite(Value::Double(0.1)), "0.1");
  EXPECT_EQ(MustWrite(Value::Double(1e100)), "1e+100");
  EXPECT_EQ(MustWrite(Value::Double(123456789.0)), "123456789.0");
  EXPECT_EQ(Write(Value::Double(std::nan(""))).status().code(), Code::kInvalid);
  EXPECT_EQ(Write(Value::Double(HUGE_VAL)).status().code(), Code::kInvalid);
  EXPECT_EQ(Write(Value::String("\xff")).status().code(), Code::kInvalid);
}

TEST(JsonTest, RoundTripPreservesValuesAndTypes) {
  const char* docs[] = {
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
      R"([0,-1,1.5,-0.0,1e-300,1.7976931348623157e308,"\u0000\u001f\ud83d\ude00",true,false,null])",
      R"({"":{"":[[],{}]}})",
      R"(5e-324)",
  };
  for (const char* doc : docs) {
    Value v = MustParse(doc);
    std::string text = MustWrite(v);
    Value again = MustParse(text);
    EXPECT_EQ(v, again) << doc << " -> " << text;
    EXPECT_EQ(MustWrite(again), text);  // the writer's output is a fixed point
  }
}

TEST(JsonTest, BuildAndWrite) {
  Object o;
  o.emplace_back("name", Value::String("layer.0"));
  o.emplace_back("shape", Value::MakeArray({Value::Int(4), Value::Int(1024)}));
  o.emplace_back("ok", Value::Bool(true));
  Value v = Value::MakeObject(std::move(o));
  v.mutable_object().emplace_back("none", Value());
  EXPECT_EQ(MustWrite(v), R"({"name":"layer.0","shape":[4,1024],"ok":true,"none":null})");
}

TEST(JsonTest, Utf8Validator) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(
      IsValidUtf8("\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xc1\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xe0\x9f\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xf0\x8f\xbf\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xf5\x80\x80\x80"));
}

// A header of 10^5 tensors (several MB) parses in well under a second even unoptimized; this
// guards against quadratic behavior (duplicate checks, string appends).
TEST(JsonTest, LargeObjectParsesLinearly) {
  std::string doc = "{";
  for (int i = 0; i < 100000; ++i) {
    if (i) doc += ',';
    doc += "\"model.layers." + std::to_string(i) +
           ".weight\":{\"dtype\":\"BF16\",\"shape\":[4096,4096],\"data_offsets\":[0,33554432]}";
  }
  doc += "}";
  auto r = Parse(doc);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->as_object().size(), 100000u);
  EXPECT_EQ(MustWrite(*r), doc);
}

}  // namespace
}  // namespace ckptfs::json
