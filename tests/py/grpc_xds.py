"""A real gRPC (C-core, grpcio) server and xDS client for the proxyless end-to-end test.

  grpc_xds.py server PORT NAME    serves grpc.health.v1 on 127.0.0.1:PORT; service NAME is SERVING
  grpc_xds.py client TARGET NAME  calls Health/Check(NAME) on TARGET (e.g. xds:///host:port)

The client reads GRPC_XDS_BOOTSTRAP itself (grpcio's xds resolver); it retries until the
deadline and prints `status=<ServingStatus>` on success, the last error otherwise.
"""
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def serve(port, name):
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    servicer = health.HealthServicer()
    servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"serving port={bound}", flush=True)
    server.wait_for_termination()


def call(target, name, deadline=40.0):
    end = time.monotonic() + deadline
    last = None
    with grpc.insecure_channel(target) as channel:
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
    if mode == "server":
        serve(int(arg), name)
    else:
        sys.exit(call(arg, name))
