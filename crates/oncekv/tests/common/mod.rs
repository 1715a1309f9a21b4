//! What the tests that run `oncekv serve` processes share.
#![allow(dead_code, clippy::unwrap_used)]

use std::process::Child;

/// Member processes, killed on drop.
pub struct Members(pub Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    oncekv_testkit::free_port().unwrap()
}
