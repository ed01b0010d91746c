//! Progress of long transfers: a bar on standard error (hidden for `--json`, `--quiet`, small
//! transfers and when standard error is no terminal), moved piece by piece.

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

use crate::error::CliResult;
use crate::output;
use crate::units::rate_text;

/// Calls `step(at, n)` for consecutive pieces `[at, at + n)` of `[0, total)`, each at most
/// `piece` bytes, moving the progress bar after each.
pub(crate) fn in_pieces(
    total: usize,
    piece: usize,
    bar: &ProgressBar,
    mut step: impl FnMut(usize, usize) -> CliResult,
) -> CliResult {
    let mut at = 0usize;
    while at < total {
        let n = piece.min(total - at);
        step(at, n)?;
        at += n;
        bar.set_position(at as u64);
    }
    Ok(())
}

/// The bar's template: bytes and rate in decimal units (GB, GB/s), like the results.
const BAR_TEMPLATE: &str =
    "{msg} [{bar:40}] {decimal_bytes}/{decimal_total_bytes} {gbps} eta {eta}";

pub(crate) fn progress_bar(total: u64, json: bool, what: &str) -> ProgressBar {
    if json || output::quiet() || total < (256 << 20) {
        return ProgressBar::hidden();
    }
    // Drawn to stderr, and hidden by indicatif when stderr is not a terminal.
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
        let style = style.with_key("gbps", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&rate_text(state.per_sec()));
        });
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_in_gb_per_second_in_results_and_bars() {
        assert_eq!(rate_text(2.5e9), "2.50 GB/s");
        assert!(BAR_TEMPLATE.contains("{gbps}") && BAR_TEMPLATE.contains("decimal_bytes"));
        assert!(!BAR_TEMPLATE.contains("binary"));
    }
}
