//! S3 credentials, region and endpoint from the shared AWS files when the environment has
//! none, against the S3-compatible responder on 127.0.0.1 (tests/remote/server.rs). A test
//! binary of its own: it sets the process's AWS variables, which the other remote tests set
//! otherwise.
#![cfg(feature = "remote")]

// This binary uses a part of the shared responder only.
#[allow(dead_code)]
#[path = "remote/server.rs"]
mod server;

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::RemoteFile;
use server::{Server, AWS_CREDENTIAL_AND_ENDPOINT_VARS};

const KEY_ID: &str = "GPUMAPPROFILEKEY";

#[test]
fn the_shared_files_profile_signs_and_finds_the_endpoint() {
    let server = Server::s3(KEY_ID);
    server.put("/bucket/weights.bin", (0..200u8).collect());
    let refusing = Server::s3("SOMEOTHERKEYID");
    refusing.put("/bucket/weights.bin", vec![0; 10]);
    let dir = std::env::temp_dir().join(format!("gpumap-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config");
    let credentials = dir.join("credentials");
    let write_config = |endpoint: String| {
        std::fs::write(
            &config,
            format!(
                "[default]\nregion = eu-west-1\n\n[profile test]\nregion = us-east-1\n\
                 endpoint_url = {endpoint}\n\n[profile sso]\nsso_session = corp\n"
            ),
        )
        .unwrap()
    };
    write_config(server.endpoint());
    std::fs::write(
        &credentials,
        format!("[test]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = profile-secret\n"),
    )
    .unwrap();
    // This binary has this one test, so no other thread reads the environment while it
    // changes.
    for var in AWS_CREDENTIAL_AND_ENDPOINT_VARS.iter().chain(&["AWS_REGION", "AWS_DEFAULT_REGION"])
    {
        std::env::remove_var(var);
    }
    std::env::set_var("AWS_CONFIG_FILE", &config);
    std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &credentials);
    std::env::set_var("AWS_PROFILE", "test");

    // The profile's endpoint and key: no option names either.
    let file = RemoteFile::open("s3://bucket/weights.bin").unwrap();
    let mut bytes = vec![0u8; 200];
    file.read(&mut bytes, 0).unwrap();
    assert_eq!(bytes, (0..200u8).collect::<Vec<_>>());

    // The key really is the profile's: a server that wants another refuses it.
    write_config(refusing.endpoint());
    let e = RemoteFile::open("s3://bucket/weights.bin").unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::AccessDenied, .. }), "{e:?}");
    let text = gpumap::error::Report(&e).to_string();
    assert!(!text.contains("profile-secret"), "{text}");

    // The environment wins over the files.
    std::env::set_var("AWS_ENDPOINT_URL", server.endpoint());
    assert_eq!(RemoteFile::open("s3://bucket/weights.bin").unwrap().len(), 200);
    std::env::remove_var("AWS_ENDPOINT_URL");

    // A profile named but absent, and one whose credentials come from SSO: errors naming it.
    std::env::set_var("AWS_PROFILE", "absent");
    let e = RemoteFile::open("s3://bucket/weights.bin").unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig { var, value, .. } if var == "AWS_PROFILE" && value == "absent"),
        "{e:?}"
    );
    std::env::set_var("AWS_PROFILE", "sso");
    let e = RemoteFile::open("s3://bucket/weights.bin").unwrap_err();
    let text = gpumap::error::Report(&e).to_string();
    assert!(text.contains("sso_session") && text.contains("export-credentials"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
