"""A misbehaving HTTP proxy in front of a real S3 endpoint, for tests/backends/s3_backend_test.cc.

    s3_flaky_proxy.py --upstream http://127.0.0.1:PORT --port-file FILE [--tls-dir DIR]

Listens on 127.0.0.1 (a free port, written to FILE once it listens) and forwards every request
unchanged, Host header included, so SigV4 signatures made for the proxy's address still verify
upstream. Faults are armed by the test through control requests, which are never forwarded:

    GET /__fault/arm?mode=MODE&count=N[&skip=K][&match=TEXT][&status=S&code=CODE]
        of the requests whose path and query contain TEXT (default: all), the next K pass, then
        the next N get the fault:
        mode=error     answer S (default 503) with an S3 <Error> document whose Code is CODE
        mode=drop      close the connection without answering
        mode=shorten   forward, then cut the last byte of a 2xx GET body (Content-Length fixed)
        mode=lengthen  forward, then add a byte to a 2xx GET body (Content-Length fixed)
    GET /__fault/stats  -> "faulted=F forwarded=P"
    GET /__fault/connections  -> connections accepted since start (control ones included)

With --tls-dir it speaks HTTPS, with a self-signed certificate for 127.0.0.1 that it writes to
DIR/cert.pem (the test's CA file). Faults and counts are global to the process; the test arms, runs one operation, reads stats.
Bounded: each upstream call has a 60 s timeout. Serves until killed.
"""
import argparse
import http.client
import http.server
import os
import ssl
import subprocess
import sys
import threading
import urllib.parse

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "content-length"}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.mode, self.count, self.skip, self.match = "error", 0, 0, ""
        self.status, self.code = 503, "SlowDown"
        self.faulted = self.forwarded = 0
        self.connections = 0

    def take(self, path):
        """The fault for the next request, or None."""
        with self.lock:
            if self.match not in path:
                return None
            if self.skip > 0:
                self.skip -= 1
                return None
            if self.count <= 0:
                return None
            self.count -= 1
            self.faulted += 1
            return (self.mode, self.status, self.code)


STATE = State()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with STATE.lock:
            STATE.connections += 1

    def _reply(self, status, headers, body, head=False):
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if not any(n.lower() == "content-length" for n, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _control(self):
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/__fault/arm":
            with STATE.lock:
                STATE.mode = q.get("mode", "error")
                STATE.count = int(q.get("count", "0"))
                STATE.skip = int(q.get("skip", "0"))
                STATE.match = q.get("match", "")
                STATE.status = int(q.get("status", "503"))
                STATE.code = q.get("code", "SlowDown")
                STATE.faulted = STATE.forwarded = 0
            body = b"armed"
        elif url.path == "/__fault/connections":
            with STATE.lock:
                body = str(STATE.connections).encode()
        else:
            with STATE.lock:
                body = ("faulted=%d forwarded=%d" % (STATE.faulted, STATE.forwarded)).encode()
        self._reply(200, [("Content-Type", "text/plain")], body)

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.startswith("/__fault/"):
            return self._control()
        fault = STATE.take(self.path)
        head = self.command == "HEAD"
        if fault and fault[0] == "error":
            _, status, code = fault
            doc = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>%s</Code>"
                   "<Message>injected by s3_flaky_proxy</Message></Error>" % code).encode()
            return self._reply(status, [("Content-Type", "application/xml")], doc, head)
        if fault and fault[0] == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return None
        conn = http.client.HTTPConnection(self.upstream[0], self.upstream[1], timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            headers = [(n, v) for n, v in resp.getheaders() if n.lower() not in HOP_BY_HOP]
        finally:
            conn.close()
        with STATE.lock:
            STATE.forwarded += 1
        if head:
            # A HEAD's Content-Length is the object's size, not this (empty) body's.
            cl = resp.getheader("Content-Length")
            if cl is not None:
                headers.append(("Content-Length", cl))
        elif fault and 200 <= resp.status < 300 and self.command == "GET":
            data = data[:-1] if fault[0] == "shorten" else data + b"!"
        return self._reply(resp.status, headers, data, head)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--tls-dir")
    args = ap.parse_args()
    up = urllib.parse.urlsplit(args.upstream)
    Handler.upstream = (up.hostname, up.port or 80)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if args.tls_dir:
        cert, key = os.path.join(args.tls_dir, "cert.pem"), os.path.join(args.tls_dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, args.port_file)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
