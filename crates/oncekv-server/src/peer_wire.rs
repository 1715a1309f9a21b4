//! Raft messages and forwarded requests between members as length-prefixed frames on
//! plain connections of the peer port, instead of gRPC calls.
//!
//! Why: every raft round trip (an append to each follower, a follower's forward to the
//! leader) sits on a write's critical path, and as a gRPC call it passes through HTTP/2
//! framing, hyper's connection task and a spawned stream task on both sides. Here the
//! caller writes its frame and reads the answer on a connection it holds alone, and the
//! receiving member handles frames in the connection's own task.
//!
//! The protocol, on the same port as the peer gRPC service (told apart by the first
//! bytes, after TLS when the port speaks it):
//!
//! - the caller opens with [`MAGIC`], then its cluster id and member id (u64 LE each);
//! - a request is `len: u32 LE | method: u8 | payload[len]` (postcard, as in gRPC);
//! - a reply is `len: u32 LE | code: u8 | payload[len]`: code 0 carries the postcard
//!   answer, any other code is a gRPC status code and the payload its UTF-8 message.
//!
//! A connection carries one request at a time; a caller with several outstanding (a
//! forwarder with a few batches in flight) holds several connections. A member refuses
//! a caller naming another cluster (the `PeerGate` rule)
//! and frames larger than [`peer_message_limit`](crate::config::peer_message_limit).
//! An outsider that does not know the cluster yet (a joining member) uses gRPC's
//! `Forward`, which the gate keeps to `Identify`.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tls::describe_io_error as describe;
use crate::transport::{Conn, Connector};

/// The first bytes of a framed peer connection. An HTTP/2 connection starts with
/// `PRI * HTTP/2.0`, so the two never agree on the first byte.
pub const MAGIC: &[u8; 8] = b"OKVPEER1";

/// A reply code meaning "the payload is the answer".
pub(crate) const OK: u8 = 0;

/// Idle connections kept per peer for reuse; more are closed after their call.
const MAX_IDLE_PER_PEER: usize = 8;

/// What a frame asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Append = 1,
    Vote = 2,
    Snapshot = 3,
    Forward = 4,
}

impl Method {
    pub(crate) fn from_u8(b: u8) -> Option<Method> {
        match b {
            1 => Some(Method::Append),
            2 => Some(Method::Vote),
            3 => Some(Method::Snapshot),
            4 => Some(Method::Forward),
            _ => None,
        }
    }

    /// The simulation's name for this message.
    #[cfg(feature = "sim")]
    pub fn kind(self) -> crate::transport::MessageKind {
        use crate::transport::MessageKind;
        match self {
            Method::Append => MessageKind::AppendEntries,
            Method::Vote => MessageKind::Vote,
            Method::Snapshot => MessageKind::InstallSnapshot,
            Method::Forward => MessageKind::Forward,
        }
    }

    /// Raft messages may be sent twice (raft is built for a network that duplicates);
    /// a forwarded write of a client without a session may not.
    fn resendable(self) -> bool {
        !matches!(self, Method::Forward)
    }
}

/// Why a framed call failed.
#[derive(Debug)]
pub enum CallError {
    /// No connection could be made.
    Unreachable(String),
    /// No answer within the call's deadline.
    Timeout,
    /// The connection broke or carried something unreadable.
    Broken(String),
    /// The member answered with a gRPC status instead of a result.
    Status(tonic::Status),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(e) => write!(f, "peer unreachable: {e}"),
            CallError::Timeout => f.write_str("peer call timed out"),
            CallError::Broken(e) => write!(f, "peer connection broke: {e}"),
            CallError::Status(s) => write!(f, "peer refused: {}", s.message()),
        }
    }
}

impl std::error::Error for CallError {}

/// A caller's framed connection to one member. A call abandoned at its deadline leaves
/// the connection usable (the member answers requests in order, so the late reply is
/// recognised and skipped): a member that is slow or hung keeps the connections it has
/// instead of being sent a new one per heartbeat.
#[derive(Debug)]
struct PeerConn {
    io: Conn,
    /// Bytes received and not yet taken as a reply. Reading appends here, which is safe
    /// to cancel (a reply half received stays half received).
    read: bytes::BytesMut,
    /// Replies still due: the current call's plus those of abandoned calls.
    owed: u32,
    /// A request write was cut short by a deadline: the member would read the next
    /// request as the rest of that one, so the connection is done for.
    torn: bool,
    /// The connection has been in the pool (a failure on it may be a close by the member
    /// while it sat idle, rather than the member being unreachable).
    reused: bool,
}

