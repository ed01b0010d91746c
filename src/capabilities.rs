//! What this machine offers (filled in by the CUDA work).
#![forbid(unsafe_code)]
/// Capabilities report.
#[derive(Debug, Clone, Default)]
pub struct Capabilities {}
