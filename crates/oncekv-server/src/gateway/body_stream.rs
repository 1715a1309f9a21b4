//! Request bodies that stream (a watch, a lease keep-alive): the JSON objects of a body as
//! each arrives, and each request framed as gRPC frames it, for the service's request
//! stream to decode.

use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;
use tonic::Status;

/// The longest keep-alive object accepted, in bytes: `{"ID": "..."}` takes about 40, so
/// anything near this long is not a keep-alive, and the request holds no more memory.
pub(super) const KEEP_ALIVE_OBJECT_MAX: usize = 4096;

/// A message framed as gRPC frames it on the wire (uncompressed, its length in four bytes
/// big-endian): what the service's request stream decodes.
pub(super) fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(5 + len);
    framed.push(0);
    framed.extend_from_slice(&(len as u32).to_be_bytes());
    message.encode_raw(&mut framed);
    framed.into()
}

/// The JSON objects of a body, each as soon as its last byte has come (objects may be
/// separated by whitespace or nothing, as grpc-gateway's decoder allows). Something other
/// than an object, an object longer than `limit` bytes (whitespace before it included;
/// refused as soon as that much is unfinished), a malformed one, or one the body ends
/// inside is an error, after which the stream ends. Each byte is scanned once however the
/// body is cut into chunks, so a client trickling a large object costs linear work.
pub(super) fn json_objects(
    body: Body,
    limit: usize,
) -> impl Stream<Item = Result<Value, Status>> + Send {
    let invalid =
        |e: &dyn std::fmt::Display| Status::invalid_argument(format!("invalid JSON body: {e}"));
    let state = (
        body.into_data_stream(),
        Vec::<u8>::new(),
        ObjectEnd::default(),
        false,
    );
    futures::stream::unfold(
        state,
        move |(mut chunks, mut buf, mut scan, mut ended)| async move {
            // After an error the stream ends: nothing is left to read or to report.
            let fail = |e: Status, chunks| {
                Some((Err(e), (chunks, Vec::new(), ObjectEnd::default(), true)))
            };
            loop {
                match scan.find(&buf) {
                    Err(e) => return fail(invalid(&e), chunks),
                    Ok(Some(end)) if end > limit => {
                        return fail(
                            invalid(&format!("an object longer than {limit} bytes")),
                            chunks,
                        );
                    }
                    Ok(Some(end)) => {
                        let parsed = serde_json::from_slice::<Value>(&buf[..end]);
                        buf.drain(..end);
                        return match parsed {
                            Ok(v) => Some((Ok(v), (chunks, buf, scan, ended))),
                            Err(e) => fail(invalid(&e), chunks),
                        };
                    }
                    Ok(None) if buf.len() > limit => {
                        return fail(
                            invalid(&format!("an object longer than {limit} bytes")),
                            chunks,
                        );
                    }
                    Ok(None) if ended => {
                        return if scan.inside() {
                            fail(invalid(&"the body ends inside an object"), chunks)
                        } else {
                            None
                        };
                    }
                    Ok(None) => {}
                }
                match chunks.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        return fail(
                            Status::invalid_argument(format!("reading the body: {e}")),
                            chunks,
                        );
                    }
                    None => ended = true,
                }
            }
        },
    )
}

