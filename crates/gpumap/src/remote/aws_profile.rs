//! The AWS shared config and credentials files (`~/.aws/config`, `~/.aws/credentials`): the
//! settings of one profile, for S3 clients that find no credentials in the environment.
//!
//! object_store reads the environment only; the AWS tools and SDKs also read these files,
//! and users expect a bucket that `aws s3 ls` reaches to be readable here too. Parsing is pure
//! ([`Profile::from_texts`]); only [`Profile::load`] touches the file system.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use crate::error::{Error, Result};

/// What gpumap takes from one profile (each `None` where the files do not say).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Profile {
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<String>,
    pub(crate) session_token: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint_url: Option<String>,
    /// A way of getting credentials that gpumap does not run (`credential_process`,
    /// `role_arn`, SSO), named so that an error can say why there are none.
    pub(crate) unsupported_source: Option<String>,
}

/// Keys that name a credential source other than static keys.
const UNSUPPORTED_SOURCES: [&str; 5] =
    ["credential_process", "role_arn", "sso_session", "sso_start_url", "web_identity_token_file"];

impl Profile {
    /// The profile the environment names (`AWS_PROFILE`, else `default`) from the files it
    /// names (`AWS_CONFIG_FILE`, `AWS_SHARED_CREDENTIALS_FILE`, else under `$HOME/.aws`).
    /// `None` where neither file exists. A profile named by `AWS_PROFILE` that neither file
    /// holds, or a file that exists but cannot be read, is an error naming it.
    pub(crate) fn load(env: impl Fn(&str) -> Option<String>) -> Result<Option<Profile>> {
        let home = env("HOME").map(PathBuf::from);
        let file = |var: &str, name: &str| {
            env(var).map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        let read = |path: Option<PathBuf>| -> Result<Option<String>> {
            let Some(path) = path else { return Ok(None) };
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::InvalidConfig {
                    var: "AWS shared file".into(),
                    value: path.display().to_string(),
                    reason: format!("cannot be read: {e}"),
                }),
            }
        };
        let config = read(file("AWS_CONFIG_FILE", "config"))?;
        let credentials = read(file("AWS_SHARED_CREDENTIALS_FILE", "credentials"))?;
        if config.is_none() && credentials.is_none() {
            return Ok(None);
        }
        let named = env("AWS_PROFILE").filter(|p| !p.is_empty());
        let name = named.clone().unwrap_or_else(|| "default".to_owned());
        let found = Profile::from_texts(&name, config.as_deref(), credentials.as_deref());
        match (found, named) {
            (Some(profile), _) => Ok(Some(profile)),
            (None, Some(named)) => Err(Error::InvalidConfig {
                var: "AWS_PROFILE".into(),
                value: named,
                reason: "no such profile in the AWS config or credentials file".into(),
            }),
            (None, None) => Ok(None),
        }
    }

    /// Profile `name` from the texts of the config file (sections `[default]` and
    /// `[profile NAME]`) and the credentials file (sections `[NAME]`), the credentials file
    /// winning where both set a key; `None` where neither has the profile.
    pub(crate) fn from_texts(
        name: &str,
        config: Option<&str>,
        credentials: Option<&str>,
    ) -> Option<Profile> {
        let config_section =
            if name == "default" { "default".to_owned() } else { format!("profile {name}") };
        let from_config = config.and_then(|text| section(text, &config_section));
        let from_credentials = credentials.and_then(|text| section(text, name));
        if from_config.is_none() && from_credentials.is_none() {
            return None;
        }
        let get = |key: &str| {
            let find = |pairs: &Option<Vec<(String, String)>>| {
                pairs
                    .as_ref()
                    .and_then(|p| p.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone()))
            };
            find(&from_credentials).or_else(|| find(&from_config)).filter(|v| !v.is_empty())
        };
        Some(Profile {
            access_key_id: get("aws_access_key_id"),
            secret_access_key: get("aws_secret_access_key"),
            session_token: get("aws_session_token"),
            region: get("region"),
            endpoint_url: get("endpoint_url"),
            unsupported_source: UNSUPPORTED_SOURCES
                .iter()
                .find(|k| get(k).is_some())
                .map(|k| (*k).to_owned()),
        })
    }
}