/// Framed connections to peers, pooled per peer URL (shared by every clone).
#[derive(Debug, Clone, Default)]
pub struct WirePool {
    idle: Arc<Mutex<HashMap<String, Vec<PeerConn>>>>,
    /// One connection attempt per peer at a time: a member that is hung (stopped, not
    /// dead) leaves attempts pending until they time out, and every heartbeat and
    /// forward opening its own would pile them into its listen queue (the simulation's
    /// network panics at 64) instead of waiting for the one under way.
    dialing: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl WirePool {
    /// Sends `frame` to the member at `url` and returns its answer's
    /// payload, all within `timeout`. `hello` is this member's (cluster id, member id).
    pub async fn call(
        &self,
        dial: &Dialer,
        url: &str,
        hello: (u64, u64),
        frame: &Frame,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let method = frame.method;
        let mut conn = match self.take(url) {
            Some(conn) => conn,
            None => tokio::time::timeout_at(deadline, self.connection(dial, url, hello))
                .await
                .map_err(|_| CallError::Timeout)??,
        };
        loop {
            let exchanged =
                tokio::time::timeout_at(deadline, conn.exchange(&frame.bytes, dial.max_message))
                    .await;
            match exchanged {
                Ok(Ok(reply)) => {
                    self.put_back(url, conn);
                    return reply;
                }
                // A reused connection the member closed between our check and our write
                // (it restarted, or closed the connection as idle): a raft message goes
                // again on a fresh one. A forward does not: it may have been read and
                // executed before the connection broke.
                Ok(Err(e)) if conn.reused && method.resendable() => {
                    tracing::debug!(url, "reused peer connection failed ({e}), redialing");
                    conn = tokio::time::timeout_at(deadline, self.connection(dial, url, hello))
                        .await
                        .map_err(|_| CallError::Timeout)??;
                }
                Ok(Err(e)) => return Err(CallError::Broken(describe(&e))),
                Err(_) => {
                    if !conn.torn {
                        self.put_back(url, conn);
                    }
                    return Err(CallError::Timeout);
                }
            }
        }
    }

    /// An idle connection to `url` the member has not closed.
    fn take(&self, url: &str) -> Option<PeerConn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.get_mut(url)?;
        while let Some(mut conn) = conns.pop() {
            if conn.open() {
                return Some(conn);
            }
        }
        None
    }

    fn put_back(&self, url: &str, mut conn: PeerConn) {
        conn.reused = true;
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.entry(url.to_string()).or_default();
        if conns.len() < MAX_IDLE_PER_PEER {
            conns.push(conn);
        }
    }

    /// An idle connection to `url` if one came back while waiting for the peer's dial
    /// lock, else a new one. The attempt runs in a task of its own that holds the lock
    /// until it ends: a caller whose deadline (a heartbeat's, tens of milliseconds) passes
    /// first does not abandon it, and the next caller waits for it instead of starting
    /// another; a connection nobody waits for any more goes to the pool.
    async fn connection(
        &self,
        dial: &Dialer,
        url: &str,
        hello: (u64, u64),
    ) -> Result<PeerConn, CallError> {
        let lock = {
            let mut dialing = self.dialing.lock().unwrap_or_else(PoisonError::into_inner);
            dialing.entry(url.to_string()).or_default().clone()
        };
        let turn = lock.lock_owned().await;
        if let Some(conn) = self.take(url) {
            return Ok(conn);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (pool, dial, url) = (self.clone(), dial.clone(), url.to_string());
        tokio::spawn(async move {
            let dialed = dial.open(&url, hello).await;
            drop(turn);
            if let Err(Ok(conn)) = tx.send(dialed) {
                pool.put_back(&url, conn);
            }
        });
        rx.await
            .map_err(|_| CallError::Unreachable("the connection attempt was dropped".into()))?
    }
}

impl PeerConn {
    /// Whether the member has not closed this connection. Anything received meanwhile
    /// (the late reply of an abandoned call) is kept for [`Self::reply`].
    fn open(&mut self) -> bool {
        if self.torn {
            return false;
        }
        match self.io.read_buf(&mut self.read).now_or_never() {
            None | Some(Ok(1..)) => true,
            Some(Ok(0)) | Some(Err(_)) => false,
        }
    }

    /// Writes one request and reads its reply. `Err` is a broken connection; `Ok(Err)` a
    /// member's refusal (the connection is still usable).
    async fn exchange(
        &mut self,
        frame: &[u8],
        max_reply: usize,
    ) -> io::Result<Result<Vec<u8>, CallError>> {
        self.torn = true;
        self.io.write_all(frame).await?;
        self.io.flush().await?;
        self.torn = false;
        self.owed += 1;
        self.reply(max_reply).await
    }

