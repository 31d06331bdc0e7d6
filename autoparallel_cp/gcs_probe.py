"""Does a Ray cluster's GCS answer at host:port? Asked as a Ray driver asks it, within a deadline.

`ray.init(address="host:port")` retries an address where no GCS answers without end (Ray 2.60:
"Failed to connect to GCS ... within 5 seconds", again and again), deaf to SIGTERM; a TCP connect
succeeds on any listening service (an HTTP server, a Ray client port given without `ray://`).
So the port is asked the first question of a Ray driver, the unary gRPC call
`/ray.rpc.NodeInfoGcsService/GetClusterId` (ray/core/generated/gcs_service_pb2_grpc.py), with an
empty request, and must answer a GetClusterIdReply holding a cluster id (field 2, bytes), or,
on a cluster with token authentication (the default of Ray 2.60's GCS for a caller without the
token), the gRPC status UNAUTHENTICATED (16) with Ray's "InvalidAuthToken" message: that too is a
Ray GCS, and `ray.init` then authenticates as the user configured it.

The call is written by hand over one TCP socket (HTTP/2, RFC 9113; headers as HPACK literals
without indexing, RFC 7541 section 6.2.2; the gRPC message framing of grpc/doc/PROTOCOL-HTTP2.md):
plain `ray` installs no Python gRPC, and nothing here can block past the deadline.
"""

from __future__ import annotations

import socket
import struct
import time

GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20


class NotRay(Exception):
    """The address did not answer as a Ray GCS; the message says what it did."""


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def _hpack_int(n: int) -> bytes:
    """An HPACK integer with a 7-bit prefix (RFC 7541 section 5.1), the H (Huffman) bit 0."""
    if n < 127:
        return bytes([n])
    out, n = bytearray([127]), n - 127
    while n >= 128:
        out.append((n % 128) + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def _headers(authority: str) -> bytes:
    block = bytearray()
    for name, value in ((":method", "POST"), (":scheme", "http"), (":path", GCS_METHOD),
                        (":authority", authority), ("content-type", "application/grpc"),
                        ("te", "trailers")):
        block += b"\x00"  # literal header field without indexing, new name
        for text in (name, value):
            raw = text.encode("ascii")
            block += _hpack_int(len(raw)) + raw
    return bytes(block)


def _literals(block: bytes) -> dict[str, str]:
    """The header fields of an HPACK block sent as literals with literal names and no Huffman
    coding (how gRPC's C++ server sends grpc-status and grpc-message); others are skipped."""
    out: dict[str, str] = {}
    i = 0
    try:
        while i < len(block):
            b = block[i]
            if b & 0x80:  # indexed field
                _, i = _prefixed(block, i, 7)
                continue
            if b & 0xE0 == 0x20:  # dynamic table size update
                _, i = _prefixed(block, i, 5)
                continue
            index, i = _prefixed(block, i, 6 if b & 0x40 else 4)
            name = None
            if index == 0:
                name, i = _string(block, i)
            value, i = _string(block, i)
            if name is not None and value is not None:
                out[name] = value
    except IndexError:
        pass
    return out


def _prefixed(b: bytes, i: int, bits: int) -> tuple[int, int]:
    """An HPACK integer with a `bits`-bit prefix at b[i] (RFC 7541 section 5.1)."""
    top = (1 << bits) - 1
    n, i = b[i] & top, i + 1
    if n < top:
        return n, i
    shift = 0
    while True:
        byte, i = b[i], i + 1
        n += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, i


def _string(b: bytes, i: int) -> tuple[str | None, int]:
    """An HPACK string literal: its text, or None when Huffman-coded (not decoded here)."""
    huffman = bool(b[i] & 0x80)
    size, i = _prefixed(b, i, 7)
    raw = b[i:i + size]
    if len(raw) < size:
        raise IndexError
    return (None if huffman else raw.decode("latin-1")), i + size


def _has_cluster_id(message: bytes) -> bool:
    """Whether a protobuf message holds a non-empty field 2 of wire type 2 (the cluster id)."""
    i = 0
    while i < len(message):
        key, i = _varint(message, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(message, i)
        elif wire == 2:
            size, i = _varint(message, i)
            if field == 2 and size > 0 and i + size <= len(message):
                return True
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            return False
    return False


def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while i < len(b):
        byte = b[i]
        i += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, i
        if shift > 63:
            break
    raise NotRay("answered with a malformed message")


def _recv(sock: socket.socket, n: int, deadline: float, timeout: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotRay(f"no answer as Ray within {timeout:g} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise NotRay(f"no answer as Ray within {timeout:g} s") from None
        if not chunk:
            raise NotRay("the service closed the connection without answering as Ray")
        buf += chunk
    return bytes(buf)


def probe_gcs(host: str, port: int, timeout: float) -> None:
    """Return when a Ray GCS answers GetClusterId at host:port within `timeout` seconds; else
    raise NotRay (what answered instead), or OSError when nothing accepts a connection."""
    deadline = time.monotonic() + timeout
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(_PREFACE + _frame(_SETTINGS, 0, 0)
                     + _frame(_HEADERS, _END_HEADERS, 1, _headers(authority))
                     + _frame(_DATA, _END_STREAM, 1, b"\x00\x00\x00\x00\x00"))
        first, data = True, bytearray()
        while True:
            head = _recv(sock, 9, deadline, timeout)
            size = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            if first and (kind != _SETTINGS or stream != 0 or size % 6 or size > 1 << 14):
                raise NotRay("it does not speak gRPC (HTTP/2)")
            first = False
            payload = _recv(sock, size, deadline, timeout) if size else b""
            if kind == _SETTINGS and not flags & _ACK:
                sock.sendall(_frame(_SETTINGS, _ACK, 0))
            elif kind == _PING and not flags & _ACK:
                sock.sendall(_frame(_PING, _ACK, 0, payload))
            elif kind == _GOAWAY or (kind == _RST and stream == 1):
                raise NotRay("the gRPC service refused the call: it is not a Ray GCS")
            elif kind == _DATA and stream == 1:
                if flags & _PADDED and payload:
                    payload = payload[1:len(payload) - payload[0]]
                data += payload
                if len(data) >= 5:
                    length = int.from_bytes(data[1:5], "big")
                    if len(data) >= 5 + length:
                        if data[0] == 0 and _has_cluster_id(bytes(data[5:5 + length])):
                            return
                        raise NotRay("the gRPC service answered without a Ray cluster id")
            elif kind == _HEADERS and stream == 1 and flags & _END_STREAM:
                # trailers (or trailers only): the gRPC status of the call
                if flags & _PADDED and payload:
                    payload = payload[1:len(payload) - payload[0]]
                if flags & _PRIORITY:
                    payload = payload[5:]
                fields = _literals(payload)
                status = fields.get("grpc-status")
                if status == "16" and fields.get("grpc-message", "").startswith(
                        "InvalidAuthToken"):
                    return  # Ray's GCS, asking for the token the driver will send
                raise NotRay(f"a gRPC service answers there, not as a Ray GCS (grpc-status "
                             f"{status or '?'}; a Ray client server needs ray://host:port)")
