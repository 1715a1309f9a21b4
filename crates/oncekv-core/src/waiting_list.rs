//! Request waiting list (being written).
