#include "backends/s3_xml.h"

#include <gtest/gtest.h>

#include <string>

#include "backends/s3_client.h"

namespace ckptfs {
namespace {

TEST(S3XmlTest, ParsesAListing) {
  const std::string doc =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>1/a+b==</NextContinuationToken>"
      "<Contents><Key>p/a&amp;b&lt;c&gt;&quot;d&apos;</Key><Size>12</Size></Contents>"
      "<Contents><Key>p/&#233;&#x20AC;&#x1F600;</Key><Size>0</Size><Owner><ID>x</ID></Owner>"
      "</Contents><!-- a comment --><EncodingType>url</EncodingType></ListBucketResult>\n";
  auto r = ParseXml(doc);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name, "ListBucketResult");
  EXPECT_EQ(r->ChildText("IsTruncated"), "true");
  EXPECT_EQ(r->ChildText("NextContinuationToken"), "1/a+b==");
  EXPECT_EQ(r->ChildText("Missing"), "");
  std::vector<std::string> keys;
  for (const XmlElement& c : r->children) {
    if (c.name == "Contents") keys.push_back(c.ChildText("Key"));
  }
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], "p/a&b<c>\"d'");
  EXPECT_EQ(keys[1], "p/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST(S3XmlTest, TextAroundChildrenCdataAndPrefixes) {
  auto r = ParseXml("<s3:A a='x>y' b=\"/>\"> one <![CDATA[<two&>]]><B/>three</s3:A>");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name, "A");
  EXPECT_EQ(r->text, " one <two&>three");
  ASSERT_EQ(r->children.size(), 1u);
  EXPECT_EQ(r->children[0].name, "B");
}

TEST(S3XmlTest, RefusesMalformedDocuments) {
  for (const char* bad : {"",
                          "   ",
                          "text",
                          "<a>",
                          "<a></b>",
                          "<a><b></a></b>",
                          "<a>&bogus;</a>",
                          "<a>&#0;</a>",
                          "<a>&#xD800;</a>",
                          "<a>&#x110000;</a>",
                          "<a>&amp</a>",
                          "<a/><b/>",
                          "<!DOCTYPE a [<!ENTITY e \"x\">]><a>&e;</a>",
                          "<a b></a>",
                          "<a b=c></a>",
                          "<a b='c></a>",
                          "<a><![CDATA[x</a>",
                          "<a><!-- x</a>",
                          "<a>&#xZZ;</a>",
                          "<a/ >",
                          "<>",
                          "</a>"}) {
    EXPECT_FALSE(ParseXml(bad).ok()) << bad;
  }
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<d>";
  for (int i = 0; i < 100; ++i) deep += "</d>";
  auto r = ParseXml(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
}

TEST(S3XmlTest, EscapeRoundTrips) {
  std::string s = "\"etag\" & <x> 'y'";
  auto r = ParseXml("<E>" + XmlEscape(s) + "</E>");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, s);
}

TEST(S3XmlTest, ErrorDocuments) {
  S3ErrorInfo e = ParseS3Error(
      "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message>"
      "<RequestId>r</RequestId></Error>");
  EXPECT_EQ(e.code, "NoSuchKey");
  EXPECT_EQ(e.message, "gone");
  EXPECT_EQ(ParseS3Error("").code, "");
  EXPECT_EQ(ParseS3Error("<html>502</html>").code, "");
  EXPECT_EQ(ParseS3Error("not xml at all").code, "");
}

}  // namespace
}  // namespace ckptfs
