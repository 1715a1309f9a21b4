//! What oncekv calls things where etcd's clients read them: the version it reports and
//! the names of alarms. Shared by the API surfaces, the metrics and the health checks.

use oncekv_core::AlarmKind;

/// The etcd version oncekv reports: the API level it is compatible with.
pub const ETCD_API_VERSION: &str = "3.4.0";

/// etcd's name of an alarm type.
pub fn alarm_name(alarm: AlarmKind) -> &'static str {
    match alarm {
        AlarmKind::NoSpace => "NOSPACE",
        AlarmKind::Corrupt => "CORRUPT",
    }
}
