//! The HPACK decoder against two HPACK crates: the static table, Huffman, whole blocks,
//! and the limits that keep a hostile block cheap.

use super::*;
use crate::authority::hpack::{STATIC_TABLE, encode_block, huffman_decode, put_integer};

#[test]
fn static_table_matches_loona() {
    let mut dec = Decoder::new();
    for (i, &(name, value)) in STATIC_TABLE.iter().enumerate() {
        let got = dec.decode(&[0x80 | (i as u8 + 1)]).expect("static index");
        assert_eq!(
            got,
            vec![(name.to_vec(), value.to_vec())],
            "index {}",
            i + 1
        );
    }
}

#[test]
fn huffman_matches_other_implementations() {
    let all: Vec<u8> = (0..=255).collect();
    // Every byte alone (so every code and its padding), and all of them in a row.
    for s in all
        .iter()
        .map(|&b| vec![b])
        .chain([all.clone(), Vec::new()])
    {
        let mut enc = Vec::new();
        httlib_huffman::encode(&s, &mut enc).expect("httlib encodes");
        assert_eq!(huffman_decode(&enc), Some(s.clone()));
        let loona = loona_hpack::huffman::HuffmanDecoder::new().decode(&enc);
        assert_eq!(loona.ok(), Some(s));
    }
    // Random strings, and random bytes taken as a code: both decoders agree on what
    // is valid and on what it says.
    let mut rng = XorShift(7);
    let mut loona = loona_hpack::huffman::HuffmanDecoder::new();
    let mut valid = 0;
    for round in 0..3000 {
        let len = rng.below(40);
        let s = rng.bytes(len, &all);
        if round % 2 == 0 {
            let mut enc = Vec::new();
            httlib_huffman::encode(&s, &mut enc).expect("httlib encodes");
            assert_eq!(huffman_decode(&enc), Some(s));
        } else {
            let ours = huffman_decode(&s);
            valid += usize::from(ours.is_some());
            assert_eq!(ours, loona.decode(&s).ok(), "input {s:02x?}");
        }
    }
    assert!(valid > 10, "random codes too rarely valid: {valid}");
}

#[test]
fn hpack_decoder_matches_loona() {
    let mut rng = XorShift(11);
    let names: [&[u8]; 6] = [
        b":authority",
        b":path",
        b"content-type",
        b"x-a",
        b"x-b",
        b"te",
    ];
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789-_./:ABC\x00\xff";
    for _ in 0..40 {
        let mut enc = Encoder::default();
        let mut ours = HpackDecoder::new();
        let mut theirs = Decoder::new();
        for _ in 0..8 {
            let mut block = Vec::new();
            if rng.below(4) == 0 {
                let size = [0u32, 64, 256, 4096][rng.below(4)];
                enc.update_max_dynamic_size(size, &mut block)
                    .expect("size update");
            }
            let mut fields = Vec::new();
            for _ in 0..rng.below(12) {
                let name = names[rng.below(names.len() as u64)].to_vec();
                let cap = if rng.below(10) == 0 { 300 } else { 12 };
                let len = rng.below(cap);
                let value = rng.bytes(len, alphabet);
                let flags = [0, 0x1, 0x2, 0x3, 0x4, 0x6, 0x7, 0x8, 0x14, 0x17][rng.below(10)];
                enc.encode((name.clone(), value.clone(), flags), &mut block)
                    .expect("encodes");
                fields.push((name, value));
            }
            if block.is_empty() {
                continue;
            }
            let (_, got) = ours.decode(&block).expect("our decoder");
            assert_eq!(got, fields);
            // loona refuses a block of size updates alone, after applying them.
            match theirs.decode(&block) {
                Ok(theirs) => assert_eq!(theirs, fields),
                Err(e) => assert!(fields.is_empty(), "loona: {e:?}"),
            }
        }
    }
    // Random bytes: never a panic, and where both accept, the same fields.
    let mut agreed = 0;
    for _ in 0..5000 {
        let len = rng.below(24);
        let block = rng.bytes(len, &(0..=255).collect::<Vec<u8>>());
        let ours = HpackDecoder::new().decode(&block);
        if let (Some((_, a)), Ok(b)) = (&ours, Decoder::new().decode(&block)) {
            assert_eq!(a, &b);
            agreed += 1;
        }
    }
    assert!(agreed > 50, "only {agreed} random blocks valid");
}

#[test]
fn hpack_decoder_limits() {
    // A field indexed into the table, then referenced 5000 times: 20 MB decoded from
    // 5 KB, refused past MAX_DECODED_BYTES.
    assert_eq!(HpackDecoder::new().decode(&amplifying_block(5000)), None);
    // A table size update above MAX_TABLE_SIZE, one after a field, an index past the
    // table, an integer too long, a string past the end.
    let mut big = Vec::new();
    put_integer(&mut big, 0x20, 5, MAX_TABLE_SIZE + 1);
    for bad in [
        &big[..],
        &[0x82, 0x20],
        &[0xbe],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        &[0x00, 0x05, b'a'],
    ] {
        assert_eq!(HpackDecoder::new().decode(bad), None, "{bad:02x?}");
    }
    // Size updates at the start are counted, and shrink the table.
    let mut dec = HpackDecoder::new();
    let (n, fields) = dec
        .decode(&[0x40, 1, b'a', 1, b'b', 0xbe])
        .expect("indexed");
    assert_eq!((n, fields.len()), (0, 2));
    assert_eq!(
        dec.decode(&[0x20, 0x3f, 0x01, 0x82]),
        Some((3, vec![h(":method", "GET")]))
    );
    assert_eq!(dec.decode(&[0xbe]), None, "the update emptied the table");
}

#[test]
fn hpack_crates_behave_as_the_module_doc_says() {
    // A table size update after a field: refused here, as by h2; both crates take it.
    let late_update = [0x82, 0x20, 0x82];
    assert_eq!(HpackDecoder::new().decode(&late_update), None);
    assert_eq!(Decoder::new().decode(&late_update).map(|f| f.len()), Ok(2));
    let mut httlib = httlib_hpack::Decoder::default();
    let (mut buf, mut fields) = (late_update.to_vec(), Vec::new());
    assert!(httlib.decode(&mut buf, &mut fields).is_ok());
    assert_eq!(fields.len(), 2);
    // Padding of zero bits: an error by RFC 7541 section 5.2, decoded by httlib-huffman.
    assert_eq!(huffman_decode(&[0x00]), None);
    assert!(
        loona_hpack::huffman::HuffmanDecoder::new()
            .decode(&[0x00])
            .is_err()
    );
    let mut out = Vec::new();
    let speed = httlib_huffman::DecoderSpeed::FiveBits;
    assert!(httlib_huffman::decode(&[0x00], &mut out, speed).is_ok());
    assert_eq!(out, b"0");
    // loona's encoder indexes a new literal (01xxxxxx); ours writes it without (0000).
    let theirs = loona_hpack::Encoder::new().encode([(&b"x-a"[..], &b"1"[..])]);
    assert_eq!(theirs[0] & 0xc0, 0x40);
    assert_eq!(encode_block(&[], &[h("x-a", "1")])[0], 0x00);
    // httlib's encoder without flags writes literals as encode_block does.
    let headers = request("127.0.0.1:2379", "/a");
    let theirs = encode(&mut Encoder::default(), &headers, 0);
    assert_eq!(encode_block(&[], &headers), theirs);
}
