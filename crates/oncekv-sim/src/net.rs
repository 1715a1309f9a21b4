//! turmoil's simulated TCP behind oncekv's network seam ([`oncekv_server::transport`]),
//! with the network faults applied the way TCP experiences them.
//!
//! turmoil's own partitions and random loss drop whole segments of a TCP stream. Real TCP
//! never loses bytes in the middle of a stream: it retransmits them. A dropped turmoil
//! segment instead leaves a hole the receiver waits on forever, and the sender never gets
//! that segment's flow-control credit back, so after a few dozen drops its writes block
//! for good. Such a connection is wedged permanently, which no real network can do (after
//! a partition heals, TCP delivers what was retransmitted; after ~15 minutes without
//! acknowledgements the kernel resets the connection). So the harness does not use
//! turmoil's dropping at all; [`Net`] applies faults at the connection wrappers instead:
//!
//! - a **cut** `a → b` (partition, one-way partition, isolation): `b` does not read what
//!   `a` sent until the cut heals; `a`'s writes back up (turmoil's flow control) as a real
//!   send buffer would, and everything arrives after the heal. A connection is not opened
//!   across a cut: the dialer waits (a SYN being retransmitted) until the heal or its
//!   connect timeout.
//! - **loss**: a received chunk is held back for a retransmission timeout (200 ms–1 s)
//!   before it is delivered, stalling the stream behind it, as a lost segment does.
//! - a **black hole** between two hosts (a firewall or NAT that forgot the flows): the
//!   connections open at that moment go silent for good in both directions: reads never
//!   return and writes block (a full send buffer nobody acknowledges), while new
//!   connections work. Only the endpoints' own liveness checks (HTTP/2 keep-alive) can
//!   notice; this is the state turmoil's drops produced by accident (seed 135), kept as a
//!   deliberate fault.
//!
//! turmoil's `hold` (messages delayed until release) is TCP-faithful as it is and is used
//! directly by the driver.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use oncekv_server::transport::{Conn, Connector, Incoming};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::Uri;

/// Port of every node's client (etcd API) server.
pub const CLIENT_PORT: u16 = 2379;
/// Port of every node's peer (raft) server.
pub const PEER_PORT: u16 = 2380;

/// The simulated network's fault state, shared by the driver and every connection of one
/// run (each run has its own).
#[derive(Debug, Clone)]
pub struct Net(Arc<Mutex<NetState>>);

#[derive(Debug)]
struct NetState {
    /// Directed cuts `(from, to)` by host name.
    cut: BTreeSet<(String, String)>,
    /// Per unordered host pair, how many black holes it has seen; a connection opened
    /// under an older count is silent.
    black_holes: BTreeMap<(String, String), u64>,
    loss_per_mille: u32,
    rng: StdRng,
    /// Tasks waiting for a heal (readers behind a cut, dialers).
    waiting: Vec<Waker>,
    /// Chunks delayed as lost segments (for the summary).
    pub losses: u64,
}

fn lock(m: &Mutex<NetState>) -> MutexGuard<'_, NetState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

impl Net {
    pub fn new(seed: u64) -> Net {
        Net(Arc::new(Mutex::new(NetState {
            cut: BTreeSet::new(),
            black_holes: BTreeMap::new(),
            loss_per_mille: 0,
            rng: StdRng::seed_from_u64(seed),
            waiting: Vec::new(),
            losses: 0,
        })))
    }

    /// Stops delivery of bytes from `from` to `to` until [`heal`](Self::heal).
    pub fn cut(&self, from: &str, to: &str) {
        lock(&self.0).cut.insert((from.to_string(), to.to_string()));
    }

    /// Cuts both directions between `a` and `b`.
    pub fn cut_both(&self, a: &str, b: &str) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Silences every connection open between `a` and `b` now, for good.
    pub fn black_hole(&self, a: &str, b: &str) {
        *lock(&self.0).black_holes.entry(pair(a, b)).or_default() += 1;
    }

    pub fn set_loss(&self, per_mille: u32) {
        lock(&self.0).loss_per_mille = per_mille;
    }

    /// Removes every cut and the loss, and wakes whoever waited on them. Black-holed
    /// connections stay silent (their hosts must replace them).
    pub fn heal(&self) {
        let waiting = {
            let mut s = lock(&self.0);
            s.cut.clear();
            s.loss_per_mille = 0;
            std::mem::take(&mut s.waiting)
        };
        for w in waiting {
            w.wake();
        }
    }

    /// Chunks delivered late as lost segments so far.
    pub fn losses(&self) -> u64 {
        lock(&self.0).losses
    }

    fn is_cut(&self, from: &str, to: &str) -> bool {
        let s = lock(&self.0);
        s.cut.contains(&(from.to_string(), to.to_string()))
    }

    fn black_hole_count(&self, a: &str, b: &str) -> u64 {
        lock(&self.0)
            .black_holes
            .get(&pair(a, b))
            .copied()
            .unwrap_or(0)
    }

