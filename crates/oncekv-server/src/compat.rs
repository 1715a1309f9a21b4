//! What oncekv calls things where etcd's clients read them: the version it reports and
//! the names of alarms. Shared by the API surfaces, the metrics and the health checks.

use oncekv_core::AlarmKind;

/// The etcd version oncekv reports: the release whose API it serves (etcd 3.4.23's, whose
/// own end-to-end tests it runs; a client compares the figure with its own).
pub const ETCD_API_VERSION: &str = "3.4.23";

/// The cluster version oncekv reports: etcd's major.minor of [`ETCD_API_VERSION`].
pub const ETCD_CLUSTER_VERSION: &str = "3.4";

/// etcd's name of an alarm type.
pub fn alarm_name(alarm: AlarmKind) -> &'static str {
    match alarm {
        AlarmKind::NoSpace => "NOSPACE",
        AlarmKind::Corrupt => "CORRUPT",
    }
}
