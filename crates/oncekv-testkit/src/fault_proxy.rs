//! A fault-injecting TCP proxy for putting lost replies, latency, connection resets and
//! partitions between gRPC clients and a member, in tests and in `oncekv demo`.
//!
//! [`FaultProxy::start`] listens on one address and relays every accepted connection to the
//! upstream address over a connection of its own. With no fault switched on, bytes pass
//! through unchanged and in order, and a half-close on one side is passed on to the other.
//! Faults are switched at run time through the handle; each one is a single sentence of
//! behaviour:
//!
//! - **Lost replies** ([`FaultProxy::set_drop_replies`]): once the proxy has written a
//!   client's request to the server, the first chunk of the server's reply to come back
//!   rolls the dice; with probability `p` that chunk is discarded and both sockets are
//!   closed with a TCP reset. The server has executed the request; the client sees a
//!   broken connection (`Unavailable`) and cannot tell whether it ran — the lost-reply
//!   case that exactly-once execution is about. One roll per request→reply turn, so a
//!   reply split across chunks is dropped with probability `p`, not more.
//!
//!   Requests and replies are told apart from the bytes. If the connection opens with the
//!   HTTP/2 client preface, a request is a HEADERS or DATA frame from the client and a
//!   reply is a chunk in which a HEADERS or DATA frame from the server starts. Connection
//!   setup and control frames (preface, SETTINGS and their acknowledgements, PING,
//!   WINDOW_UPDATE) always pass, so a retrying client always gets as far as sending its
//!   request; and a gRPC server sends a unary call's reply HEADERS only once its handler
//!   has returned, so the dropped reply is for work done. For any other protocol, any
//!   client byte is a request and any server byte a reply.
//!
//!   [`FaultProxy::set_drop_every`] drops every `n`th reply the same way instead of at
//!   random (`n = 2`: every other one), counted over all connections.
//!
//! - **Swallowed replies** ([`FaultProxy::set_swallow_every`]): every `n`th reply (counted
//!   over all connections, with the same request→reply turns as lost replies) is
//!   discarded, and so is everything the server sends on that connection afterwards,
//!   while the connection stays open and the client's bytes still reach the server. The
//!   server ran the request; the client sees a connection gone silent, as when a reply is
//!   lost on a path that neither resets nor closes. Only a timeout (or an unanswered
//!   HTTP/2 ping) tells the client.
//!
//! - **Delay** ([`FaultProxy::set_delay`]): each chunk is forwarded no earlier than the time
//!   it was read plus the direction's delay, plus a uniform jitter in `0..=jitter` for a
//!   direction whose delay is non-zero. Chunks are pipelined (a delay is latency, not a
//!   bandwidth limit) and never reordered.
//!
//! - **Reset** ([`FaultProxy::reset_all`]): every connection open at the call is closed on
//!   both sides with a TCP reset (`SO_LINGER` 0). Connections accepted later are unaffected.
//!
//! - **Blackhole** ([`FaultProxy::set_blackhole`]): connections are still accepted and kept
//!   open, but nothing is forwarded in either direction and new connections do not reach
//!   the upstream; data already read is held. When the blackhole is lifted, held data flows
//!   on and new connections are relayed again, as after a healed partition under TCP.
//!
//! [`FaultProxy::heal`] switches every fault off. [`FaultProxy::stats`] reports counters.
//!
//! Random choices (drop rolls, jitter) come from a [`StdRng`] per connection and direction,
//! seeded from the proxy's seed and the connection's accept index: connections accepted in
//! the same order carrying the same traffic make the same choices. [`FaultProxy::start`]
//! draws a seed and logs it; [`FaultProxy::start_with_seed`] replays one.
//!
//! The proxy stops, closing its listener and every connection, when the handle is dropped
//! or on [`FaultProxy::shutdown`]; every task it spawned ends with it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Largest chunk read from a socket at once.
const CHUNK: usize = 16 * 1024;
/// Chunks read but not yet forwarded (held by a delay or a blackhole) per direction.
const CHUNKS_IN_FLIGHT: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The fixed start of every HTTP/2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_FRAME_HEADER: usize = 9;
const H2_DATA: u8 = 0x0;
const H2_HEADERS: u8 = 0x1;

