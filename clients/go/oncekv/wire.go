package oncekv

// The Session service's messages, encoded by hand. They are five tiny messages of
// varints and byte strings; writing them out here keeps the package free of generated
// code and of protoc, and of any particular protobuf runtime version (Debian's GOPATH and
// a user's module graph rarely agree on one).

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Full gRPC method names of oncekv.Session (crates/oncekv-proto/proto/oncekv/oncekv.proto).
const (
	methodRegister  = "/oncekv.Session/Register"
	methodKeepAlive = "/oncekv.Session/KeepAlive"
	methodClose     = "/oncekv.Session/Close"
)

// Protobuf wire types used below.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// message is what wireCodec can carry.
type message interface {
	marshal() []byte
	unmarshal(b []byte) error
}

type registerRequest struct{ nonce []byte }

type registerResponse struct {
	clientID uint64
	secret   []byte
	ttlMs    uint64
	window   uint64
}

// sessionRequest is both SessionKeepAliveRequest and SessionCloseRequest: the two have
// the same fields (client_id = 1, secret = 2).
type sessionRequest struct {
	clientID uint64
	secret   []byte
}

// emptyResponse stands for SessionKeepAliveResponse and SessionCloseResponse: their only
// field is the etcd response header, which this package does not use.
type emptyResponse struct{}

// appendUvarint is binary.AppendUvarint, which Go only has from 1.19 on.
func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendTag(b []byte, field, wireType int) []byte {
	return appendUvarint(b, uint64(field)<<3|uint64(wireType))
}

func appendVarintField(b []byte, field int, v uint64) []byte {
	if v == 0 { // proto3 leaves default values out
		return b
	}
	return appendUvarint(appendTag(b, field, wireVarint), v)
}

func appendBytesField(b []byte, field int, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = appendUvarint(appendTag(b, field, wireBytes), uint64(len(v)))
	return append(b, v...)
}

func (m *registerRequest) marshal() []byte { return appendBytesField(nil, 1, m.nonce) }

func (m *sessionRequest) marshal() []byte {
	return appendBytesField(appendVarintField(nil, 1, m.clientID), 2, m.secret)
}

var errTruncated = errors.New("oncekv: truncated protobuf message")

// walkFields calls visit for every field of an encoded message. For a varint field, v
// holds the value; for a length-delimited one, data holds the bytes. Fixed-width fields
// (none in these messages, but a newer server may add some) are skipped.
func walkFields(b []byte, visit func(field int, wireType int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errTruncated
		}
		b = b[n:]
		field, wt := int(tag>>3), int(tag&7)
		var v uint64
		var data []byte
		switch wt {
		case wireVarint:
			v, n = binary.Uvarint(b)
			if n <= 0 {
				return errTruncated
			}
			b = b[n:]
		case wireBytes:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return errTruncated
			}
			data = b[n : n+int(l)]
			b = b[n+int(l):]
		case wireFixed64:
			if len(b) < 8 {
				return errTruncated
			}
			b = b[8:]
			continue
		case wireFixed32:
			if len(b) < 4 {
				return errTruncated
			}
			b = b[4:]
			continue
		default:
			return fmt.Errorf("oncekv: unsupported protobuf wire type %d", wt)
		}
		if err := visit(field, wt, v, data); err != nil {
			return err
		}
	}
	return nil
}

func (m *registerResponse) unmarshal(b []byte) error {
	*m = registerResponse{}
	return walkFields(b, func(field, wt int, v uint64, data []byte) error {
		switch {
		case field == 2 && wt == wireVarint:
			m.clientID = v
		case field == 3 && wt == wireBytes:
			m.secret = append([]byte(nil), data...)
		case field == 4 && wt == wireVarint:
			m.ttlMs = v
		case field == 5 && wt == wireVarint:
			m.window = v
		}
		return nil
	})
}

func (m *registerRequest) unmarshal(b []byte) error {
	*m = registerRequest{}
	return walkFields(b, func(field, wt int, _ uint64, data []byte) error {
		if field == 1 && wt == wireBytes {
			m.nonce = append([]byte(nil), data...)
		}
		return nil
	})
}

func (m *sessionRequest) unmarshal(b []byte) error {
	*m = sessionRequest{}
	return walkFields(b, func(field, wt int, v uint64, data []byte) error {
		switch {
		case field == 1 && wt == wireVarint:
			m.clientID = v
		case field == 2 && wt == wireBytes:
			m.secret = append([]byte(nil), data...)
		}
		return nil
	})
}

func (m *registerResponse) marshal() []byte {
	b := appendVarintField(nil, 2, m.clientID)
	b = appendBytesField(b, 3, m.secret)
	b = appendVarintField(b, 4, m.ttlMs)
	return appendVarintField(b, 5, m.window)
}

func (*emptyResponse) marshal() []byte { return nil }

// A well-formed message is all this checks; the header inside is not needed.
func (*emptyResponse) unmarshal(b []byte) error {
	return walkFields(b, func(int, int, uint64, []byte) error { return nil })
}

// wireCodec is the gRPC codec for the messages above, passed per call with
// grpc.ForceCodec. It calls itself "proto" so the content type stays application/grpc+proto,
// which is what the bytes are.
type wireCodec struct{}

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(message)
	if !ok {
		return nil, fmt.Errorf("oncekv: cannot encode %T", v)
	}
	return m.marshal(), nil
}

func (wireCodec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(message)
	if !ok {
		return fmt.Errorf("oncekv: cannot decode into %T", v)
	}
	return m.unmarshal(data)
}
