//! Diagnostics: the library and the CLI log through `tracing`; this installs the subscriber
//! that prints them on standard error.
//!
//! Default: warnings and errors. `-v` adds info, `-vv` debug (with each event's module),
//! `-vvv` trace; `--quiet` leaves errors only. `GPUMAP_LOG`, an `EnvFilter` directive such as
//! `gpumap=debug` or `gpumap::io=trace,warn`, replaces all of that when set.
//!
//! The CLI's own messages to the person at the terminal — notes, and the error that ends a
//! command — are events of target [`REPORT`], printed as they are: notes at `warn` (gone under
//! `--quiet`), errors at `error` (always), whatever `GPUMAP_LOG` says.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The variable that takes a filter directive.
pub const LOG_VAR: &str = "GPUMAP_LOG";

/// The target of the CLI's messages to the user (see the module docs).
pub const REPORT: &str = "gpumap::report";

/// Installs the subscriber. A `GPUMAP_LOG` that does not parse is an error naming it; the
/// default levels are installed then, so that the error itself is reported.
pub fn install(verbose: u8, quiet: bool) -> gpumap::Result<()> {
    let (filter, result) = match std::env::var(LOG_VAR) {
        Ok(directives) if !directives.trim().is_empty() => {
            match EnvFilter::builder().parse(&directives) {
                Ok(filter) => (filter, Ok(())),
                Err(e) => (
                    EnvFilter::new(default_level(verbose, quiet)),
                    Err(gpumap::Error::InvalidConfig {
                        var: LOG_VAR.to_owned(),
                        value: directives.clone(),
                        reason: format!("not a tracing filter directive (e.g. gpumap=debug): {e}"),
                    }),
                ),
            }
        }
        _ => (EnvFilter::new(default_level(verbose, quiet)), Ok(())),
    };
    let reports = if quiet { "error" } else { "warn" };
    let filter = match format!("{REPORT}={reports}").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        // Field names are styled for a terminal; a file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .event_format(Plain { targets: verbose >= 2 || std::env::var_os(LOG_VAR).is_some() })
        .init();
    result
}

/// Standard error, its failures dropped: a note that cannot be shown (standard error full, or
/// a pipe whose reader left) must not end the command, and tracing-subscriber reports a failed
/// write with `eprintln!`, which panics when standard error fails.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

fn default_level(verbose: u8, quiet: bool) -> &'static str {
    match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    }
}

/// `gpumap: warning: MESSAGE`, with the event's module before the message at `-vv`; a
/// [`REPORT`] event as it is.
struct Plain {
    targets: bool,
}

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        if metadata.target() == REPORT {
            ctx.field_format().format_fields(writer.by_ref(), event)?;
            return writeln!(writer);
        }
        let level = match *metadata.level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(writer, "gpumap: {level}: ")?;
        if self.targets {
            write!(writer, "{}: ", metadata.target())?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_to_levels() {
        assert_eq!(default_level(0, false), "warn");
        assert_eq!(default_level(1, false), "info");
        assert_eq!(default_level(2, false), "debug");
        assert_eq!(default_level(7, false), "trace");
        assert_eq!(default_level(0, true), "error");
    }
}
