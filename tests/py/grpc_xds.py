"""A real gRPC (C-core, grpcio) server and xDS client for the proxyless end-to-end test.

  grpc_xds.py server PORT NAME [CERT_DIR]
      serves grpc.health.v1 on 127.0.0.1:PORT, service NAME SERVING; with CERT_DIR, mTLS with
      CERT_DIR/{key.pem,cert-chain.pem,root-cert.pem} (client certificates required)
  grpc_xds.py xds-server PORT NAME
      the same service as an xDS-enabled server on 0.0.0.0:PORT (GRPC_XDS_BOOTSTRAP): it asks
      LDS for xds.istio.io/grpc/lds/inbound/0.0.0.0:PORT and serves only once it has it, with
      the security that listener gives (xDS server credentials, plain text as the fallback)
  grpc_xds.py client TARGET NAME [xds-creds] [DEADLINE]
      calls Health/Check(NAME) on TARGET (e.g. xds:///host:port); with xds-creds, the channel
      takes its security from xDS (the bootstrap's certificate providers), plain text otherwise

The client reads GRPC_XDS_BOOTSTRAP itself (grpcio's xds resolver); it retries until the
deadline (seconds, default 40) and prints `status=<ServingStatus>` on success, the last error
otherwise.
"""
import sys
import time

import grpc
import grpc.experimental
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def read(d, f):
    with open(f"{d}/{f}", "rb") as fh:
        return fh.read()


def serve(port, name, cert_dir=None):
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    servicer = health.HealthServicer()
    servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if cert_dir:
        creds = grpc.ssl_server_credentials(
            [(read(cert_dir, "key.pem"), read(cert_dir, "cert-chain.pem"))],
            root_certificates=read(cert_dir, "root-cert.pem"),
            require_client_auth=True,
        )
        bound = server.add_secure_port(f"127.0.0.1:{port}", creds)
    else:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"serving port={bound}", flush=True)
    server.wait_for_termination()


def serve_xds(port, name):
    server = grpc.server(
        __import__("concurrent.futures").futures.ThreadPoolExecutor(4), xds=True
    )
    servicer = health.HealthServicer()
    servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
    bound = server.add_secure_port(f"0.0.0.0:{port}", creds)
    server.start()
    print(f"serving port={bound}", flush=True)
    server.wait_for_termination()


def call(target, name, xds_creds=False, deadline=40.0):
    end = time.monotonic() + deadline
    last = None
    if xds_creds:
        creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
        channel = grpc.secure_channel(target, creds)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                print(f"status={status}", flush=True)
                return 0
            except grpc.RpcError as e:
                last = f"{e.code()}: {e.details()}"
                print(f"retrying: {last}", flush=True)
                time.sleep(0.5)
    print(f"failed: {last}", flush=True)
    return 1


if __name__ == "__main__":
    mode, arg, name = sys.argv[1:4]
    rest = sys.argv[4:]
    if mode == "server":
        serve(int(arg), name, rest[0] if rest else None)
    elif mode == "xds-server":
        serve_xds(int(arg), name)
    else:
        xds_creds = "xds-creds" in rest
        numbers = [float(a) for a in rest if a != "xds-creds"]
        sys.exit(call(arg, name, xds_creds, numbers[0] if numbers else 40.0))