/// Added latency per direction; see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delay {
    /// Client→server.
    pub to_server: Duration,
    /// Server→client.
    pub to_client: Duration,
    /// Up to this much more, drawn per chunk, in each direction with a non-zero delay.
    pub jitter: Duration,
    /// `Some((n, extra))`: one server→client chunk in `n` (drawn at random) is held
    /// `extra` longer, and the chunks behind it wait with it: a member that stalls now
    /// and then (a disk hiccup, a pause), the tail that hedged requests cut.
    pub stalls: Option<(u32, Duration)>,
}

impl Delay {
    /// The same delay in both directions, no jitter.
    pub fn both(delay: Duration) -> Delay {
        Delay {
            to_server: delay,
            to_client: delay,
            ..Delay::default()
        }
    }

    pub fn with_jitter(self, jitter: Duration) -> Delay {
        Delay { jitter, ..self }
    }

    /// Replies stall: one chunk in `one_in` is held `extra` longer.
    pub fn stalls(one_in: u32, extra: Duration) -> Delay {
        Delay {
            stalls: Some((one_in.max(1), extra)),
            ..Delay::default()
        }
    }

    fn sample(&self, direction: Direction, rng: &mut StdRng) -> Duration {
        let base = match direction {
            Direction::ToServer => self.to_server,
            Direction::ToClient => match self.stalls {
                Some((one_in, extra)) if rng.gen_ratio(1, one_in) => self.to_client + extra,
                _ => self.to_client,
            },
        };
        if base.is_zero() || self.jitter.is_zero() {
            return base;
        }
        let jitter = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        base + Duration::from_nanos(rng.gen_range(0..=jitter))
    }
}

/// The faults currently switched on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Probability in `[0, 1]` that a reply is dropped.
    pub drop_replies: f64,
    /// Drop every this-many-th reply (0: none).
    pub drop_every: u64,
    /// Swallow every this-many-th reply (0: none).
    pub swallow_every: u64,
    pub delay: Delay,
    pub blackhole: bool,
}

/// Counters since the proxy started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections open now.
    pub active: u64,
    pub bytes_to_server: u64,
    pub bytes_to_client: u64,
    /// Connections cut to drop a reply.
    pub replies_dropped: u64,
    /// Connections silenced to swallow a reply.
    pub replies_swallowed: u64,
    /// Connections closed by [`FaultProxy::reset_all`].
    pub resets: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    active: AtomicU64,
    bytes_to_server: AtomicU64,
    bytes_to_client: AtomicU64,
    replies_dropped: AtomicU64,
    replies_swallowed: AtomicU64,
    /// Replies seen while swallowing was on (which of them to swallow).
    swallow_turns: AtomicU64,
    /// Replies seen while dropping every `n`th was on.
    drop_turns: AtomicU64,
    resets: AtomicU64,
}

/// What the handle and every connection task share.
#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    seed: u64,
    faults: watch::Sender<Faults>,
    /// Bumped by [`FaultProxy::reset_all`]; connections watch it.
    reset: watch::Sender<u64>,
    counters: Counters,
}

