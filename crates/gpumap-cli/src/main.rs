//! `gpumap`: file data into and out of GPU memory, from the command line.
#![forbid(unsafe_code)]

mod bench;
mod map;
mod output;
mod pagecache;
mod pattern;
mod transfer;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Move file data into and out of GPU memory as fast as the hardware allows.
///
/// With no GPU, host memory stands in for device memory and every command still runs.
#[derive(Parser, Debug)]
#[command(name = "gpumap", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// What this machine offers (CUDA, cuFile, udev, O_DIRECT) and the settings in force.
    Info(transfer::InfoArgs),
    /// Read a file (or a range of it) into memory, in parallel, and report the rate.
    Read(transfer::ReadArgs),
    /// Write a generated pattern to a file, in parallel, and report the rate.
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
    let cli = Cli::parse();
    if let Command::Pagecache(args) = &cli.command {
        return pagecache::run(args);
    }
    let result = match &cli.command {
        Command::Info(args) => transfer::info(args),
        Command::Read(args) => transfer::read(args),
        Command::Write(args) => transfer::write(args),
        Command::Bench(args) => bench::bench(args),
        Command::Map(args) => map::map(args),
        Command::Pagecache(_) => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumap: {e}");
            ExitCode::FAILURE
        }
    }
}
