#!/usr/bin/env python3
"""An empty Kubernetes API server on loopback, for Istio's pilot-discovery run without Kubernetes.

Istiod at this commit cannot run without a Kubernetes client: with only `--configDir` its
ServiceEntry controller dereferences the nil multicluster controller
(pilot/pkg/serviceregistry/serviceentry/controller.go:237 -> pkg/kube/multicluster/
secretcontroller.go:246; pilot/pkg/bootstrap/server.go initMulticluster returns early when
kubeClient == nil). This server answers every list with no items, holds every watch open with
no events, stores what istiod creates (leases, config maps) in memory, and answers 404 for the
rest. It also stands in for Kubernetes' token issuer: `/token?namespace=&serviceAccount=&audience=&ttl=`
returns an RS256 service-account token and `/jwks.json` the key that verifies it, for istiod's
JWT_RULE ({"issuer":"fake-apiserver","jwks_uri":"http://<this>/jwks.json","audiences":["istio-ca"]}).

usage: fake-apiserver.py [--port N] [--issuer NAME]   (prints `listening addr=127.0.0.1:<port>`)
"""
import argparse, base64, json, threading, time, sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlparse, parse_qs

STORE = {}
LOCK = threading.Lock()
RV = [100]
ISSUER = None
VERBOSE = False


KINDS = {
    "namespaces": "Namespace", "services": "Service", "pods": "Pod", "nodes": "Node",
    "endpointslices": "EndpointSlice", "endpoints": "Endpoints", "secrets": "Secret",
    "configmaps": "ConfigMap", "serviceaccounts": "ServiceAccount", "leases": "Lease",
    "customresourcedefinitions": "CustomResourceDefinition",
    "mutatingwebhookconfigurations": "MutatingWebhookConfiguration",
    "validatingwebhookconfigurations": "ValidatingWebhookConfiguration",
}


def next_rv():
    with LOCK:
        RV[0] += 1
        return str(RV[0])


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b'=').decode()


