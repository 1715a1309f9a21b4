//! The floor of a proxy hop: a bare HTTP/2 relay that forwards each stream to one
//! upstream as it came, with no gRPC decoding, no session and no retries.
//!
//! `scripts/bench-proxy` measures it beside `oncekv grpc-proxy` so that what the proxy
//! adds can be read against what any HTTP/2 hop adds on the same machine. It is a
//! measuring tool, not a product: one upstream connection per downstream connection,
//! no TLS, and it runs until killed.
//!
//! ```text
//! cargo run --release -p oncekv-proxy --example h2_relay -- 127.0.0.1:23792 127.0.0.1:2379
//! ```

use hyper::body::Incoming;
use hyper::client::conn::http2 as client;
use hyper::server::conn::http2 as server;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        return Err("usage: h2_relay LISTEN_ADDR UPSTREAM_ADDR".into());
    };
    // One worker, as `oncekv grpc-proxy` runs by default: the comparison is hop for hop.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(&listen).await?;
        loop {
            let (downstream, _) = listener.accept().await?;
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Err(e) = relay(downstream, &upstream).await {
                    eprintln!("h2_relay: {e}");
                }
            });
        }
    })
}

/// Serves one downstream connection, every stream forwarded on one upstream connection.
async fn relay(downstream: TcpStream, upstream: &str) -> Result<(), Box<dyn std::error::Error>> {
    downstream.set_nodelay(true)?;
    let up = TcpStream::connect(upstream).await?;
    up.set_nodelay(true)?;
    let (sender, connection) = client::handshake(TokioExecutor::new(), TokioIo::new(up)).await?;
    tokio::spawn(connection);
    let forward = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut sender = sender.clone();
        async move {
            // A concrete error type: hyper's bound on the service error does not accept
            // a boxed one from an async block.
            let response: Result<Response<Incoming>, std::io::Error> = sender
                .send_request(request)
                .await
                .map_err(std::io::Error::other);
            response
        }
    });
    server::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(downstream), forward)
        .await?;
    Ok(())
}
