//! Restoring an image from a reader, a few MB at a time.
//!
//! [`StateMachine::restore`] decodes from the whole image in memory. For a large state the
//! image is as large as the state itself, so a restarting member held both at once, and
//! the allocator kept the freed image's pages for a while after: a restarted member stood
//! at up to twice its settled memory. Here the image is read through a window of a few
//! MB: the key space and the history are decoded one element at a time, each history
//! change linked to what it shares (see [`super::relink`]) and pushed straight into the
//! history's chunks, so the largest transient is the window and the list of current keys.
//!
//! This is the one decoder of a whole image: [`StateMachine::restore`] reads its bytes
//! through it too. Keyless images are refused here, as restore always refused them.

use std::io::Read;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::relink::Linker;
use super::{Image, MAGIC, MAGIC_KEYLESS, MAGIC_V3, MAGIC_V4, SnapshotError};
use crate::history::{Change, History};
use crate::kv::{KvStore, Value};
use crate::state_machine::StateMachine;

/// How much of the image is held at once (a single element larger than this grows it).
const WINDOW: usize = 8 << 20;

impl StateMachine {
    /// [`restore`](Self::restore) from `reader`, which yields the image's bytes and then
    /// ends. Holds a window of the image, never the whole of it.
    pub fn restore_from(reader: impl Read) -> Result<StateMachine, SnapshotError> {
        restore_with_window(reader, WINDOW)
    }
}

pub(super) fn restore_with_window(
    reader: impl Read,
    window: usize,
) -> Result<StateMachine, SnapshotError> {
    let mut w = Window::new(reader, window);
    // Version 3 is the image alone, 4 adds the alarms, 5 the auth store and owners.
    let version = match w.bytes(MAGIC.len()) {
        Ok(m) if m == MAGIC.as_slice() => 5,
        Ok(m) if m == MAGIC_V4.as_slice() => 4,
        Ok(m) if m == MAGIC_V3.as_slice() => 3,
        Ok(m) if m == MAGIC_KEYLESS.as_slice() => {
            return Err(SnapshotError::Invalid(
                "an image without its key space (from a copy): it is read with the copy's etcd key bucket".into(),
            ));
        }
        _ => return Err(SnapshotError::BadMagic),
    };
    let settings = w.take()?;
    let applied_index = w.take()?;
    let cluster_time = w.take()?;
    let revision = w.take()?;
    let keys: usize = w.take()?;
    let mut kvs: Vec<(Bytes, Value)> = Vec::with_capacity(keys.min(1 << 20));
    for _ in 0..keys {
        kvs.push(w.take()?);
    }
    let compacted = w.take()?;
    let changes: usize = w.take()?;
    let mut history = History::from_parts(compacted, Vec::new());
    let mut linker = Linker::new(&kvs);
    for _ in 0..changes {
        let change: Change = w.take()?;
        history.push(linker.link(change));
    }
    drop(linker);
    let image = Image {
        settings,
        applied_index,
        cluster_time,
        revision,
        _kvs: Vec::new(),
        compacted,
        _history: Vec::new(),
        leases: w.take()?,
        sessions: w.take()?,
        nonces: w.take()?,
    };
    let alarms = if version >= 4 { w.take()? } else { Vec::new() };
    let (auth, owners) = if version >= 5 {
        w.take()?
    } else {
        Default::default()
    };
    let kv = KvStore::from_head_and_history(revision, kvs, history);
    StateMachine::assemble(image, kv, alarms, auth, owners)
}

/// A reader seen through a buffer from which postcard decodes one value at a time.
struct Window<R> {
    reader: R,
    buf: Vec<u8>,
    /// Where the next value starts in `buf`.
    at: usize,
    /// The reader has ended: what `buf` holds from `at` on is all there is.
    ended: bool,
    size: usize,
}

impl<R: Read> Window<R> {
    fn new(reader: R, size: usize) -> Window<R> {
        Window {
            reader,
            buf: Vec::new(),
            at: 0,
            ended: false,
            size: size.max(1),
        }
    }

