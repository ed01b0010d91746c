//! `gpumap`: file data into and out of GPU memory, from the command line.
#![forbid(unsafe_code)]

mod bench;
mod error;
mod info;
mod logging;
mod map;
mod output;
mod pagecache;
mod pattern;
mod progress;
mod remote_args;
mod remote_read;
mod remote_write;
mod schema;
mod transfer;
mod units;

use std::process::ExitCode;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

use error::{CliError, CliResult};

/// Move file data into and out of GPU memory as fast as the hardware allows.
///
/// With no GPU, host memory stands in for device memory and every command still runs.
/// Exit status: 0 success, 1 failure, 2 a refused command line, 3 data that differ
/// (--verify), 141 standard output closed by its reader.
#[derive(Parser, Debug)]
#[command(name = "gpumap", version, about, long_about)]
struct Cli {
    /// More diagnostics on standard error: -v info, -vv debug, -vvv trace (GPUMAP_LOG, a
    /// tracing filter such as gpumap=debug, replaces these when set).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    /// Nothing on standard error but errors: no notes, progress bars or warnings.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// What this machine offers (CUDA, cuFile, udev, O_DIRECT) and the settings in force.
    Info(info::InfoArgs),
    /// Read a file (or a range of it) into memory, in parallel, and report the rate.
    Read(transfer::ReadArgs),
    /// Write a generated pattern to a file (or a new S3, GCS or Azure object), in parallel, and
    /// report the rate.
    Write(transfer::WriteArgs),
    /// Run the standard workloads (sequential, random, writes) on a file and print a table.
    Bench(bench::BenchArgs),
    /// Map files into GPU memory in one cache under a budget; walk them, or read them at random
    /// from many threads, view by view or in batches; report hits, misses and evictions per file.
    Map(map::MapArgs),
    /// See and control the host page cache: residency, warm, evict, lock, drop.
    Pagecache(pagecache::PagecacheArgs),
}

fn main() -> ExitCode {
    output::detect_closed_standard_output();
    // A write past `ulimit -f` is then an error naming its file and offset, reported (and its
    // scratch file removed) as any other, not a kill by SIGXFSZ; where the disposition cannot
    // be changed, SIGXFSZ stays fatal, as without gpumap.
    let _ = gpumap::io::file_size_limit_as_error();
    let matches = match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        Err(e) => return refused_command_line(e),
    };
    // Every subcommand that prints JSON has a `--json` flag of that id.
    let json = matches
        .subcommand()
        .and_then(|(_, sub)| sub.try_get_one::<bool>("json").ok().flatten().copied())
        .unwrap_or(false);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return refused_command_line(e),
    };
    output::set_quiet(cli.quiet);
    let result = logging::install(cli.verbose, cli.quiet)
        .map_err(CliError::from)
        .and_then(|()| run(&cli.command));
    // A Ctrl-C meanwhile ends the process as Ctrl-C, not by what its cleanup made fail.
    gpumap::io::scratch::wait_if_ending();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, json),
    }
}

fn run(command: &Command) -> CliResult {
    match command {
        Command::Info(args) => info::info(args),
        Command::Read(args) => match remote_args::remote_url(&args.file) {
            Some(url) => remote_read::read(args, url),
            None => transfer::read(args),
        },
        Command::Write(args) => match remote_args::remote_url(&args.file) {
            Some(url) => remote_write::write(args, url),
            None => transfer::write(args),
        },
        Command::Bench(args) => bench::bench(args),
        Command::Map(args) => map::map(args),
        Command::Pagecache(args) => pagecache::run(args),
    }
}

/// Reports `e` (on standard error, and with `--json` as a JSON document on standard output)
/// and gives its exit status.
fn fail(e: &CliError, json: bool) -> ExitCode {
    if !e.is_reported() {
        output::report_error(e);
        if json {
            // Standard output may be the closed pipe; then there is no one to tell.
            let _ = output::json(&schema::ErrorDocument::new(e));
        }
    }
    ExitCode::from(e.exit_code())
}

/// A command line clap refused: its own message and status (help and version included), and
/// with `--json` also a JSON error document of kind `usage`.
fn refused_command_line(e: clap::Error) -> ExitCode {
    let wants_json = std::env::args_os().any(|a| a == "--json");
    if !e.use_stderr() || !wants_json {
        e.exit();
    }
    let _ = e.print();
    let rendered = e.render().to_string();
    // The error and what it lists (the arguments in conflict or missing), without the usage
    // line and the pointer to --help that follow.
    let message = rendered
        .lines()
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let message = message.trim_start_matches("error: ").to_owned();
    let _ = output::json(&schema::ErrorDocument::new(&CliError::Usage(message)));
    ExitCode::from(error::EXIT_USAGE)
}
