//! `gpumap read` of URLs, against the library's test range server on 127.0.0.1
//! (crates/gpumap/tests/remote/server.rs): the bytes `gpumap write` made, served and verified,
//! and the errors a user would hit, as JSON.

mod common;

#[allow(dead_code)]
#[path = "../../gpumap/tests/remote/server.rs"]
mod server;

use std::process::Command;

fn run(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(common::gpumap_bin()).args(args).output().expect("gpumap runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json, format!("{stdout}{stderr}"))
}

#[test]
fn a_url_is_read_over_http_and_verified_against_the_pattern() {
    let dir = common::scratch();
    let file = dir.path().join("pattern.bin");
    let path = file.to_str().unwrap();
    let (code, _, text) = run(&["write", "--size", "3MiB", "--json", path]);
    assert_eq!(code, 0, "{text}");
    let server = server::Server::http();
    server.put("/pattern.bin", std::fs::read(&file).unwrap());
    let url = format!("{}/pattern.bin", server.endpoint());
    let (code, report, text) = run(&[
        "read",
        "--host",
        "--json",
        "--verify-pattern",
        "--offset",
        "4097",
        "--request-size",
        "100KiB",
        "--max-in-flight",
        "8",
        &url,
    ]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(report["op"], "read");
    assert_eq!(report["bytes"], (3 << 20) - 4097);
    assert_eq!(report["url"], url.as_str());
    assert_eq!(report["max_in_flight"], 8);
    assert!(server.gets() >= 30, "{} GETs", server.gets());
    // A byte changed on the server is caught.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[70_000] ^= 1;
    server.put("/pattern.bin", bytes);
    let (code, _, text) = run(&["read", "--host", "--verify-pattern", &url]);
    assert_eq!(code, 3, "{text}");
}

#[test]
fn url_errors_are_typed_in_json() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead = format!("http://127.0.0.1:{port}/x");
    for (args, kind) in [
        (vec!["read", "--host", "--json", "s3://Not_A_Bucket/key"], "remote"),
        (vec!["read", "--host", "--json", "--http-max-attempts", "1", dead.as_str()], "remote"),
        (vec!["read", "--host", "--json", "--cold", dead.as_str()], "invalid_argument"),
    ] {
        let (code, report, text) = run(&args);
        assert_ne!(code, 0, "{text}");
        assert_eq!(report["error"]["kind"], kind, "{args:?}: {text}");
    }
}
