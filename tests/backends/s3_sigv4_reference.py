"""Signs requests with botocore, the reference for tests/backends/sigv4_test.cc.

Reads one request per line on stdin and writes one line per request on stdout:
    AUTHORIZATION <TAB> hex(canonical request) <TAB> x-amz-content-sha256 or '-'

Input fields, tab-separated; "hex" fields are hex-encoded bytes (so that any byte survives), and
list fields are '-' (empty) or space-separated "hexname:hexvalue" pairs:
    flavor(s3|generic) method scheme hex(host) hex(raw path) query-list header-list hex(body)
    hex(access key) hex(secret key) hex(session token) region service timestamp(YYYYMMDDTHHMMSSZ)

The path is raw: it is percent-encoded here the way botocore's S3 serializer encodes a key
(quote, safe "/~"), and query values are handed to botocore as params, which it encodes itself.
Run with Debian's /usr/bin/python3, which has python3-botocore.
"""
import datetime
import sys
import types
from urllib.parse import quote

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

_now = [datetime.datetime(2013, 5, 24)]


class _FixedClock(datetime.datetime):
    @classmethod
    def utcnow(cls):
        return _now[0]


# botocore reads the clock as botocore.auth.datetime.datetime.utcnow(); pin it per request.
botocore.auth.datetime = types.SimpleNamespace(datetime=_FixedClock)


def unhex(field):
    return b"" if field == "-" else bytes.fromhex(field)


def pairs(field):
    if field == "-":
        return []
    out = []
    for item in field.split(" "):
        name, value = item.split(":")
        out.append((unhex(name).decode("utf-8"), unhex(value).decode("utf-8")))
    return out


def sign(fields):
    (flavor, method, scheme, host, path, query, headers, body, akid, secret, token, region,
     service, stamp) = fields
    url = "%s://%s%s" % (scheme, unhex(host).decode(), quote(unhex(path), safe="/~"))
    request = AWSRequest(method=method, url=url, data=unhex(body), params=pairs(query))
    for name, value in pairs(headers):
        request.headers[name] = value  # HTTPHeaders appends: repeated names stay repeated
    creds = Credentials(unhex(akid).decode(), unhex(secret).decode(),
                        unhex(token).decode() or None)
    signer_class = botocore.auth.S3SigV4Auth if flavor == "s3" else botocore.auth.SigV4Auth
    signer = signer_class(creds, service, region)
    _now[0] = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
    signer.add_auth(request)
    authorization = request.headers["Authorization"]
    del request.headers["Authorization"]  # else the recomputed canonical request would sign it
    canonical = signer.canonical_request(request)
    return "%s\t%s\t%s" % (authorization, canonical.encode("utf-8").hex(),
                           request.headers.get("X-Amz-Content-SHA256", "-"))


def main():
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line:
            print(sign(line.split("\t")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