/// A running proxy. Dropping it stops the proxy.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on `listen` (port 0 picks a free port; see [`FaultProxy::addr`]) and relays
    /// to `upstream`, with a random seed that is logged.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> io::Result<FaultProxy> {
        FaultProxy::start_with_seed(listen, upstream, rand::random()).await
    }

    /// As [`FaultProxy::start`], with the seed of every random choice given.
    pub async fn start_with_seed(
        listen: SocketAddr,
        upstream: SocketAddr,
        seed: u64,
    ) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            seed,
            faults: watch::Sender::new(Faults::default()),
            reset: watch::Sender::new(0),
            counters: Counters::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stopped));
        tracing::info!(%addr, %upstream, seed, "fault proxy listening");
        Ok(FaultProxy {
            addr,
            shared,
            stop,
            task: Some(task),
        })
    }

    /// A proxy on a free loopback port in front of `endpoint` (`http://ip:port` or
    /// `ip:port`, as a member's client URL is written).
    pub async fn in_front_of(endpoint: &str) -> io::Result<FaultProxy> {
        let upstream: SocketAddr = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{endpoint}: {e}")))?;
        FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The seed to pass to [`FaultProxy::start_with_seed`] to replay this run.
    pub fn seed(&self) -> u64 {
        self.shared.seed
    }

    /// Drops each reply with probability `p`, clamped to `[0, 1]` (NaN counts as 0).
    pub fn set_drop_replies(&self, p: f64) {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        self.shared.faults.send_modify(|f| f.drop_replies = p);
    }

    /// Drops every `n`th reply from now on (`n = 2`: every other one), closing its
    /// connection with a reset as [`set_drop_replies`](Self::set_drop_replies) does; 0
    /// switches it off.
    pub fn set_drop_every(&self, n: u64) {
        self.shared.counters.drop_turns.store(0, Ordering::Relaxed);
        self.shared.faults.send_modify(|f| f.drop_every = n);
    }

    /// Swallows every `n`th reply from now on (`n = 2`: every other one); 0 switches it
    /// off. Connections already silenced stay silent.
    pub fn set_swallow_every(&self, n: u64) {
        self.shared
            .counters
            .swallow_turns
            .store(0, Ordering::Relaxed);
        self.shared.faults.send_modify(|f| f.swallow_every = n);
    }

    pub fn set_delay(&self, delay: Delay) {
        self.shared.faults.send_modify(|f| f.delay = delay);
    }

    pub fn set_blackhole(&self, on: bool) {
        self.shared.faults.send_modify(|f| f.blackhole = on);
    }

    /// Switches every fault off; held data flows on. Open connections are kept.
    pub fn heal(&self) {
        self.shared.faults.send_replace(Faults::default());
    }

    /// Closes every open connection with a TCP reset, on both sides.
    pub fn reset_all(&self) {
        self.shared.reset.send_modify(|generation| *generation += 1);
    }

    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ProxyStats {
            connections: get(&c.connections),
            active: get(&c.active),
            bytes_to_server: get(&c.bytes_to_server),
            bytes_to_client: get(&c.bytes_to_client),
            replies_dropped: get(&c.replies_dropped),
            replies_swallowed: get(&c.replies_swallowed),
            resets: get(&c.resets),
        }
    }

    /// Stops the proxy and waits until its listener and every connection are closed.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(%error, "fault proxy task failed");
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            // Aborting drops the connection set, which aborts every connection task.
            task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    let mut index = 0u64;
    loop {
        tokio::select! {
            // An error means the handle is gone: stop as well.
            _ = async { stop.wait_for(|stop| *stop).await.map(|_| ()) } => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    tracing::debug!(%peer, index, "fault proxy accepted a connection");
                    // Subscribed now, so a reset_all after this accept closes it.
                    let reset = shared.reset.subscribe();
                    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve_connection(shared.clone(), client, index, reset));
                    index += 1;
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(%error, "fault proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// Why a connection ended.
#[derive(Debug)]
enum End {
    /// Both directions reached end of stream.
    Finished,
    Failed(io::Error),
    ReplyDropped,
    Reset,
    /// The proxy is going away.
    Stopped,
}

/// Keeps [`Counters::active`] right however the connection task ends, aborts included.
struct Active<'a>(&'a AtomicU64);

impl<'a> Active<'a> {
    fn enter(counter: &'a AtomicU64) -> Active<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Active(counter)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    mut client: TcpStream,
    index: u64,
    mut reset: watch::Receiver<u64>,
) {
    let _active = Active::enter(&shared.counters.active);
    let mut upstream = None;
    let end = tokio::select! {
        end = relay(&shared, index, &mut client, &mut upstream) => end,
        _ = reset.changed() => End::Reset,
    };
    match &end {
        End::Failed(error) => tracing::debug!(index, %error, "fault proxy connection failed"),
        end => tracing::debug!(index, ?end, "fault proxy connection ended"),
    }
    if matches!(end, End::ReplyDropped | End::Reset) {
        for stream in std::iter::once(&client).chain(upstream.as_ref()) {
            if let Err(error) = stream.set_zero_linger() {
                tracing::debug!(%error, "fault proxy could not arm a reset; closing normally");
            }
        }
    }
    if matches!(end, End::Reset) {
        shared.counters.resets.fetch_add(1, Ordering::Relaxed);
    }
    // Dropping the sockets closes them (with a reset if armed above).
}

/// Connects upstream and relays both directions until both end or a fault ends the
/// connection. The upstream socket is left in `upstream` so the caller can reset it.
async fn relay(
    shared: &Shared,
    index: u64,
    client: &mut TcpStream,
    upstream: &mut Option<TcpStream>,
) -> End {
    // Under a blackhole a new connection does not even reach the server.
    let mut faults = shared.faults.subscribe();
    if faults.wait_for(|f| !f.blackhole).await.is_err() {
        return End::Stopped;
    }
    let server =
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(shared.upstream)).await {
            Ok(Ok(server)) => upstream.insert(server),
            Ok(Err(error)) => return End::Failed(error),
            Err(_) => return End::Failed(io::ErrorKind::TimedOut.into()),
        };
    for stream in [&*client, &*server] {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "fault proxy could not set TCP_NODELAY");
        }
    }
    let turn = Turn::default();
    let (from_client, to_client) = client.split();
    let (from_server, to_server) = server.split();
    let rng = |direction: Direction| {
        let stream = (index << 1) | direction as u64;
        StdRng::seed_from_u64(shared.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    };
    let pump = |direction| Pump {
        shared,
        direction,
        turn: &turn,
    };
    let (up, down) = (pump(Direction::ToServer), pump(Direction::ToClient));
    match tokio::try_join!(
        up.run(from_client, to_server, rng(Direction::ToServer)),
        down.run(from_server, to_client, rng(Direction::ToClient)),
    ) {
        Ok(_) => End::Finished,
        Err(end) => end,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer = 0,
    ToClient = 1,
}

/// Where a connection is in its request→reply exchange, shared by both directions.
#[derive(Debug, Default)]
struct Turn {
    /// Set when a request has been written to the server; taken by the next reply chunk.
    awaiting_reply: AtomicBool,
    /// The client opened with the HTTP/2 preface, so replies are told by their frames.
    http2: AtomicBool,
}

/// One direction of one connection: a reader that stamps chunks with their arrival time,
/// and a writer that applies the faults and forwards them.
struct Pump<'a> {
    shared: &'a Shared,
    direction: Direction,
    turn: &'a Turn,
}