/// Where the JSON object at the start of a buffer ends, found by counting brackets outside
/// strings. It remembers how far it has looked, so bytes appended later are the only ones
/// looked at; `serde_json` then checks the object it delimits. Invariant: `scanned` bytes of
/// the buffer have been looked at, and `depth`, `in_string` and `escaped` describe the
/// position after them.
#[derive(Clone, Copy, Default)]
struct ObjectEnd {
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ObjectEnd {
    /// `Some(end)` once `buf[..end]` holds the whole first object (and the scan starts
    /// afresh for the next one, which begins at `end`); `None` while it is unfinished.
    fn find(&mut self, buf: &[u8]) -> Result<Option<usize>, String> {
        for (i, &b) in buf.iter().enumerate().skip(self.scanned) {
            if self.depth == 0 {
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => {}
                    b'{' => self.depth = 1,
                    _ => {
                        let found = String::from_utf8_lossy(&buf[i..(i + 16).min(buf.len())]);
                        return Err(format!("expected an object, found `{found}`"));
                    }
                }
            } else if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth -= 1;
                        if self.depth == 0 {
                            *self = Self::default();
                            return Ok(Some(i + 1));
                        }
                    }
                    _ => {}
                }
            }
        }
        self.scanned = buf.len();
        Ok(None)
    }

    /// Whether the scan stopped inside an object (not in whitespace between objects).
    fn inside(&self) -> bool {
        self.depth > 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pb::etcdserverpb as pb;
    use serde_json::json;

    fn chunked(chunks: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Body::from_stream(futures::stream::iter(chunks))
    }

    // Objects split across chunks come out whole, each as soon as it is complete; an
    // object the body ends inside, or something else than an object, is an error.
    #[tokio::test]
    async fn json_objects_are_read_across_chunks_as_they_come() {
        let values: Vec<Value> =
            json_objects(chunked(&[r#"{"ID": "#, r#""7"} {"I"#, r#"D": 8}{}"#]), 1024)
                .map(Result::unwrap)
                .collect()
                .await;
        assert_eq!(values, [json!({"ID": "7"}), json!({"ID": 8}), json!({})]);
        let cut: Vec<_> = json_objects(chunked(&[r#"{"ID": 7} {"ID""#]), 1024)
            .collect()
            .await;
        assert!(
            cut[0].is_ok() && cut[1].is_err() && cut.len() == 2,
            "{cut:?}"
        );
        let long: Vec<_> = json_objects(chunked(&[r#"{"ID": "#, "123456789012"]), 8)
            .collect()
            .await;
        assert!(long.len() == 1 && long[0].is_err(), "{long:?}");
        let whole: Vec<_> = json_objects(chunked(&[r#"{"ID": "123456789012"}"#]), 8)
            .collect()
            .await;
        assert!(whole.len() == 1 && whole[0].is_err(), "{whole:?}");
        assert!(
            json_objects(chunked(&[" \n "]), 8)
                .collect::<Vec<_>>()
                .await
                .is_empty()
        );
        for not_object in ["5", "[{}]", r#"{} "x""#, "{}}"] {
            let got: Vec<_> = json_objects(chunked(&[not_object]), 64).collect().await;
            let last = got.last().and_then(|r| r.as_ref().err());
            assert!(
                last.is_some_and(|s| s.message().contains("expected an object")),
                "{not_object}: {got:?}"
            );
        }
        // Brackets balanced but the object malformed: serde_json has the last word.
        let bad: Vec<_> = json_objects(chunked(&[r#"{"a" 1}"#]), 64).collect().await;
        assert!(bad.len() == 1 && bad[0].is_err(), "{bad:?}");
    }

    // Brackets and quotes inside strings do not end an object, wherever the chunks cut.
    #[test]
    fn an_object_ends_at_its_own_closing_bracket() {
        let body = br#" {"k": "}{\"]", "n": [{"x": "\\"}]} {"#;
        let whole = body.len() - 2;
        assert_eq!(&body[whole..], b" {");
        for cut in 0..=body.len() {
            let mut scan = ObjectEnd::default();
            let first = scan.find(&body[..cut]);
            let found = match first {
                Ok(Some(at)) => at,
                Ok(None) => scan.find(body).unwrap().unwrap(),
                Err(e) => panic!("cut at {cut}: {e}"),
            };
            assert_eq!(found, whole, "cut at {cut}");
        }
        let parsed: Value = serde_json::from_slice(&body[..whole]).unwrap();
        assert_eq!(parsed, json!({"k": "}{\"]", "n": [{"x": "\\"}]}));
    }

    // A large object sent a byte at a time is scanned once, not again at every byte:
    // the scanner's position only moves forward.
    #[test]
    fn an_object_trickled_a_byte_at_a_time_is_scanned_once() {
        let object = format!(r#"{{"key": "{}"}}"#, "a".repeat(100_000));
        let mut scan = ObjectEnd::default();
        let mut looked = 0;
        for n in 1..=object.len() {
            let before = scan.scanned;
            let found = scan.find(&object.as_bytes()[..n]).unwrap();
            looked += n - before;
            if found.is_some() {
                assert_eq!(n, object.len());
            }
        }
        assert_eq!(looked, object.len());
    }

    // A keep-alive request framed as gRPC frames it decodes back in the service's stream.
    #[tokio::test]
    async fn keep_alive_requests_are_framed_as_grpc_frames_them() {
        use tonic::codec::Codec as _;
        let framed: Vec<u8> = [7, 8]
            .iter()
            .flat_map(|id| grpc_frame(&pb::LeaseKeepAliveRequest { id: *id }).to_vec())
            .collect();
        let decoder = oncekv_proto::codec::Codec::<
            pb::LeaseKeepAliveResponse,
            pb::LeaseKeepAliveRequest,
        >::default()
        .decoder();
        let stream = tonic::Streaming::new_request(
            decoder,
            http_body_util::Full::new(Bytes::from(framed)),
            None,
            None,
        );
        let ids: Vec<i64> = stream.map(|r| r.unwrap().id).collect().await;
        assert_eq!(ids, [7, 8]);
    }
}
