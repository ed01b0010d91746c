//! The `main` of the bench targets under `benches/`: arguments in, records out.

use gpumap::error::Result;

use crate::options::{parse_bench_args, BenchOptions};
use crate::record::{append_jsonl, Record};

/// The `main` of a bench target (`harness = false`): parses `--jsonl OUT FILE [--quick]`, runs
/// `run` with the standard (or quick) options and appends every record to `OUT`.
pub fn target_main(
    run: impl FnOnce(&BenchOptions, &mut dyn FnMut(&Record)) -> Result<()>,
) -> std::process::ExitCode {
    use std::io::Write;
    use std::process::ExitCode;
    // Diagnostics — the decisions behind the measurements (which path, why), and failures — go
    // through tracing, on stderr; the records go to standard output and to OUT.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .without_time()
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (jsonl, file, quick) = match parse_bench_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let options = if quick { BenchOptions::quick(file) } else { BenchOptions::standard(file) };
    let mut failed = false;
    let mut stdout_open = true;
    let result = run(&options, &mut |record| {
        match serde_json::to_string(record) {
            // A reader that went away (`| head`) ends the echo, not the run: OUT has it all.
            Ok(line) if stdout_open => {
                if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
                    tracing::warn!("standard output: {e}; the records still go to the JSONL file");
                    stdout_open = false;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!("cannot encode a result: {e}"),
        }
        if let Err(e) = append_jsonl(&jsonl, record) {
            tracing::error!("cannot record a result: {}", gpumap::error::Report(&e));
            failed = true;
        }
    });
    match result {
        Ok(()) if !failed => ExitCode::SUCCESS,
        Ok(()) => ExitCode::FAILURE,
        Err(e) => {
            tracing::error!("bench failed: {}", gpumap::error::Report(&e));
            ExitCode::FAILURE
        }
    }
}
