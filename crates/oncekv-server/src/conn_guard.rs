//! Bounds on the connections a port accepts: how many are open at once, and how long a
//! new connection may stay silent.
//!
//! - At most `max` connections per port: past it, a new connection is closed as soon as
//!   it is accepted (logged), so a flood of connections costs file descriptors up to the
//!   limit and no more.
//! - A connection that has sent nothing [`FIRST_BYTES_TIMEOUT`] after it was accepted is
//!   closed: a client opens a connection to send a request, and one that never does (a
//!   half-open connection, a port scanner, a slowloris) should not hold a slot. Once bytes
//!   have arrived, silence is fine (a watch may stay quiet for hours); HTTP/2 keep-alive
//!   pings (`--grpc-keepalive-interval`) then find connections whose peer is gone.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// How long a new connection may take to send its first bytes.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// Implements `AsyncWrite` and tonic's `Connected` for a connection wrapper `$wrapper<IO>`
/// by passing both through to its field `$field`: the wrappers of this crate change only
/// what is read (a deadline for the first bytes, bytes put back, a rewritten header).
macro_rules! write_through {
    ($wrapper:ident, $field:ident) => {
        impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<IO>
        where
            $wrapper<IO>: Unpin,
        {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_write(cx, buf)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }
        }

        impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
            for $wrapper<IO>
        {
            type ConnectInfo = IO::ConnectInfo;

            fn connect_info(&self) -> Self::ConnectInfo {
                self.$field.connect_info()
            }
        }
    };
}
pub(crate) use write_through;

/// `incoming`'s connections, each passed through `prepare` in a task of its own (a TLS
/// handshake, a look at the first bytes) so that a slow one holds up no other; the server
/// gets what `prepare` yields in the order they finish (`None`: the connection is dealt
/// with, or dropped). Accepting stops when the server stops reading (the listener, in
/// `incoming`, is dropped with the accepting task and the port freed).
pub fn prepare_each<S, IO, T, F, Fut>(
    incoming: S,
    prepare: F,
) -> Pin<Box<dyn futures::Stream<Item = io::Result<T>> + Send>>
where
    S: futures::Stream<Item = io::Result<IO>> + Send + 'static,
    IO: Send + 'static,
    T: Send + 'static,
    F: Fn(IO) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<T>> + Send + 'static,
{
    use futures::StreamExt;
    let (done, ready) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        loop {
            let conn = tokio::select! {
                conn = incoming.next() => match conn {
                    Some(conn) => conn,
                    None => return,
                },
                () = done.closed() => return,
            };
            let io = match conn {
                Ok(io) => io,
                Err(e) => {
                    if done.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (prepared, done) = (prepare(io), done.clone());
            tokio::spawn(async move {
                if let Some(conn) = prepared.await {
                    let _ = done.send(Ok(conn)).await;
                }
            });
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(ready))
}

/// A connection holding one of its port's slots until it is dropped.
#[derive(Debug)]
pub struct Guarded<IO> {
    io: IO,
    _slot: OwnedSemaphorePermit,
    /// Until the first bytes arrive.
    first_bytes: Option<Pin<Box<Sleep>>>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.first_bytes.is_some() {
            match &polled {
                Poll::Ready(Ok(())) if buf.filled().len() > before => self.first_bytes = None,
                Poll::Pending => {
                    if let Some(deadline) = self.first_bytes.as_mut()
                        && deadline.as_mut().poll(cx).is_ready()
                    {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the connection sent nothing in time",
                        )));
                    }
                }
                _ => {}
            }
        }
        polled
    }
}

write_through!(Guarded, io);

/// `incoming` with at most `max` connections open at once, each closed if silent for
/// [`FIRST_BYTES_TIMEOUT`] after it was accepted.
pub fn guard<S, IO>(
    incoming: S,
    max: usize,
    port: &'static str,
) -> impl futures::Stream<Item = io::Result<Guarded<IO>>> + Send + 'static
where
    S: futures::Stream<Item = io::Result<IO>> + Send + 'static,
    IO: Send + 'static,
{
    use futures::StreamExt;
    let slots = Arc::new(Semaphore::new(max.max(1)));
    incoming.filter_map(move |conn| {
        let slots = slots.clone();
        async move {
            let io = match conn {
                Ok(io) => io,
                Err(e) => return Some(Err(e)),
            };
            match slots.try_acquire_owned() {
                Ok(slot) => Some(Ok(Guarded {
                    io,
                    _slot: slot,
                    first_bytes: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_TIMEOUT))),
                })),
                Err(_) => {
                    tracing::warn!(
                        port,
                        max,
                        "connection limit reached; closing a new connection"
                    );
                    None
                }
            }
        }
    })
}
