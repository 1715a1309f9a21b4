//! oncekv's deterministic simulation harness.
//!
//! Real oncekv nodes (openraft, the segment log, the state machine, the etcd gRPC API)
//! and real `oncekv-client` clients run as turmoil hosts on one thread, in simulated time,
//! over a simulated network and simulated disks ([`disk::MemDisk`]), with every source of
//! randomness seeded from one `u64`. The seed chooses the faults ([`faults`]) and the
//! workload ([`workload`], with [`watchers`] and [`lockers`] beside it) and a membership
//! change ([`membership`]). At the end [`replicas`] compares the members' state, and the
//! history checkers of `oncekv-check` judge what the clients recorded (exactly-once,
//! linearizability, watch order, lock fencing), the same checkers that judge a run
//! against real processes or against etcd. Running a seed again reproduces it bit for bit
//! ([`run::Report::trace_hash`]).
//!
//! ```no_run
//! let report = oncekv_sim::run::run(42, &oncekv_sim::run::Options::default());
//! assert!(report.ok(), "{:#?}", report.violations);
//! ```
//!
//! The workspace builds with `--cfg tokio_unstable` (`.cargo/config.toml`), which lets
//! turmoil seed each host's tokio runtime; without it `tokio::select!` draws from a
//! per-process random state and a seed need not replay (see the crate README).
//! [`TOKIO_SEEDED`] says whether this build has it.

pub mod disk;
pub mod duplicate;
pub mod faults;
pub mod lockers;
pub mod membership;
pub mod net;
pub mod replicas;
pub mod run;
pub mod trace;
pub mod trap;
pub mod watchers;
pub mod workload;

/// Whether this build lets turmoil seed tokio's own RNG (`--cfg tokio_unstable`, which
/// orders `tokio::select!`'s ready branches); without it a seed need not replay.
pub const TOKIO_SEEDED: bool = cfg!(tokio_unstable);
