"""Hand encoding of the four tiny oncekv.Session messages.

They hold only varints and byte strings, so a few lines of protobuf wire format replace
generated code: the package then needs neither protoc nor a particular protobuf runtime
(python-etcd3 0.12 pins the old 3.x one, and two generated modules would have to agree).
Field numbers are those of crates/oncekv-proto/proto/oncekv/oncekv.proto.
"""

from dataclasses import dataclass

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(n):
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf, i):
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf):
    """Yields (field number, value) for every field; unknown ones are the caller's to skip."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, i = _read_varint(buf, i)
        elif kind == _LEN:
            size, i = _read_varint(buf, i)
            if i + size > len(buf):
                raise ValueError("truncated field")
            value, i = bytes(buf[i:i + size]), i + size
        elif kind == _I64:
            value, i = bytes(buf[i:i + 8]), i + 8
        elif kind == _I32:
            value, i = bytes(buf[i:i + 4]), i + 4
        else:
            raise ValueError("unsupported wire type %d" % kind)
        yield number, value


def _bytes_field(number, data):
    # proto3 leaves empty fields out; the server reads them as empty either way.
    if not data:
        return b""
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def _uint_field(number, n):
    if not n:
        return b""
    return _varint(number << 3 | _VARINT) + _varint(n)


def encode_register(nonce):
    """RegisterRequest{bytes nonce = 1}."""
    return _bytes_field(1, nonce)


def encode_session_ref(client_id, secret):
    """SessionKeepAliveRequest and SessionCloseRequest: {uint64 client_id = 1; bytes secret = 2}."""
    return _uint_field(1, client_id) + _bytes_field(2, secret)


@dataclass(frozen=True)
class Registered:
    client_id: int
    secret: bytes
    ttl_ms: int
    window: int


def decode_register(buf):
    """RegisterResponse{header = 1, client_id = 2, secret = 3, ttl_ms = 4, window = 5}."""
    got = {2: 0, 3: b"", 4: 0, 5: 0}
    for number, value in _fields(buf):
        if number in got:
            got[number] = value
    return Registered(client_id=got[2], secret=got[3], ttl_ms=got[4], window=got[5])


def identity(buf):
    """The deserializer for KeepAlive and Close replies, whose header nobody reads."""
    return buf