    /// The reply to the latest request, skipping those owed to abandoned calls.
    async fn reply(&mut self, max_reply: usize) -> io::Result<Result<Vec<u8>, CallError>> {
        loop {
            while self.read.len() >= 5 {
                let len =
                    u32::from_le_bytes([self.read[0], self.read[1], self.read[2], self.read[3]])
                        as usize;
                if len > max_reply {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a {len} byte reply, over the limit of {max_reply}"),
                    ));
                }
                if self.read.len() < 5 + len {
                    self.read.reserve(5 + len - self.read.len());
                    break;
                }
                let frame = self.read.split_to(5 + len);
                self.owed -= 1;
                if self.owed > 0 {
                    continue;
                }
                let payload = frame[5..].to_vec();
                if frame[4] == OK {
                    return Ok(Ok(payload));
                }
                let message = String::from_utf8_lossy(&payload).into_owned();
                return Ok(Err(CallError::Status(tonic::Status::new(
                    tonic::Code::from(i32::from(frame[4])),
                    message,
                ))));
            }
            if self.io.read_buf(&mut self.read).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// How framed connections are opened: through the node's [`Connector`] (TLS, or a
/// simulation's network) or plain TCP.
#[derive(Debug, Clone)]
pub struct Dialer {
    pub connector: Option<Connector>,
    pub connect_timeout: Duration,
    /// The largest reply read ([`peer_message_limit`](crate::config::peer_message_limit)).
    pub max_message: usize,
}

impl Dialer {
    /// A new framed connection to `url`, its opening (magic and `hello`) written.
    async fn open(&self, url: &str, hello: (u64, u64)) -> Result<PeerConn, CallError> {
        let unreachable = |e: io::Error| CallError::Unreachable(describe(&e));
        let mut io = self.dial(url).await.map_err(unreachable)?;
        let mut opening = Vec::with_capacity(MAGIC.len() + 16);
        opening.extend_from_slice(MAGIC);
        opening.extend_from_slice(&hello.0.to_le_bytes());
        opening.extend_from_slice(&hello.1.to_le_bytes());
        io.write_all(&opening).await.map_err(unreachable)?;
        Ok(PeerConn {
            io,
            read: bytes::BytesMut::with_capacity(8 * 1024),
            owed: 0,
            torn: false,
            reused: false,
        })
    }

    async fn dial(&self, url: &str) -> io::Result<Conn> {
        let uri: tonic::transport::Uri = url
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url:?}: {e}")))?;
        let connect = async {
            if url.starts_with("unix://") {
                return Connector::unix().dial(uri).await;
            }
            if let Some(c) = &self.connector {
                return c.dial(uri).await;
            }
            let host = uri.host().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{url} has no host"))
            })?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(80);
            let tcp = tokio::net::TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            Ok(Conn::new(tcp))
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {url}")))?
    }
}

/// A request as it goes on the wire: `len | method | payload`, in one buffer allocated
/// at its exact size (the payload is postcard-encoded straight into it, so an append of
/// many entries is neither grown step by step nor copied into a frame afterwards).
#[derive(Debug, Clone)]
pub struct Frame {
    method: Method,
    bytes: Vec<u8>,
}

impl Frame {
    /// `value` as a `method` request.
    pub fn encode<T: serde::Serialize + ?Sized>(
        method: Method,
        value: &T,
    ) -> Result<Frame, String> {
        let len = postcard::experimental::serialized_size(value).map_err(|e| e.to_string())?;
        let header = u32::try_from(len).map_err(|_| format!("a {len} byte message"))?;
        let mut head = Vec::with_capacity(5 + len);
        head.extend_from_slice(&header.to_le_bytes());
        head.push(method as u8);
        let bytes = oncekv_core::encoding::encode_into(value, head).map_err(|e| e.to_string())?;
        Ok(Frame { method, bytes })
    }

    /// A request whose payload is already encoded (tests send arbitrary bytes).
    #[cfg(test)]
    fn raw(method: Method, payload: &[u8]) -> Frame {
        let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
        bytes.push(method as u8);
        bytes.extend_from_slice(payload);
        Frame { method, bytes }
    }

