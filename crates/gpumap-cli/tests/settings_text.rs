//! Settings from the environment as hostile text: a value that is not UTF-8 is refused by name,
//! not taken for an unset variable (which would put the default in its place silently).

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

#[test]
fn a_setting_that_is_not_utf8_is_refused_naming_the_variable() {
    for var in ["GPUMAP_TASK_SIZE", "KVIKIO_NTHREADS", "GPUMAP_COMPAT_MODE"] {
        let out = Command::new(common::gpumap_bin())
            .args(["info", "--json"])
            .env(var, OsStr::from_bytes(b"4M\xff"))
            .output()
            .expect("gpumap runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{var}: {text}");
        let doc: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON document");
        assert_eq!(doc["error"]["kind"], "invalid_config", "{text}");
        let message = doc["error"]["message"].as_str().unwrap();
        assert!(message.contains(var) && message.contains("UTF-8"), "{message}");
    }
}