impl Pump<'_> {
    async fn run(&self, src: ReadHalf<'_>, dst: WriteHalf<'_>, rng: StdRng) -> Result<(), End> {
        let (chunks, arrived) = mpsc::channel(CHUNKS_IN_FLIGHT);
        tokio::try_join!(read_chunks(src, chunks), self.forward(arrived, dst, rng)).map(|_| ())
    }

    async fn forward(
        &self,
        mut arrived: mpsc::Receiver<(Instant, Bytes)>,
        mut dst: WriteHalf<'_>,
        mut rng: StdRng,
    ) -> Result<(), End> {
        let mut faults = self.shared.faults.subscribe();
        let mut messages = Messages::new(self.direction);
        let counters = &self.shared.counters;
        // Set once a reply was swallowed: the server's bytes go nowhere from then on.
        let mut silenced = false;
        while let Some((read_at, chunk)) = arrived.recv().await {
            if silenced {
                continue;
            }
            let delay = faults.borrow().delay.sample(self.direction, &mut rng);
            tokio::time::sleep_until(read_at + delay).await;
            if faults.wait_for(|f| !f.blackhole).await.is_err() {
                return Err(End::Stopped);
            }
            let starts_message = messages.scan(&chunk);
            let bytes = chunk.len() as u64;
            match self.direction {
                Direction::ToServer => {
                    dst.write_all(&chunk).await.map_err(End::Failed)?;
                    counters.bytes_to_server.fetch_add(bytes, Ordering::Relaxed);
                    // Only now has the request reached the server.
                    if messages.is_http2() {
                        self.turn.http2.store(true, Ordering::SeqCst);
                    }
                    if starts_message {
                        self.turn.awaiting_reply.store(true, Ordering::SeqCst);
                    }
                }
                Direction::ToClient => {
                    let reply = starts_message || !self.turn.http2.load(Ordering::SeqCst);
                    if reply && self.turn.awaiting_reply.swap(false, Ordering::SeqCst) {
                        let (p, drop_every, every) = {
                            let f = faults.borrow();
                            (f.drop_replies, f.drop_every, f.swallow_every)
                        };
                        let nth = |turns: &AtomicU64, n: u64| {
                            n > 0 && (turns.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(n)
                        };
                        if (p > 0.0 && rng.gen_bool(p)) || nth(&counters.drop_turns, drop_every) {
                            counters.replies_dropped.fetch_add(1, Ordering::Relaxed);
                            return Err(End::ReplyDropped);
                        }
                        if nth(&counters.swallow_turns, every) {
                            counters.replies_swallowed.fetch_add(1, Ordering::Relaxed);
                            silenced = true;
                            continue;
                        }
                    }
                    dst.write_all(&chunk).await.map_err(End::Failed)?;
                    counters.bytes_to_client.fetch_add(bytes, Ordering::Relaxed);
                }
            }
        }
        // The source reached end of stream: pass the half-close on. The peer may be gone
        // already, which changes nothing.
        let _ = dst.shutdown().await;
        Ok(())
    }
}