    pub fn method(&self) -> Method {
        self.method
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A stand-in member: accepts framed connections, checks the opening, echoes each
    /// request's payload with its method byte appended (the first after `first_delay`),
    /// and closes a connection after `replies_per_conn` replies. Counts the connections
    /// it accepted.
    async fn echo_member(
        replies_per_conn: usize,
        first_delay: Duration,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut opening = [0u8; 24];
                    conn.read_exact(&mut opening).await?;
                    assert_eq!(&opening[..8], MAGIC);
                    assert_eq!(opening[8..16], 7u64.to_le_bytes());
                    for i in 0..replies_per_conn {
                        if i == 0 {
                            tokio::time::sleep(first_delay).await;
                        }
                        let mut head = [0u8; 5];
                        conn.read_exact(&mut head).await?;
                        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
                        let mut payload = vec![0u8; len as usize];
                        conn.read_exact(&mut payload).await?;
                        payload.push(head[4]);
                        let mut reply = (payload.len() as u32).to_le_bytes().to_vec();
                        reply.push(OK);
                        reply.extend_from_slice(&payload);
                        conn.write_all(&reply).await?;
                    }
                    io::Result::Ok(())
                });
            }
        });
        (url, accepted)
    }

    fn dialer() -> Dialer {
        Dialer {
            connector: None,
            connect_timeout: Duration::from_secs(5),
            max_message: 1 << 20,
        }
    }

    #[tokio::test]
    async fn calls_reuse_one_connection() {
        let (url, accepted) = echo_member(usize::MAX, Duration::ZERO).await;
        let pool = WirePool::default();
        for i in 0..5u8 {
            let reply = pool
                .call(
                    &dialer(),
                    &url,
                    (7, 1),
                    &Frame::raw(Method::Append, &[i]),
                    Duration::from_secs(5),
                )
                .await
                .expect("call");
            assert_eq!(reply, vec![i, Method::Append as u8]);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_member_closed_is_not_reused() {
        // The member closes every connection after one reply (as a restarted member's
        // old connections are gone): each call must get a fresh one and succeed, a
        // forward included (which is never sent twice).
        let (url, accepted) = echo_member(1, Duration::ZERO).await;
        let pool = WirePool::default();
        for (i, method) in [Method::Vote, Method::Forward, Method::Append]
            .into_iter()
            .enumerate()
        {
            // Let the close arrive before the next call looks at the idle connection.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let reply = pool
                .call(
                    &dialer(),
                    &url,
                    (7, 1),
                    &Frame::raw(method, b"m"),
                    Duration::from_secs(5),
                )
                .await
                .unwrap_or_else(|e| panic!("call {i}: {e}"));
            assert_eq!(reply, vec![b'm', method as u8]);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_late_reply_is_skipped_and_the_connection_kept() {
        // The member answers its first request after the caller's deadline.
        let (url, accepted) = echo_member(usize::MAX, Duration::from_millis(300)).await;
        let (pool, dialer) = (WirePool::default(), dialer());
        let (first, second) = (
            Frame::raw(Method::Append, b"first"),
            Frame::raw(Method::Append, b"second"),
        );
        let call = |frame, timeout| pool.call(&dialer, &url, (7, 1), frame, timeout);
        let err = call(&first, Duration::from_millis(100))
            .await
            .expect_err("answered after the deadline");
        assert!(matches!(err, CallError::Timeout), "{err}");
        // The next call on the same connection gets its own answer, not the late one.
        let reply = call(&second, Duration::from_secs(5)).await.expect("call");
        assert_eq!(reply, b"second\x01");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_hung_member_is_not_sent_a_connection_per_call() {
        // Connections complete in the kernel's queue, nobody reads them: a stopped
        // process. Thirty calls with a heartbeat's deadline must not open thirty.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let pool = WirePool::default();
        for _ in 0..30 {
            let err = pool
                .call(
                    &dialer(),
                    &url,
                    (7, 1),
                    &Frame::raw(Method::Append, b"hb"),
                    Duration::from_millis(20),
                )
                .await
                .expect_err("nobody answers");
            assert!(matches!(err, CallError::Timeout), "{err}");
        }
        listener.set_nonblocking(true).expect("nonblocking");
        let queued = std::iter::from_fn(|| listener.accept().ok()).count();
        assert_eq!(queued, 1, "connections opened to a hung member");
    }

    #[tokio::test]
    async fn a_member_that_does_not_answer_times_out_and_one_that_is_down_is_unreachable() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (pool, dialer) = (WirePool::default(), dialer());
        let frame = Frame::raw(Method::Vote, b"v");
        let vote = |timeout| pool.call(&dialer, &url, (7, 1), &frame, timeout);
        let err = vote(Duration::from_millis(200))
            .await
            .expect_err("no answer");
        assert!(matches!(err, CallError::Timeout), "{err}");
        drop(listener);
        let err = vote(Duration::from_secs(5))
            .await
            .expect_err("nobody listening");
        assert!(matches!(err, CallError::Unreachable(_)), "{err}");
    }
}
