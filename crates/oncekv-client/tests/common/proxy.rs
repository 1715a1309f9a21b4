//! A TCP proxy in front of one member that can swallow the member's replies: requests
//! still arrive and run, but the client never hears back (a lost reply).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    swallow: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let swallow = Arc::new(AtomicBool::new(false));
        let flag = swallow.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut client_rd, mut client_wr) = client.into_split();
                let (mut server_rd, mut server_wr) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
                });
                let flag = flag.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match server_rd.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if !flag.load(Ordering::SeqCst)
                                    && client_wr.write_all(&buf[..n]).await.is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            swallow,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, the member's replies are read and thrown away.
    pub fn swallow_replies(&self, on: bool) {
        self.swallow.store(on, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
