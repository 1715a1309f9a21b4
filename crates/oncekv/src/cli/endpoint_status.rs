//! One endpoint's `endpoint status` answer: gathered by the command in [`super::cluster`],
//! printed by [`super::output`] (simple, table) and [`super::json`]. It sits below all
//! three so the two printers need not import each other for it.

use oncekv_client::Status;

/// One endpoint's `endpoint status` answer.
#[derive(Debug, Clone)]
pub(crate) struct EndpointStatus {
    pub endpoint: String,
    pub status: Status,
}
