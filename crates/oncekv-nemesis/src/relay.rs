//! Slow links, in user space: a relay per ordered pair of members that every connection
//! between them passes through (the table's NAT chain sends it there, see
//! [`crate::rules::table`]), holding each chunk for a delay with jitter while a delay is
//! set on the link, and passing it straight on otherwise.
//!
//! Why not `tc netem`: the kernel this runs on has neither the netem nor the prio qdisc
//! (`CONFIG_NET_SCH_NETEM`, `CONFIG_NET_SCH_PRIO` unset, no modules to load), so delay
//! needs another road. Loss stays in the kernel (nft's `numgen`, [`crate::rules::loss`]),
//! where TCP retransmits as it would on a lossy wire. What a relay cannot do is reorder
//! packets: it sees a byte stream, whose order TCP has already restored. Jitter here
//! therefore never reorders bytes (a chunk is never released before the one ahead of it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::rules::{Link, PEER_PORT, RELAY_BASE, member_addr, ordered_pairs};

/// A link's delay: each chunk waits `base` plus or minus up to `jitter`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delay {
    pub base: Duration,
    pub jitter: Duration,
}

type Settings = Arc<Mutex<HashMap<(usize, usize), Delay>>>;

/// The relays of a run. Dropping them closes every relayed connection.
#[derive(Debug)]
pub struct Relays {
    settings: Settings,
    listeners: Vec<JoinHandle<()>>,
}

/// How long a chunk read at `now` waits on a link with `delay`, never released before
/// `previous` (the chunk ahead of it): `jitter_draw` is uniform in `0..=2 * jitter`.
pub fn release_at(now: Instant, delay: Delay, jitter_draw: Duration, previous: Instant) -> Instant {
    let due = (now + delay.base + jitter_draw)
        .checked_sub(delay.jitter)
        .unwrap_or(now)
        .max(now);
    due.max(previous)
}

impl Relays {
    /// Listens for every ordered pair of `n` members.
    pub async fn start(n: usize) -> Result<Relays, String> {
        let settings: Settings = Arc::default();
        let mut listeners = Vec::new();
        for (from, to) in ordered_pairs(n) {
            let addr = format!("{}:{}", member_addr(to), RELAY_BASE + from as u16);
            let listener = TcpListener::bind(&addr)
                .await
                .map_err(|e| format!("relay {addr}: {e}"))?;
            listeners.push(tokio::spawn(serve(listener, from, to, settings.clone())));
        }
        Ok(Relays {
            settings,
            listeners,
        })
    }

    /// Delays both directions of `links` by `delay` from now on.
    pub fn set(&self, links: &[Link], delay: Delay) {
        let mut s = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        for &(a, b) in links {
            s.insert((a, b), delay);
            s.insert((b, a), delay);
        }
    }

    /// No delay anywhere.
    pub fn clear(&self) {
        self.settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        for l in &self.listeners {
            l.abort();
        }
    }
}

async fn serve(listener: TcpListener, from: usize, to: usize, settings: Settings) {
    // Owned here: aborting the listener drops the set, which aborts its connections.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                connections.spawn(relay(inbound, from, to, settings.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn relay(inbound: TcpStream, from: usize, to: usize, settings: Settings) {
    let upstream = format!("{}:{PEER_PORT}", member_addr(to));
    let Ok(Ok(outbound)) =
        tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(&upstream)).await
    else {
        return; // the member is down: the sender sees its connection closed
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_r, in_w) = inbound.into_split();
    let (out_r, out_w) = outbound.into_split();
    let link = (from, to);
    tokio::select! {
        _ = pump(in_r, out_w, link, settings.clone()) => {}
        _ = pump(out_r, in_w, link, settings) => {}
    }
}

/// Copies `r` to `w`, each chunk held for the link's delay at the time it was read.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    link: (usize, usize),
    settings: Settings,
) {
    // Bounded: a slow link pushes back on the sender as a slow wire would.
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if w.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut previous = Instant::now();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let delay = settings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&link)
                .copied()
                .unwrap_or_default();
            let span = delay.jitter.as_millis() as u64 * 2;
            let draw = Duration::from_millis(if span == 0 {
                0
            } else {
                rand::random::<u64>() % (span + 1)
            });
            previous = release_at(Instant::now(), delay, draw, previous);
            if tx.send((previous, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(writer, reader);
}

#[cfg(test)]
mod tests {
    use super::*;

    // Jitter must not reorder a byte stream: a chunk drawn a shorter delay than the one
    // ahead of it waits for that one.
    #[test]
    fn a_chunk_never_overtakes_the_one_ahead() {
        let now = Instant::now();
        let d = Delay {
            base: Duration::from_millis(100),
            jitter: Duration::from_millis(50),
        };
        let first = release_at(now, d, Duration::from_millis(100), now);
        assert_eq!(first, now + Duration::from_millis(150));
        let second = release_at(now, d, Duration::ZERO, first);
        assert_eq!(second, first);
        let later = release_at(now + Duration::from_millis(200), d, Duration::ZERO, first);
        assert_eq!(later, now + Duration::from_millis(250));
    }

    #[test]
    fn no_delay_releases_at_once() {
        let now = Instant::now();
        assert_eq!(release_at(now, Delay::default(), Duration::ZERO, now), now);
    }
}