    /// The next value. A value cut off by the window's end is decoded again once the
    /// window has been refilled (grown, if the value alone fills it).
    fn take<T: DeserializeOwned>(&mut self) -> Result<T, SnapshotError> {
        loop {
            match postcard::take_from_bytes::<T>(&self.buf[self.at..]) {
                Ok((value, rest)) => {
                    self.at = self.buf.len() - rest.len();
                    return Ok(value);
                }
                Err(postcard::Error::DeserializeUnexpectedEnd) if !self.ended => self.refill()?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The next `n` bytes.
    fn bytes(&mut self, n: usize) -> Result<Vec<u8>, SnapshotError> {
        while self.buf.len() - self.at < n {
            if self.ended {
                return Err(postcard::Error::DeserializeUnexpectedEnd.into());
            }
            self.refill()?;
        }
        let bytes = self.buf[self.at..self.at + n].to_vec();
        self.at += n;
        Ok(bytes)
    }

    /// Moves what is left to the front and reads until the window is full or the
    /// reader ends; a window already full of one value is doubled first.
    fn refill(&mut self) -> Result<(), SnapshotError> {
        self.buf.drain(..self.at);
        self.at = 0;
        if self.buf.len() >= self.size {
            self.size *= 2;
        }
        let mut filled = self.buf.len();
        self.buf.resize(self.size, 0);
        while filled < self.size {
            match self.reader.read(&mut self.buf[filled..]) {
                Ok(0) => {
                    self.ended = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(SnapshotError::Invalid(format!("reading the image: {e}")));
                }
            }
        }
        self.buf.truncate(filled);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::command::{Command, LogPayload, Op, PutRequest, Settings};
    use crate::session::Secret;

    /// A state with keys, history, a session and a lease.
    fn state() -> StateMachine {
        let mut sm = StateMachine::new(Settings::default());
        let mut index = 0;
        let mut apply = |sm: &mut StateMachine, command: Command| {
            index += 1;
            sm.apply(
                index,
                &LogPayload {
                    cluster_time: 1_000 + index,
                    commands: vec![command],
                },
            );
        };
        apply(
            &mut sm,
            Command::RegisterClient {
                secret: Secret::from_u128(7),
                nonce: 0,
            },
        );
        apply(
            &mut sm,
            Command::Untracked(Op::LeaseGrant { id: 5, ttl: 60 }),
        );
        for i in 0..300u32 {
            apply(
                &mut sm,
                Command::Untracked(Op::Put(PutRequest {
                    key: Bytes::from(format!("key-{:03}", i % 40)),
                    value: Bytes::from(vec![i as u8; (i as usize * 7) % 300]),
                    lease: if i % 3 == 0 { 5 } else { 0 },
                    ..PutRequest::default()
                })),
            );
        }
        sm
    }

    #[test]
    fn a_streamed_restore_is_the_whole_restore_at_any_window() {
        let sm = state();
        let image = sm.snapshot().unwrap();
        let whole = StateMachine::restore(&image).unwrap();
        // Windows smaller than one value (growing), of a few values, and of all of it.
        for window in [1, 7, 64, 1_000, 1 << 20] {
            let streamed = restore_with_window(&image[..], window).unwrap();
            assert_eq!(streamed.snapshot().unwrap(), image, "window {window}");
            assert_eq!(streamed.state_hash(), whole.state_hash());
        }
    }

    #[test]
    fn a_cut_or_damaged_image_is_refused() {
        let image = state().snapshot().unwrap();
        for cut in [2, 10, image.len() / 2, image.len() - 1] {
            assert!(
                restore_with_window(&image[..cut], 64).is_err(),
                "an image cut at {cut} of {} was accepted",
                image.len()
            );
        }
        let mut other = image.clone();
        other[..4].copy_from_slice(b"NOPE");
        assert!(matches!(
            restore_with_window(&other[..], 64),
            Err(SnapshotError::BadMagic)
        ));
    }
}
