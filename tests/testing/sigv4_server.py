"""An S3-like server that checks each request's SigV4 signature with an
independent implementation, botocore's (the AWS SDK for Python's signer),
for the object-storage tests: s3rver checks only the access key id.

    python3 tests/testing/sigv4_server.py DIR KEY SECRET REGION

(run by an interpreter that has botocore) prints its port and serves until
stdin closes: GET /BUCKET/KEY with Range (the file DIR/KEY; any bucket
name), and GET /BUCKET?list-type=2 (ListObjectsV2 over DIR's files, with
prefix, delimiter '/', max-keys and an opaque continuation token). A
request whose signature botocore does not compute from the same request
and secret is 403 SignatureDoesNotMatch; one with another key id is 403
InvalidAccessKeyId. `SigV4Server` starts it from a test; `botocore_python()`
is an interpreter that can run it (None: none here)."""
import base64
import http.server
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import urllib.parse
from xml.sax.saxutils import escape

from range_server import ChildServer


def botocore_python():
    """This interpreter, or python3 on PATH, where botocore imports; else None."""
    for exe in dict.fromkeys([sys.executable, shutil.which("python3")]):
        if exe and subprocess.run([exe, "-c", "import botocore.auth"], capture_output=True, timeout=60).returncode == 0:
            return exe
    return None


class SigV4Server(ChildServer):
    def __init__(self, directory, key, secret, region="us-east-1"):
        exe = botocore_python()
        if exe is None:
            raise FileNotFoundError("no Python here has botocore")
        port = self._start([exe, __file__, str(directory), key, secret, region], "sigv4_server")
        self.endpoint = "http://127.0.0.1:%d" % port


def serve(directory, key, secret, region):
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth_re = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, *"
                         r"SignedHeaders=([^,]+), *Signature=([0-9a-f]{64})$")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def reply(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error(self, code, s3code, message):
            body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>%s</Code><Message>%s</Message></Error>"
                    % (s3code, escape(message))).encode()
            self.reply(code, body, [("Content-Type", "application/xml")])

        def verified(self):
            m = auth_re.match(self.headers.get("Authorization", ""))
            if not m:
                self.error(403, "AccessDenied", "no SigV4 Authorization header")
                return False
            key_id, day, req_region, signed, signature = m.groups()
            if key_id != key:
                self.error(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist")
                return False
            amz_date = self.headers.get("X-Amz-Date", "")
            if req_region != region or not amz_date.startswith(day):
                self.error(403, "AuthorizationHeaderMalformed", "region or date of the credential scope")
                return False
            # The same request as botocore would sign it: the signed headers
            # only, the URL as sent, the secret this server knows.
            headers = {name: self.headers.get(name, "") for name in signed.split(";")}
            request = AWSRequest(method=self.command, url="http://%s%s" % (self.headers["Host"], self.path),
                                 headers=headers)
            request.context["timestamp"] = amz_date
            signer = S3SigV4Auth(Credentials(key, secret), "s3", region)
            canonical = signer.canonical_request(request)
            expect = signer.signature(signer.string_to_sign(request, canonical), request)
            if expect != signature:
                self.error(403, "SignatureDoesNotMatch",
                           "The request signature we calculated does not match the signature you provided")
                return False
            return True

        def do_GET(self):
            if not self.verified():
                return
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.lstrip("/").split("/", 1)
            if len(parts) == 1 or parts[1] == "":
                return self.list_objects(urllib.parse.parse_qs(url.query, keep_blank_values=True))
            path = os.path.join(directory, urllib.parse.unquote(parts[1]))
            if not os.path.isfile(path):
                return self.error(404, "NoSuchKey", "The specified key does not exist.")
            size = os.path.getsize(path)
            etag = '"%x-%x"' % (size, os.stat(path).st_mtime_ns)
            m = re.match(r"bytes=(\d+)-(\d+)$", self.headers.get("Range", ""))
            first, last = (int(m.group(1)), min(int(m.group(2)), size - 1)) if m else (0, size - 1)
            with open(path, "rb") as f:
                f.seek(first)
                body = f.read(last - first + 1)
            headers = [("ETag", etag)] + ([("Content-Range", "bytes %d-%d/%d" % (first, last, size))] if m else [])
            self.reply(206 if m else 200, body, headers)

        def list_objects(self, q):
            prefix = q.get("prefix", [""])[0]
            delimiter = q.get("delimiter", [""])[0]
            max_keys = int(q.get("max-keys", ["1000"])[0])
            after = base64.b64decode(q["continuation-token"][0])[:-2].decode() if "continuation-token" in q else ""
            keys = []
            for root, _, files in os.walk(directory):
                for name in files:
                    k = os.path.relpath(os.path.join(root, name), directory)
                    if k.startswith(prefix) and k > after and not (delimiter and delimiter in k[len(prefix):]):
                        keys.append(k)
            keys.sort()
            page, more = keys[:max_keys], len(keys) > max_keys
            # A token with '+', '/' (and '=' where padded): base64 of the last
            # key and two bytes; the client must encode them in its query.
            token = base64.b64encode(page[-1].encode() + b"\xfb\xff").decode() if more else ""
            body = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult>",
                    "<IsTruncated>%s</IsTruncated>" % ("true" if more else "false")]
            body += ["<Contents><Key>%s</Key></Contents>" % escape(k) for k in page]
            if more:
                body.append("<NextContinuationToken>%s</NextContinuationToken>" % token)
            body.append("</ListBucketResult>")
            self.reply(200, "".join(body).encode(), [("Content-Type", "application/xml")])

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        request_queue_size = 256

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    serve(*sys.argv[1:5])
