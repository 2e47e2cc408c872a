#!/usr/bin/env python3
"""An independent gRPC client (Python grpcio, not tonic) calling the tollgate example server.

Shows what a non-Rust client sees when tollgate rejects a call: the status code, the message, the
google.rpc.RetryInfo and google.rpc.ErrorInfo details from grpc-status-details-bin, and the rate-limit
metadata. Run by hand (not part of CI):

    python3 -m venv /tmp/grpcvenv && /tmp/grpcvenv/bin/pip install grpcio grpcio-status
    cargo run --example grpc_server -- --limit 3 --period 10s &
    /tmp/grpcvenv/bin/python examples/python/grpc_client.py --addr 127.0.0.1:50051 --count 5

The messages of helloworld.proto are built from a descriptor here, so no generated code or protoc is needed.
"""

import argparse

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.rpc import error_details_pb2
from grpc_status import rpc_status

FIELDS = (
    "ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
    "x-ratelimit-used", "x-ratelimit-resource", "retry-after",
)


def helloworld_messages():
    """HelloRequest and HelloReply as in crates/tollgate-grpc/proto/helloworld.proto."""
    file = descriptor_pb2.FileDescriptorProto(name="helloworld.proto", package="helloworld", syntax="proto3")
    for name, field in (("HelloRequest", "name"), ("HelloReply", "message")):
        message = file.message_type.add(name=name)
        message.field.add(name=field, number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"helloworld.{name}"))
    return get("HelloRequest"), get("HelloReply")


def show_fields(metadata):
    for key, value in metadata or ():
        if key in FIELDS:
            print(f"    {key}: {value}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--api-key", help="sent as x-api-key metadata")
    args = parser.parse_args()

    hello_request, hello_reply = helloworld_messages()
    with grpc.insecure_channel(args.addr) as channel:
        say_hello = channel.unary_unary(
            "/helloworld.Greeter/SayHello",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=hello_reply.FromString,
        )
        metadata = [("x-api-key", args.api_key)] if args.api_key else None
        for i in range(1, args.count + 1):
            try:
                reply, call = say_hello.with_call(hello_request(name="python"), metadata=metadata)
                print(f"#{i} OK {reply.message!r}")
                show_fields(call.initial_metadata())
            except grpc.RpcError as err:
                print(f"#{i} {err.code().name}: {err.details()}")
                status = rpc_status.from_call(err)  # decodes grpc-status-details-bin
                for detail in status.details if status else ():
                    if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                        info = error_details_pb2.RetryInfo()
                        detail.Unpack(info)
                        delay = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
                        print(f"    RetryInfo.retry_delay: {delay:.6f}s")
                    elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                        info = error_details_pb2.ErrorInfo()
                        detail.Unpack(info)
                        print(f"    ErrorInfo: reason {info.reason} domain {info.domain} {dict(info.metadata)}")
                # A trailers-only response: everything arrives in one header block, which grpcio reports as
                # trailing metadata.
                show_fields(err.trailing_metadata())
                show_fields(err.initial_metadata())


if __name__ == "__main__":
    main()
