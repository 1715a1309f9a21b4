//! `--max-concurrent-streams` as etcd's JSON gateway shows it.
//!
//! etcd's gateway is a gRPC client of its own server over one HTTP/2 connection, so at
//! most `--max-concurrent-streams` gateway calls run at once there; a watch or a lease
//! keep-alive holds its place until its response ends, and further calls wait for a
//! place (etcd's `TestV3Curl_MaxStreams_*` pin this). oncekv's gateway runs calls in
//! process, so it keeps the same limit itself: each call takes a slot before it runs and
//! gives it back when its response body is done (or dropped: the client went away).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The gateway's slots: `None` when the limit is etcd's default (no limit).
pub(super) fn slots(max_concurrent_streams: u32) -> Option<Arc<Semaphore>> {
    (max_concurrent_streams < u32::MAX)
        .then(|| Arc::new(Semaphore::new(max_concurrent_streams as usize)))
}

/// Runs the call once a slot is free; the slot stays taken until the response's body
/// ends.
pub(super) async fn limit(
    State(slots): State<Arc<Semaphore>>,
    req: Request,
    next: Next,
) -> Response {
    let Ok(slot) = slots.acquire_owned().await else {
        // Closed only if the gateway is being dropped.
        return http::StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    next.run(req)
        .await
        .map(|body| Body::new(Holding { body, _slot: slot }))
}

/// A response body that holds its call's slot.
struct Holding {
    body: Body,
    _slot: OwnedSemaphorePermit,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_default_means_no_limit() {
        assert!(slots(u32::MAX).is_none());
        let three = slots(3).expect("a limit");
        assert_eq!(three.available_permits(), 3);
    }
}
