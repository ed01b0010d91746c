//! Config (placeholder).
#![forbid(unsafe_code)]
/// Config.
#[derive(Debug, Clone, Default)]
pub struct Config {}