    /// Waits (registering `cx`) while `from → to` or its reverse is cut.
    fn poll_link_open(&self, cx: &mut Context<'_>, from: &str, to: &str) -> Poll<()> {
        let mut s = lock(&self.0);
        let cut = |a: &str, b: &str| s.cut.contains(&(a.to_string(), b.to_string()));
        if cut(from, to) || cut(to, from) {
            s.waiting.push(cx.waker().clone());
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Whether the next received chunk is "lost" (delivered after a retransmission
    /// timeout), and that timeout.
    fn draw_loss(&self) -> Option<Duration> {
        let mut s = lock(&self.0);
        if s.loss_per_mille == 0 {
            return None;
        }
        let rate = f64::from(s.loss_per_mille) / 1000.0;
        if s.rng.gen_bool(rate) {
            s.losses += 1;
            Some(Duration::from_millis(s.rng.gen_range(200..=1_000)))
        } else {
            None
        }
    }

    /// Binds `port` on the current simulated host (`local`) and yields its accepted
    /// connections.
    pub async fn listen(&self, local: &str, port: u16) -> io::Result<Incoming> {
        let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
        let net = self.clone();
        let local = local.to_string();
        let accepted = futures::stream::unfold(listener, move |listener| {
            let net = net.clone();
            let local = local.clone();
            async move {
                let next = listener.accept().await.map(|(stream, from)| {
                    let remote =
                        turmoil::reverse_lookup(from.ip()).unwrap_or_else(|| from.ip().to_string());
                    Conn::new(FaultyConn::new(net, stream, local, remote))
                });
                Some((next, listener))
            }
        });
        Ok(accepted.boxed())
    }

    /// Dials `http://host:port` URLs from host `local` over the simulated network.
    pub fn connector(&self, local: &str) -> Connector {
        let net = self.clone();
        let local = local.to_string();
        Connector::new(move |uri: Uri| {
            let net = net.clone();
            let local = local.clone();
            async move {
                let host = uri.host().unwrap_or_default().to_string();
                let port = uri.port_u16().unwrap_or(80);
                std::future::poll_fn(|cx| net.poll_link_open(cx, &local, &host)).await;
                let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
                Ok(Conn::new(FaultyConn::new(net, stream, local, host)))
            }
        })
    }
}

/// A turmoil TCP stream with [`Net`]'s faults applied on the receiving side.
struct FaultyConn {
    net: Net,
    inner: turmoil::net::TcpStream,
    local: String,
    remote: String,
    /// The pair's black-hole count when the connection opened.
    opened_under: u64,
    /// A received chunk held back as a lost segment, and when it is "retransmitted".
    late: Option<(Bytes, Pin<Box<tokio::time::Sleep>>)>,
    /// What is left of a delivered chunk that did not fit the caller's buffer.
    rest: Bytes,
}

impl FaultyConn {
    fn new(net: Net, inner: turmoil::net::TcpStream, local: String, remote: String) -> Self {
        let opened_under = net.black_hole_count(&local, &remote);
        FaultyConn {
            net,
            inner,
            local,
            remote,
            opened_under,
            late: None,
            rest: Bytes::new(),
        }
    }

    fn silent(&self) -> bool {
        self.net.black_hole_count(&self.local, &self.remote) > self.opened_under
    }
}

fn give(rest: &mut Bytes, buf: &mut ReadBuf<'_>) {
    let n = rest.len().min(buf.remaining());
    buf.put_slice(&rest.split_to(n));
}

impl AsyncRead for FaultyConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.silent() {
            // Never woken: nothing will ever arrive on this connection.
            return Poll::Pending;
        }
        if !this.rest.is_empty() {
            give(&mut this.rest, buf);
            return Poll::Ready(Ok(()));
        }
        if let Some((_, sleep)) = &mut this.late {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if let Some((chunk, _)) = this.late.take() {
                this.rest = chunk;
                give(&mut this.rest, buf);
            }
            return Poll::Ready(Ok(()));
        }
        if this.net.is_cut(&this.remote, &this.local) {
            let waker = cx.waker().clone();
            let mut s = lock(&this.net.0);
            // Checked again under the lock so a heal in between is not missed.
            if s.cut.contains(&(this.remote.clone(), this.local.clone())) {
                s.waiting.push(waker);
                return Poll::Pending;
            }
        }
        // Read into our own buffer so a chunk can be held back whole.
        let mut space = vec![0u8; buf.remaining().max(1)];
        let mut tmp = ReadBuf::new(&mut space);
        match Pin::new(&mut this.inner).poll_read(cx, &mut tmp) {
            Poll::Ready(Ok(())) => {
                let n = tmp.filled().len();
                if n == 0 {
                    return Poll::Ready(Ok(()));
                }
                let chunk = Bytes::copy_from_slice(tmp.filled());
                match this.net.draw_loss() {
                    Some(rto) => {
                        let mut sleep = Box::pin(tokio::time::sleep(rto));
                        // Registers the waker for the retransmission.
                        let _ = sleep.as_mut().poll(cx);
                        this.late = Some((chunk, sleep));
                        Poll::Pending
                    }
                    None => {
                        this.rest = chunk;
                        give(&mut this.rest, buf);
                        Poll::Ready(Ok(()))
                    }
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for FaultyConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.silent() {
            // Never woken: the send buffer never drains.
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.silent() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.silent() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
