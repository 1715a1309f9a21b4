//! Generated protobuf code (being written).