class Issuer:
    """RS256 tokens (istiod's JWT authenticator, go-oidc with its defaults, takes RS256 only)
    for system:serviceaccount:<ns>:<sa>, and the JWKS that verifies them."""

    def __init__(self, issuer):
        from cryptography.hazmat.primitives.asymmetric import rsa
        self.issuer = issuer
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        n = self.key.public_key().public_numbers()
        self.jwks = json.dumps({"keys": [{
            "kty": "RSA", "alg": "RS256", "use": "sig", "kid": "fake-apiserver",
            "n": b64(n.n.to_bytes((n.n.bit_length() + 7) // 8, 'big')),
            "e": b64(n.e.to_bytes(3, 'big'))}]}).encode()

    def token(self, namespace, service_account, audience, ttl):
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        now = int(time.time())
        head = b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "fake-apiserver"}).encode())
        claims = b64(json.dumps({
            "iss": self.issuer, "aud": [audience], "iat": now, "nbf": now, "exp": now + ttl,
            "sub": "system:serviceaccount:%s:%s" % (namespace, service_account)}).encode())
        signed = (head + '.' + claims).encode()
        sig = self.key.sign(signed, padding.PKCS1v15(), hashes.SHA256())
        return signed + b'.' + b64(sig).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, fmt, *args):
        if VERBOSE:
            sys.stderr.write("%s %s\n" % (self.command, self.path))

    def reply(self, code, obj, ctype='application/json'):
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def status(self, code, reason):
        self.reply(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "reason": reason, "code": code})

    def body(self):
        n = int(self.headers.get('Content-Length') or 0)
        return json.loads(self.rfile.read(n) or b'{}')

    def do_GET(self):
        u = urlparse(self.path)
        q = parse_qs(u.query)
        p = u.path.rstrip('/')
        if p == '/jwks.json':
            return self.reply(200, ISSUER.jwks)
        if p == '/token':
            one = lambda k, d: q.get(k, [d])[0]
            return self.reply(200, ISSUER.token(one('namespace', 'default'),
                                                one('serviceAccount', 'default'),
                                                one('audience', 'istio-ca'),
                                                int(one('ttl', '43200'))), 'text/plain')
        if p == '/version':
            return self.reply(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0",
                                    "platform": "linux/amd64"})
        if p == '/api':
            return self.reply(200, {"kind": "APIVersions", "versions": ["v1"],
                                    "serverAddressByClientCIDRs": []})
        if p == '/apis':
            return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        if p.startswith('/api/') or p.startswith('/apis/'):
            if q.get('watch', ['false'])[0] in ('true', '1'):
                return self.hold_watch(p, q)
            with LOCK:
                obj = STORE.get(p)
            if obj is not None:
                return self.reply(200, obj)
            parts = p.split('/')
            # A collection is .../<resource> (or .../namespaces/<ns>/<resource>); an object adds a name.
            core = parts[1] == 'api'
            rest = parts[3:] if core else parts[4:]
            if rest and rest[0] == 'namespaces' and len(rest) >= 3:
                rest = rest[2:]
            if len(rest) == 1:
                with LOCK:
                    items = [v for k, v in STORE.items() if k.startswith(p + '/')]
                return self.reply(200, {"kind": "List", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": str(RV[0])}, "items": items})
            return self.status(404, "NotFound")
        return self.status(404, "NotFound")

    def hold_watch(self, path, q):
        """A watch: the stored objects and, for a watch-list (sendInitialEvents), the bookmark
        that ends the initial events; then nothing until the timeout."""
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()

        def chunk(obj):
            data = json.dumps(obj).encode() + b'\n'
            self.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))
            self.wfile.flush()

        try:
            parts = path.split('/')
            api_version = 'v1' if parts[1] == 'api' else parts[2] + '/' + parts[3]
            resource = parts[-1]
            if q.get('sendInitialEvents', ['false'])[0] == 'true':
                with LOCK:
                    items = [v for k, v in STORE.items() if k.startswith(path + '/')]
                for item in items:
                    chunk({"type": "ADDED", "object": item})
                chunk({"type": "BOOKMARK", "object": {
                    "kind": KINDS.get(resource, resource.capitalize()), "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(RV[0]),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})
            timeout = int(q.get('timeoutSeconds', ['600'])[0])
            time.sleep(min(timeout, 600))
            self.wfile.write(b'0\r\n\r\n')
        except OSError:
            pass

    def do_POST(self):
        obj = self.body()
        md = obj.setdefault('metadata', {})
        md['resourceVersion'] = next_rv()
        md.setdefault('uid', 'uid-' + md['resourceVersion'])
        name = md.get('name') or ('gen-' + md['resourceVersion'])
        md['name'] = name
        with LOCK:
            STORE[urlparse(self.path).path.rstrip('/') + '/' + name] = obj
        self.reply(201, obj)

    def do_PUT(self):
        obj = self.body()
        obj.setdefault('metadata', {})['resourceVersion'] = next_rv()
        with LOCK:
            STORE[urlparse(self.path).path.rstrip('/')] = obj
        self.reply(200, obj)

    def do_PATCH(self):
        p = urlparse(self.path).path.rstrip('/')
        self.body()
        with LOCK:
            obj = STORE.get(p)
        if obj is None:
            return self.status(404, "NotFound")
        self.reply(200, obj)

    def do_DELETE(self):
        with LOCK:
            STORE.pop(urlparse(self.path).path.rstrip('/'), None)
        self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def main():
    global ISSUER, VERBOSE
    ap = argparse.ArgumentParser()
    ap.add_argument('--port', type=int, default=0)
    ap.add_argument('--issuer', default='fake-apiserver')
    ap.add_argument('--verbose', action='store_true', help='log every request on stderr')
    a = ap.parse_args()
    ISSUER = Issuer(a.issuer)
    VERBOSE = a.verbose
    srv = ThreadingHTTPServer(('127.0.0.1', a.port), Handler)
    srv.daemon_threads = True
    print("listening addr=127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == '__main__':
    main()
