//! postcard encoding into one buffer allocated at its exact size.
//!
//! `postcard::to_allocvec` grows its vector as it goes: a log entry carrying a batch of
//! commands (kilobytes) is reallocated and copied several times on its way to the disk,
//! and a megabyte message a dozen times. Measuring the encoding first (no copying, only
//! lengths) and then writing into a buffer of that size does each byte once.

use postcard::ser_flavors::Flavor;
use serde::Serialize;

/// Appends to a vector whose capacity the caller reserved (`postcard::to_extend` would
/// append byte by byte through `Extend`, which is slow in unoptimized builds).
struct Append(Vec<u8>);

impl Flavor for Append {
    type Output = Vec<u8>;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// `value` encoded with postcard after what `buf` holds; the caller has reserved its
/// length (`postcard::experimental::serialized_size`), so nothing is reallocated.
pub fn encode_into<T: Serialize + ?Sized>(value: &T, buf: Vec<u8>) -> postcard::Result<Vec<u8>> {
    postcard::serialize_with_flavor(value, Append(buf))
}

/// `value` encoded with postcard, in one allocation of the exact size.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> postcard::Result<Vec<u8>> {
    let len = postcard::experimental::serialized_size(value)?;
    encode_into(value, Vec::with_capacity(len))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_same_bytes_as_postcard_in_a_buffer_of_their_size() {
        let value = (7u64, vec![bytes::Bytes::from(vec![1u8; 5000]); 3], "name");
        let plain = postcard::to_allocvec(&value).unwrap();
        let exact = encode(&value).unwrap();
        assert_eq!(exact, plain);
        assert_eq!(exact.capacity(), plain.len());
        let mut head = Vec::with_capacity(4 + plain.len());
        head.extend_from_slice(&[9, 9, 9, 9]);
        let framed = encode_into(&value, head).unwrap();
        assert_eq!(framed[..4], [9, 9, 9, 9]);
        assert_eq!(framed[4..], plain[..]);
        assert_eq!(framed.capacity(), 4 + plain.len());
    }
}