/// Reads chunks until end of stream or until the writer is gone.
async fn read_chunks(
    mut src: ReadHalf<'_>,
    chunks: mpsc::Sender<(Instant, Bytes)>,
) -> Result<(), End> {
    let mut buf = BytesMut::with_capacity(CHUNK);
    loop {
        buf.reserve(CHUNK);
        let n = src.read_buf(&mut buf).await.map_err(End::Failed)?;
        if n == 0 {
            return Ok(());
        }
        if chunks
            .send((Instant::now(), buf.split().freeze()))
            .await
            .is_err()
        {
            return Ok(());
        }
    }
}

/// Finds where messages (requests or replies) start in one direction's byte stream: for
/// HTTP/2, HEADERS and DATA frames; for anything else, any byte. Fed the stream in order, in
/// chunks of any size.
#[derive(Debug)]
struct Messages {
    protocol: Protocol,
    /// The frame header being read, and how much of it has arrived.
    header: [u8; H2_FRAME_HEADER],
    header_len: usize,
    /// Payload bytes of the current frame still to skip.
    skip: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Matching the client preface; this many bytes of it seen so far.
    Sniffing(usize),
    Http2,
    Other,
}

impl Messages {
    /// The client's stream is sniffed for the preface. The server's stream is read as frames
    /// from its first byte; whether that means anything is decided by the client's side.
    fn new(direction: Direction) -> Messages {
        let protocol = match direction {
            Direction::ToServer => Protocol::Sniffing(0),
            Direction::ToClient => Protocol::Http2,
        };
        Messages {
            protocol,
            header: [0; H2_FRAME_HEADER],
            header_len: 0,
            skip: 0,
        }
    }

    fn is_http2(&self) -> bool {
        self.protocol == Protocol::Http2
    }

