//! oncekv's nemesis runner: real `oncekv serve` members (or Debian's etcd 3.4, the
//! control) as child processes in a private network namespace, real faults between and
//! on them, a recorded workload, and `oncekv-check`'s checkers on the history. Not part
//! of the shipped `oncekv` binary; `scripts/nemesis` builds and runs it (see the
//! crate README).
//!
//! # Layers
//!
//! Top to bottom; each uses only the layers below it.
//!
//! 1. **Runs** ([`plan`]: which runs a command line asks for; [`run`]: one run from a
//!    fresh cluster to its verdicts; [`report`]: the table).
//! 2. **What happens during a run**: the faults ([`nemesis`]: which fault, on whom,
//!    when) and the clients ([`workload`]: writers, readers, lease users, the prober;
//!    [`watchers`]; [`lockers`]), then [`finale`] (service's return after a heal, the
//!    final reads, history from revision 1) and [`judge`] (the checkers, the files).
//! 3. **Mechanisms**: [`cluster`] (member processes: start, kill -9, restart,
//!    SIGSTOP/SIGCONT, the leader), [`firewall`] (the nft table), [`relay`] (slow
//!    links), [`clock`] (libfaketime offsets).
//! 4. **Foundations**: [`rules`] (the nft text, pure), [`recorder`] (the run's clock and
//!    calls), [`etcd`] (the plain client and how its errors are read).
//!
//! Every fault is healed at the end of its period and at the end of the run; every
//! process, the nft table, the relays and the temporary directories are owned by
//! values whose `Drop` removes them, so an error or ctrl-c tears everything down too.

pub mod clock;
pub mod cluster;
pub mod etcd;
pub mod finale;
pub mod firewall;
pub mod judge;
pub mod lockers;
pub mod nemesis;
pub mod plan;
pub mod recorder;
pub mod relay;
pub mod report;
pub mod rules;
pub mod run;
pub mod watchers;
pub mod workload;
