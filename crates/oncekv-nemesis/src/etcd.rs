//! The plain etcd client the untracked workers, readers, watchers, lockers and the
//! harness itself use (the `etcd-client` crate: what an etcd user has), and how its
//! errors are read: a write that got no answer may have been applied.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use oncekv_check::Outcome;
use tonic::Code;

/// A client of the member at `endpoint` alone (Jepsen's: each client talks to its own
/// member, so a partitioned member's clients see the partition). Connects lazily: a
/// member that is down makes calls fail, not this.
pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Client, String> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    Client::connect([endpoint], Some(options))
        .await
        .map_err(|e| format!("connecting to {endpoint}: {e}"))
}

/// Whether `e` is an answer that applied nothing (etcd's refusals); anything else (a
/// timeout, a lost connection, "leader changed", "no leader") leaves the outcome unknown.
pub fn is_refusal(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::OutOfRange
                | Code::Unauthenticated
        ),
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        _ => false,
    }
}

/// The outcome of a write that failed with `e`.
pub fn write_failure(e: &etcd_client::Error) -> Outcome {
    if is_refusal(e) {
        Outcome::Failed(e.to_string())
    } else {
        Outcome::Unknown
    }
}

/// Bytes as text (the workload writes only text).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    // A timeout is never a failure: judging it as one would let the checkers call a
    // write that did apply "lost", or hide one applied twice.
    #[test]
    fn a_timeout_is_unknown_and_a_refusal_is_a_failure() {
        let timeout = etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("t"));
        assert_eq!(write_failure(&timeout), Outcome::Unknown);
        let unavailable = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("x"));
        assert_eq!(write_failure(&unavailable), Outcome::Unknown);
        let exists = etcd_client::Error::GRpcStatus(tonic::Status::failed_precondition(
            "etcdserver: lease already exists",
        ));
        assert!(
            matches!(write_failure(&exists), Outcome::Failed(m) if m.contains("already exists"))
        );
    }
}
