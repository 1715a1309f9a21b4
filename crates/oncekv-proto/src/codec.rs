//! The gRPC codec of every oncekv service: prost's, except that a request that does not
//! decode is the caller's mistake (InvalidArgument with a one-line message), not a server
//! fault (tonic's default is Internal with prost's whole field path, which for a deeply
//! nested txn runs to thousands of characters).

use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// How many txns deep a request may nest. prost refuses messages nested deeper than
/// 100 levels, and each txn level is two (a `TxnRequest` inside a `RequestOp`); etcd's
/// Go decoder allows more, but no client nests anywhere near this.
pub const MAX_TXN_DEPTH: usize = 49;

/// [`ProstCodec`] with [`Decoder`].
#[derive(Debug, Clone)]
pub struct Codec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(ProstCodec::default())
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(self.0.decoder())
    }
}

/// Prost's decoder with its errors turned into [`malformed`]'s.
#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| malformed(s.message()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// A one-line InvalidArgument for prost's decode error `message` ("failed to decode
/// Protobuf message: A.b: B.c: ... : description").
pub fn malformed(message: &str) -> Status {
    let description = message.rsplit(": ").next().unwrap_or(message);
    if description.contains("recursion limit") {
        return Status::invalid_argument(format!(
            "oncekv: the request nests txns deeper than {MAX_TXN_DEPTH} levels"
        ));
    }
    Status::invalid_argument(format!("oncekv: malformed request: {description}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A user must get one line saying what is wrong, not prost's field path.
    #[test]
    fn decode_errors_become_one_line_invalid_arguments() {
        let path = "TxnRequest.success: RequestOp.request: ".repeat(60);
        let deep = malformed(&format!(
            "failed to decode Protobuf message: {path}recursion limit reached"
        ));
        assert_eq!(deep.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            deep.message(),
            format!("oncekv: the request nests txns deeper than {MAX_TXN_DEPTH} levels")
        );
        let other =
            malformed("failed to decode Protobuf message: PutRequest.key: invalid wire type");
        assert_eq!(
            other.message(),
            "oncekv: malformed request: invalid wire type"
        );
    }
}
