"""The hand-written Session message codec (no cluster needed)."""

from oncekv import _wire


def test_session_ref_encodes_as_protobuf_would():
    # client_id 300 = varint ac 02; secret: field 2, length 16.
    secret = bytes(range(16))
    assert _wire.encode_session_ref(300, secret) == bytes.fromhex("08ac0212") + b"\x10" + secret
    assert _wire.encode_register(b"\x01" * 16) == b"\x0a\x10" + b"\x01" * 16


def test_register_reply_decodes_and_skips_what_it_does_not_know():
    secret = bytes(range(16))
    reply = (bytes.fromhex("0a0408011002")          # header (a message: skipped)
             + b"\x10\xac\x02"                      # client_id 300
             + b"\x1a\x10" + secret                 # secret
             + b"\x20\xe0\xd4\x03"                  # ttl_ms 60000
             + b"\x28\x80\x01"                      # window 128
             + b"\x31" + b"\x00" * 8)               # a future fixed64 field 6
    got = _wire.decode_register(reply)
    assert (got.client_id, got.secret, got.ttl_ms, got.window) == (300, secret, 60000, 128)