    /// Consumes the next bytes of the stream; true if a message starts in them.
    fn scan(&mut self, mut data: &[u8]) -> bool {
        let mut starts = false;
        while !data.is_empty() {
            match self.protocol {
                Protocol::Other => return true,
                Protocol::Sniffing(matched) => {
                    let expected = &H2_PREFACE[matched..];
                    let n = expected.len().min(data.len());
                    self.protocol = if data[..n] != expected[..n] {
                        Protocol::Other
                    } else if matched + n == H2_PREFACE.len() {
                        Protocol::Http2
                    } else {
                        Protocol::Sniffing(matched + n)
                    };
                    if self.protocol != Protocol::Other {
                        data = &data[n..];
                    }
                }
                Protocol::Http2 if self.skip > 0 => {
                    let n = self.skip.min(data.len());
                    self.skip -= n;
                    data = &data[n..];
                }
                Protocol::Http2 => {
                    let n = (H2_FRAME_HEADER - self.header_len).min(data.len());
                    self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                    self.header_len += n;
                    data = &data[n..];
                    if self.header_len == H2_FRAME_HEADER {
                        let [l0, l1, l2, kind, ..] = self.header;
                        starts |= matches!(kind, H2_DATA | H2_HEADERS);
                        self.skip = u32::from_be_bytes([0, l0, l1, l2]) as usize;
                        self.header_len = 0;
                    }
                }
            }
        }
        starts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: usize) -> Vec<u8> {
        let len = u32::try_from(payload).unwrap_or(0).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 1];
        f.resize(H2_FRAME_HEADER + payload, 0xAB);
        f
    }

    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const WINDOW_UPDATE: u8 = 0x8;

    // Connection setup and control frames must never count as a request or a reply, or a
    // retrying client could be cut before its request ever reached the server; every
    // request and reply frame must count.
    #[test]
    fn only_request_and_reply_frames_count_as_messages_in_any_chunking() {
        use Direction::{ToClient, ToServer};
        let client_setup = [
            H2_PREFACE.to_vec(),
            frame(SETTINGS, 18),
            frame(WINDOW_UPDATE, 4),
        ];
        let client_setup = client_setup.concat();
        let server_setup = [
            frame(SETTINGS, 12),
            frame(SETTINGS, 0),
            frame(WINDOW_UPDATE, 4),
        ];
        let server_setup = server_setup.concat();
        // A SETTINGS frame whose payload is the bytes of a HEADERS frame header.
        let mut disguised = frame(SETTINGS, H2_FRAME_HEADER);
        disguised[H2_FRAME_HEADER..].copy_from_slice(&frame(H2_HEADERS, 0));
        let ack_and_ping = [frame(SETTINGS, 0), frame(PING, 8)].concat();
        let none = Vec::new();
        // (case, direction, setup bytes that must not count, bytes after them, do they count)
        #[rustfmt::skip]
        let cases = [
            ("client setup alone",   ToServer, &client_setup, vec![],                 false),
            ("client ack and ping",  ToServer, &client_setup, ack_and_ping.clone(),   false),
            ("request headers",      ToServer, &client_setup, frame(H2_HEADERS, 40),  true),
            ("request data",         ToServer, &client_setup, frame(H2_DATA, 100),    true),
            ("payload like headers", ToServer, &client_setup, disguised.clone(),      false),
            ("http/1",               ToServer, &none,         b"GET / HTTP/1".to_vec(), true),
            ("raw bytes",            ToServer, &none,         b"hello".to_vec(),      true),
            ("server ack and ping",  ToClient, &server_setup, ack_and_ping,           false),
            ("reply headers",        ToClient, &server_setup, frame(H2_HEADERS, 30),  true),
            ("reply data",           ToClient, &server_setup, frame(H2_DATA, 30),     true),
            ("server payload like headers", ToClient, &server_setup, disguised,       false),
        ];
        for (name, direction, setup, then, expect) in cases {
            let stream = [setup.clone(), then].concat();
            for split in [1, 5, 9, 24, 1000] {
                let mut messages = Messages::new(direction);
                let (mut at, mut in_setup, mut overall) = (0, false, false);
                for chunk in stream.chunks(split) {
                    let saw = messages.scan(chunk);
                    at += chunk.len();
                    in_setup |= saw && at <= setup.len();
                    overall |= saw;
                }
                assert!(
                    !in_setup,
                    "{name} (chunks of {split}): setup counted as a message"
                );
                assert_eq!(overall, expect, "{name} (chunks of {split})");
            }
        }
    }

    // A stall is the tail a hedged request cuts: it must come at about its rate, at its
    // length, and only on replies.
    #[test]
    fn stalls_hold_about_one_reply_in_n() {
        let delay = Delay::stalls(10, Duration::from_millis(100));
        let mut rng = StdRng::seed_from_u64(1);
        let replies: Vec<Duration> = (0..10_000)
            .map(|_| delay.sample(Direction::ToClient, &mut rng))
            .collect();
        let stalled = replies.iter().filter(|d| !d.is_zero()).count();
        assert!((800..1200).contains(&stalled), "{stalled}");
        assert!(
            replies
                .iter()
                .all(|d| d.is_zero() || *d == Duration::from_millis(100))
        );
        assert_eq!(delay.sample(Direction::ToServer, &mut rng), Duration::ZERO);
    }

    // Reproducibility: the same seed must give the same delays, within the bounds.
    #[test]
    fn delay_jitter_is_bounded_and_reproducible() {
        let (base, jitter) = (Duration::from_millis(10), Duration::from_millis(5));
        let delay = Delay {
            to_server: base,
            to_client: Duration::ZERO,
            jitter,
            stalls: None,
        };
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..50)
                .map(|_| delay.sample(Direction::ToServer, &mut rng))
                .collect::<Vec<_>>()
        };
        let first = draw(3);
        assert_eq!(first, draw(3));
        assert!(
            first.iter().all(|d| *d >= base && *d <= base + jitter),
            "{first:?}"
        );
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(delay.sample(Direction::ToClient, &mut rng), Duration::ZERO);
    }
}
