//! oncekv core (being written).
pub mod waiting_list;