/// The `key = value` pairs of section `[wanted]` of an INI text, in order, every section of
/// that name together. Keys are lower-cased; lines indented under a key with no value (a
/// nested block, such as `s3 =` then `  addressing_style = path`) belong to that block and are
/// skipped; `#` and `;` start comment lines.
fn section(text: &str, wanted: &str) -> Option<Vec<(String, String)>> {
    let mut found: Option<Vec<(String, String)>> = None;
    let mut inside = false;
    let mut nested = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(header) = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            inside = header.split_whitespace().collect::<Vec<_>>().join(" ") == wanted;
            nested = false;
            if inside {
                found.get_or_insert_with(Vec::new);
            }
            continue;
        }
        if !inside {
            continue;
        }
        let indented = line.starts_with([' ', '\t']);
        if indented && nested {
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else { continue };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim().to_owned());
        nested = value.is_empty();
        if !indented && !nested {
            if let Some(pairs) = found.as_mut() {
                pairs.push((key, value));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
[default]
region = eu-west-1

[profile  work]
region=us-east-2
endpoint_url = http://127.0.0.1:9000
s3 =
    addressing_style = path
    region = never-this
output = json

; a comment
[profile sso]
sso_session = corp
";

    const CREDENTIALS: &str = "\
# keys
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = default-secret

[work]
aws_access_key_id = AKIAWORK
aws_secret_access_key = work-secret
aws_session_token = token
region = ap-south-1
";

    #[test]
    fn profiles_are_read_from_both_files_with_credentials_winning() {
        let cases: [(&str, Option<Profile>); 4] = [
            (
                "default",
                Some(Profile {
                    access_key_id: Some("AKIADEFAULT".into()),
                    secret_access_key: Some("default-secret".into()),
                    region: Some("eu-west-1".into()),
                    ..Profile::default()
                }),
            ),
            (
                "work",
                Some(Profile {
                    access_key_id: Some("AKIAWORK".into()),
                    secret_access_key: Some("work-secret".into()),
                    session_token: Some("token".into()),
                    region: Some("ap-south-1".into()),
                    endpoint_url: Some("http://127.0.0.1:9000".into()),
                    unsupported_source: None,
                }),
            ),
            (
                "sso",
                Some(Profile {
                    unsupported_source: Some("sso_session".into()),
                    ..Profile::default()
                }),
            ),
            ("absent", None),
        ];
        for (name, want) in cases {
            assert_eq!(Profile::from_texts(name, Some(CONFIG), Some(CREDENTIALS)), want, "{name}");
        }
    }

    #[test]
    fn nested_blocks_and_other_sections_do_not_leak() {
        let work = Profile::from_texts("work", Some(CONFIG), None).unwrap();
        assert_eq!(work.region.as_deref(), Some("us-east-2"), "the s3 block's region is nested");
        // `[work]` in the config file is not `[profile work]`.
        let odd = "[work]\nregion = wrong\n";
        assert_eq!(Profile::from_texts("work", Some(odd), None), None);
        // One file alone is enough; empty values are no values.
        let only = Profile::from_texts("default", None, Some("[default]\nregion =\n")).unwrap();
        assert_eq!(only, Profile::default());
    }

    #[test]
    fn load_follows_the_environment_and_names_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("gpumap-aws-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(".aws")).unwrap();
        std::fs::write(dir.join(".aws/config"), CONFIG).unwrap();
        let elsewhere = dir.join("creds");
        std::fs::write(&elsewhere, CREDENTIALS).unwrap();
        let home = dir.display().to_string();
        let creds = elsewhere.display().to_string();
        let env = |vars: Vec<(&'static str, String)>| {
            move |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
        };
        let got = Profile::load(env(vec![
            ("HOME", home.clone()),
            ("AWS_SHARED_CREDENTIALS_FILE", creds.clone()),
            ("AWS_PROFILE", "work".into()),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(got.access_key_id.as_deref(), Some("AKIAWORK"));
        assert_eq!(got.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        let missing =
            Profile::load(env(vec![("HOME", home.clone()), ("AWS_PROFILE", "nope".into())]));
        match missing {
            Err(Error::InvalidConfig { var, value, .. }) => {
                assert_eq!((var.as_str(), value.as_str()), ("AWS_PROFILE", "nope"))
            }
            other => panic!("{other:?}"),
        }
        // No files at all: nothing, and no error.
        let none = env(vec![("HOME", dir.join("nowhere").display().to_string())]);
        assert_eq!(Profile::load(none).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
