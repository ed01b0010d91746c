//! The standard gpumap workloads, shared by `gpumap bench` and the bench targets. Published
//! because the `gpumap-cli` crate depends on it; library users have no need of it.
//!
//! Each measurement is a [`Record`] in the JSON-lines format of docs/benchmarks.md:
//! `{"impl", "workload", "threads", "bytes", "seconds", "gbps"}` plus `"ops"`/`"iops"` for
//! random reads. Baselines measured in the same run on the same file
//! (`memcpy`, `dd`, `cat`) let figures from one run be compared; figures from different runs are
//! not comparable.
#![forbid(unsafe_code)]

mod cache;
mod device;
mod files;
mod host;
mod options;
mod record;
mod small_calls;
mod target;
mod timing;
mod workloads;

pub use device::run_device;
pub use host::run_host;
pub use options::{parse_bench_args, BenchOptions};
pub use record::{append_jsonl, Record};
pub use small_calls::run_small_calls;
pub use target::target_main;
pub use workloads::random_offsets;
