//! The URLs a [`RemoteFile`](super::RemoteFile) opens: parsed, checked, and shown without
//! credentials.
//!
//! Checking happens here, before any request: a URL that could smuggle a second request line
//! (control characters), carries a password inline, or names a scheme gpumap does not read is
//! refused with [`RemoteErrorKind::InvalidUrl`], naming the URL as [`RemoteUrl::redacted`]
//! shows it.
#![forbid(unsafe_code)]

use std::fmt;

use crate::error::{Error, RemoteErrorKind, Result};

/// The longest URL accepted. S3 keys are at most 1024 bytes and HTTP servers commonly refuse
/// request lines over 8 KiB, so nothing longer is a real object; the bound keeps a hostile
/// argument from being carried into every request and message.
pub const MAX_URL_LEN: usize = 8192;

/// Where a remote object lives, and how it is reached.
#[derive(Clone, PartialEq, Eq)]
pub enum RemoteUrl {
    /// An S3 object, read with requests signed with credentials from the environment (or
    /// given in the options), or unsigned where the options say so.
    S3 {
        /// The bucket.
        bucket: String,
        /// The object's key: the URL's path after the bucket, percent-decoded (`a%20b` names
        /// the key `a b`), as the store names it.
        key: String,
    },
    /// A Google Cloud Storage object (`gs://bucket/key`), read with requests signed with the
    /// credentials object_store finds (`GOOGLE_APPLICATION_CREDENTIALS`, a service account, the
    /// machine's metadata server), or unsigned where the options say so.
    Gcs {
        /// The bucket.
        bucket: String,
        /// The object's name, percent-decoded as an S3 key is.
        key: String,
    },
    /// An Azure Blob Storage blob (`az://container/blob`) of the storage account the
    /// environment names (`AZURE_STORAGE_ACCOUNT_NAME`), read with requests signed with the
    /// credentials object_store finds (an account key, a SAS token, a bearer token, a managed
    /// identity), or unsigned where the options say so.
    Azure {
        /// The container.
        container: String,
        /// The blob's name, percent-decoded as an S3 key is.
        key: String,
    },
    /// A plain `http(s)://` URL read with ranged GETs; a presigned S3 URL is one (its query
    /// string carries the signature and is kept).
    Http(url::Url),
    /// A file of Hadoop's WebHDFS REST API, `http(s)://namenode:port/webhdfs/v1/<path>` (its
    /// query, `user.name` or a delegation token, is kept and goes with every request).
    WebHdfs(url::Url),
}

impl RemoteUrl {
    /// Parses `text` by its scheme: `s3://bucket/key`; `gs://bucket/object`;
    /// `az://container/blob` (or fsspec's `abfs://` and `abfss://` for the same); `http://` /
    /// `https://` URLs (WebHDFS where the path starts with `/webhdfs/v1/`, the API's own
    /// prefix, as KvikIO infers it); `webhdfs://host:port/path` and `swebhdfs://...` (Hadoop's
    /// names for the same over http and https).
    pub fn parse(text: &str) -> Result<RemoteUrl> {
        check_text(text)?;
        if let Some((store, rest)) = BucketStore::of_url(text)? {
            return parse_in_bucket(store, text, rest);
        }
        match text.split_once("://") {
            Some((scheme, _))
                if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
            {
                let url = parse_http(text)?;
                match url {
                    RemoteUrl::Http(u) if u.path().starts_with(WEBHDFS_PREFIX) => {
                        check_webhdfs(RemoteUrl::WebHdfs(u))
                    }
                    other => Ok(other),
                }
            }
            Some((scheme, rest))
                if scheme.eq_ignore_ascii_case("webhdfs")
                    || scheme.eq_ignore_ascii_case("swebhdfs") =>
            {
                let http = if scheme.eq_ignore_ascii_case("webhdfs") { "http" } else { "https" };
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                let mapped = format!("{http}://{authority}{WEBHDFS_PREFIX}{path}");
                match parse_http(&mapped)? {
                    RemoteUrl::Http(u) => check_webhdfs(RemoteUrl::WebHdfs(u)),
                    other => Ok(other),
                }
            }
            Some((scheme, _)) => Err(invalid(
                &redact_text(text),
                format!(
                    "the scheme {:?} is not supported (s3, gs, az, abfs, abfss, http, https, \
                     webhdfs and swebhdfs are)",
                    scheme
                ),
            )),
            None => Err(invalid(&redact_text(text), "the URL has no scheme (s3://, https://)")),
        }
    }

    /// A WebHDFS file: `url` as [`parse`](Self::parse) reads it, which must name one
    /// (`http(s)://host:port/webhdfs/v1/<path>`, or `webhdfs://` / `swebhdfs://`).
    pub fn webhdfs(url: &str) -> Result<RemoteUrl> {
        match RemoteUrl::parse(url)? {
            found @ RemoteUrl::WebHdfs(_) => Ok(found),
            other => Err(invalid(
                &other.redacted(),
                format!("not a WebHDFS URL (http(s)://host:port{WEBHDFS_PREFIX}<path>)"),
            )),
        }
    }

    /// An S3 object named by its bucket and key (the key itself, not percent-encoded: `a b`
    /// and `epoch~1` are keys as they are).
    pub fn s3(bucket: &str, key: &str) -> Result<RemoteUrl> {
        Self::in_bucket(BucketStore::S3, bucket, key)
    }

    /// A GCS object named by its bucket and name (the name itself, not percent-encoded).
    pub fn gcs(bucket: &str, key: &str) -> Result<RemoteUrl> {
        Self::in_bucket(BucketStore::Gcs, bucket, key)
    }

    /// An Azure blob named by its container and name (the name itself, not percent-encoded).
    pub fn azure(container: &str, key: &str) -> Result<RemoteUrl> {
        Self::in_bucket(BucketStore::Azure, container, key)
    }

    /// The object `key` of `bucket` in `store`, checked by the store's rules.
    pub(crate) fn in_bucket(store: BucketStore, bucket: &str, key: &str) -> Result<RemoteUrl> {
        let text = format!("{}://{bucket}/{}", store.scheme(), url_path_of(key));
        check_text(&text)?;
        check_object(store, &text, bucket, key)?;
        Ok(store.url(bucket, key.to_owned()))
    }

    /// The store's path of an S3, GCS or Azure object's key: the key as it is, which the client
    /// percent-encodes once on the wire. Checked keys always make one.
    pub(crate) fn store_path(key: &str) -> Result<object_store::path::Path> {
        object_store::path::Path::parse(key).map_err(|e| {
            invalid(&format!("…/{}", url_path_of(key)), format!("not a key a store can name: {e}"))
        })
    }

    /// The URL as it may be shown: no user or password, and any query string (a presigned
    /// URL's signature and credential) as `?…`.
    pub fn redacted(&self) -> String {
        match self {
            RemoteUrl::S3 { bucket, key } => format!("s3://{bucket}/{}", url_path_of(key)),
            RemoteUrl::Gcs { bucket, key } => format!("gs://{bucket}/{}", url_path_of(key)),
            RemoteUrl::Azure { container, key } => {
                format!("az://{container}/{}", url_path_of(key))
            }
            RemoteUrl::Http(url) | RemoteUrl::WebHdfs(url) => redact_url(url),
        }
    }

    /// Whether the URL carries a query string (for a presigned URL, its signature): words to
    /// scrub from any message a lower layer writes.
    pub(crate) fn secrets(&self) -> Vec<String> {
        match self {
            RemoteUrl::S3 { .. } | RemoteUrl::Gcs { .. } | RemoteUrl::Azure { .. } => Vec::new(),
            RemoteUrl::Http(url) | RemoteUrl::WebHdfs(url) => {
                let mut secrets = vec![url.as_str().to_owned()];
                if let Some(query) = url.query().filter(|q| !q.is_empty()) {
                    secrets.push(query.to_owned());
                }
                secrets
            }
        }
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteUrl({})", self.redacted())
    }
}

/// Whether `text` looks like a URL gpumap reads remotely rather than a local path: the
/// callers that take both (the CLI, Python's `read_file_to_device`) ask this first.
pub fn is_remote_url(text: &str) -> bool {
    // A bucket store's URL, even one its parser will refuse, is a URL, not a path.
    if !matches!(BucketStore::of_url(text), Ok(None)) {
        return true;
    }
    let lower = text.get(..11).unwrap_or(text).to_ascii_lowercase();
    ["http://", "https://", "webhdfs://", "swebhdfs://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// The path every WebHDFS URL starts with.
const WEBHDFS_PREFIX: &str = "/webhdfs/v1/";

/// A WebHDFS URL names a file below the prefix, and leaves `op` to the reader.
fn check_webhdfs(url: RemoteUrl) -> Result<RemoteUrl> {
    let RemoteUrl::WebHdfs(u) = &url else { return Ok(url) };
    if u.path().len() <= WEBHDFS_PREFIX.len() {
        return Err(invalid(&url.redacted(), "the WebHDFS URL names no file"));
    }
    if u.query_pairs().any(|(name, _)| matches!(name.as_ref(), "op" | "offset" | "length")) {
        return Err(invalid(
            &url.redacted(),
            "a WebHDFS URL names the file; the reader adds op, offset and length itself",
        ));
    }
    Ok(url)
}

/// Refusals that do not depend on the scheme: length, and characters that could end a request
/// line or hide in a log.
fn check_text(text: &str) -> Result<()> {
    if text.len() > MAX_URL_LEN {
        // The scheme alone: any more of a URL this long could hold a user's password, a
        // signature or a key, and where its `@` or `?` falls is not looked for in it.
        let scheme = text.get(..16).and_then(|start| start.split_once("://")).map(|(s, _)| s);
        return Err(invalid(
            &format!("{}://…", scheme.unwrap_or("?")),
            format!("the URL is {} bytes long; at most {MAX_URL_LEN} are accepted", text.len()),
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(
            &redact_text(text).escape_debug().to_string(),
            format!("the URL contains the character {:?}; encode it as %XX", c),
        ));
    }
    Ok(())
}

/// An object of `store` named by `text`, whose part after the scheme is `rest`.
fn parse_in_bucket(store: BucketStore, text: &str, rest: &str) -> Result<RemoteUrl> {
    let (bucket, key) = bucket_and_key(text, rest, store.scheme())?;
    check_object(store, text, bucket, &key)?;
    Ok(store.url(bucket, key))
}

/// `bucket/key` after a bucket store's `scheme://`: the bucket as written and the key
/// percent-decoded; refused where it holds a user, a query or a fragment.
fn bucket_and_key<'a>(text: &str, rest: &'a str, scheme: &str) -> Result<(&'a str, String)> {
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.contains(['@', '?', '#']) || key.contains(['?', '#']) {
        return Err(invalid(
            &redact_text(text),
            format!("the URL must be {scheme}://bucket/key, with no user, query or fragment"),
        ));
    }
    Ok((bucket, percent_decoded(text, key)?))
}

/// `text`'s `%XX` escapes decoded (as a URL's path is read), refused where one is malformed or
/// the bytes are not UTF-8 (`url` is the whole URL, for the message).
pub(crate) fn percent_decoded(url: &str, text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'%' {
            out.push(bytes[at]);
            at += 1;
            continue;
        }
        let hex = bytes.get(at + 1..at + 3).and_then(|h| std::str::from_utf8(h).ok());
        let Some(byte) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) else {
            return Err(invalid(&redact_text(url), "a '%' not followed by two hex digits"));
        };
        out.push(byte);
        at += 3;
    }
    String::from_utf8(out)
        .map_err(|_| invalid(&redact_text(url), "the key's %XX escapes are not UTF-8"))
}

/// A key as a URL's path writes it: `%`, `?`, `#`, whitespace and control characters as
/// `%XX` (so that the URL shown reads back as the same key), everything else as it is.
fn url_path_of(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if matches!(c, '%' | '?' | '#') || c.is_whitespace() || c.is_control() {
            let mut utf8 = [0u8; 4];
            for byte in c.encode_utf8(&mut utf8).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The kinds of store whose objects live in buckets, and can be listed by prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BucketStore {
    S3,
    Gcs,
    /// Azure's containers, which gpumap treats as buckets.
    Azure,
}

impl BucketStore {
    /// The store `text`'s scheme names, and the rest of the URL after `://`; `None` for a URL
    /// of no bucket store. fsspec's `abfs://container/path` and `abfss://` name Azure
    /// containers as `az://` does; Hadoop's `abfss://container@account.dfs.core.windows.net/`,
    /// which names the account too, is refused, pointing at the variable that names it.
    fn of_url(text: &str) -> Result<Option<(BucketStore, &str)>> {
        let Some((scheme, rest)) = text.split_once("://") else { return Ok(None) };
        let is = |name: &str| scheme.eq_ignore_ascii_case(name);
        let store = if is("s3") {
            BucketStore::S3
        } else if is("gs") {
            BucketStore::Gcs
        } else if is("az") || is("abfs") || is("abfss") {
            BucketStore::Azure
        } else {
            return Ok(None);
        };
        let authority = rest.split('/').next().unwrap_or_default();
        if store == BucketStore::Azure && !is("az") && authority.contains('@') {
            return Err(invalid(
                &redact_text(text),
                "Hadoop's abfs[s]://container@account.dfs.core.windows.net/path names the \
                 storage account in the URL; write az://container/path and set \
                 AZURE_STORAGE_ACCOUNT_NAME to the account",
            ));
        }
        Ok(Some((store, rest)))
    }

    pub(crate) fn scheme(self) -> &'static str {
        match self {
            BucketStore::S3 => "s3",
            BucketStore::Gcs => "gs",
            BucketStore::Azure => "az",
        }
    }

    /// Refuses `bucket` where it is no name of this store's (`text`, the URL, is named).
    fn check_bucket(self, text: &str, bucket: &str) -> Result<()> {
        match self {
            BucketStore::S3 => check_bucket(text, bucket),
            BucketStore::Gcs => check_gcs_bucket(text, bucket),
            BucketStore::Azure => check_azure_container(text, bucket),
        }
    }

    /// The URL of `key` in `bucket`, unchecked: the caller checked it, or it is a level of the
    /// bucket as it is shown (`key` empty, or a prefix and its `/`), not an object.
    pub(crate) fn url(self, bucket: &str, key: String) -> RemoteUrl {
        let bucket = bucket.to_owned();
        match self {
            BucketStore::S3 => RemoteUrl::S3 { bucket, key },
            BucketStore::Gcs => RemoteUrl::Gcs { bucket, key },
            BucketStore::Azure => RemoteUrl::Azure { container: bucket, key },
        }
    }
}

/// `s3://bucket`, `s3://bucket/` or `s3://bucket/some/prefix(/)`, or the same with `gs://` or
/// `az://` (a container; `abfs://` and `abfss://` too):
/// the store, the bucket and the prefix (without its trailing `/`; empty for the whole
/// bucket), checked as keys are.
pub(crate) fn parse_bucket_prefix(text: &str) -> Result<(BucketStore, String, String)> {
    check_text(text)?;
    let Some((store, rest)) = BucketStore::of_url(text)? else {
        return Err(invalid(
            &redact_text(text),
            "a prefix to list is an s3://, gs:// or az:// URL (s3://bucket/prefix/); HTTP \
             servers list nothing",
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let stripped = prefix.strip_suffix('/').unwrap_or(prefix);
    // `s3://bucket//`: an empty segment, not the bucket's root.
    let prefix = if stripped.is_empty() && !prefix.is_empty() { prefix } else { stripped };
    if bucket.contains(['@', '?', '#']) || prefix.contains(['?', '#']) {
        let scheme = store.scheme();
        return Err(invalid(
            &redact_text(text),
            format!("a prefix is {scheme}://bucket/prefix/, with no user, query or fragment"),
        ));
    }
    store.check_bucket(text, bucket)?;
    let prefix = percent_decoded(text, prefix)?;
    if !prefix.is_empty() {
        check_key(text, &prefix)?;
    }
    Ok((store, bucket.to_owned(), prefix))
}

/// The store's own rules for bucket names ([`check_bucket`], [`check_gcs_bucket`],
/// [`check_azure_container`]) and the
/// keys object_store can address (none empty; no empty, `.` or `..` segment; at most 1024
/// bytes).
fn check_object(store: BucketStore, text: &str, bucket: &str, key: &str) -> Result<()> {
    store.check_bucket(text, bucket)?;
    if key.is_empty() {
        return Err(invalid(&redact_text(text), "the URL names a bucket but no key"));
    }
    check_key(text, key)
}

/// S3's rules for bucket names: 3 to 63 lowercase letters, digits, `.` and `-`.
fn check_bucket(text: &str, bucket: &str) -> Result<()> {
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if !bucket_ok {
        return Err(invalid(
            &redact_text(text),
            format!(
                "{bucket:?} is not a bucket name (3 to 63 lowercase letters, digits, '.' or '-')"
            ),
        ));
    }
    Ok(())
}

/// Google's rules for bucket names: 3 to 63 lowercase letters, digits, `-`, `_` and `.` (up
/// to 222 where dots part it into names of at most 63), starting and ending with a letter or
/// digit.
fn check_gcs_bucket(text: &str, bucket: &str) -> Result<()> {
    let alphanumeric =
        |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let bucket_ok = (3..=222).contains(&bucket.len())
        && bucket.split('.').all(|part| part.len() <= 63)
        && (bucket.len() <= 63 || bucket.contains('.'))
        && alphanumeric(bucket.bytes().next())
        && alphanumeric(bucket.bytes().last())
        && bucket.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        });
    if !bucket_ok {
        return Err(invalid(
            &redact_text(text),
            format!(
                "{bucket:?} is not a GCS bucket name (3 to 63 lowercase letters, digits, '-', \
                 '_' or '.', starting and ending with a letter or digit)"
            ),
        ));
    }
    Ok(())
}

/// Azure's rules for container names: 3 to 63 lowercase letters, digits and single `-`s,
/// starting and ending with a letter or digit; or one of the special `$root`, `$web` and
/// `$logs`.
fn check_azure_container(text: &str, container: &str) -> Result<()> {
    let alphanumeric =
        |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let special = matches!(container, "$root" | "$web" | "$logs");
    let container_ok = special
        || ((3..=63).contains(&container.len())
            && alphanumeric(container.bytes().next())
            && alphanumeric(container.bytes().last())
            && !container.contains("--")
            && container
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    if !container_ok {
        return Err(invalid(
            &redact_text(text),
            format!(
                "{container:?} is not an Azure container name (3 to 63 lowercase letters, \
                 digits or single '-', starting and ending with a letter or digit)"
            ),
        ));
    }
    Ok(())
}

fn check_key(text: &str, key: &str) -> Result<()> {
    if key.len() > 1024 {
        return Err(invalid(&redact_text(text), "keys are at most 1024 bytes long"));
    }
    if key.chars().any(|c| c.is_ascii_control()) {
        return Err(invalid(&redact_text(text), "keys with control characters are not supported"));
    }
    if key.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return Err(invalid(
            &redact_text(text),
            "keys with an empty, '.' or '..' segment (a leading, trailing or doubled '/') are \
             not supported",
        ));
    }
    Ok(())
}

fn parse_http(text: &str) -> Result<RemoteUrl> {
    // WHATWG parsing reads `http:///path` as host `path`; a URL whose host is empty as written
    // is refused rather than guessed at.
    if text
        .split_once("://")
        .is_some_and(|(_, rest)| rest.is_empty() || rest.starts_with(['/', '?', '#']))
    {
        return Err(invalid(&redact_text(text), "the URL has no host"));
    }
    let url = url::Url::parse(text)
        .map_err(|e| invalid(&redact_text(text), format!("not a valid URL: {e}")))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(&redact_url(&url), "the URL has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            &redact_url(&url),
            "credentials inside the URL are not accepted (they would end up in logs)",
        ));
    }
    Ok(RemoteUrl::Http(url))
}

pub(crate) fn redact_url(url: &url::Url) -> String {
    let mut shown = url.clone();
    // Neither can fail on an http(s) URL with a host, the only kind that gets here.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_fragment(None);
    if shown.query().is_some() {
        shown.set_query(None);
        format!("{shown}?…")
    } else {
        shown.to_string()
    }
}

/// [`RemoteUrl::redacted`] for text that did not parse: everything from `?` on, and any
/// `user:password@`, dropped.
fn redact_text(text: &str) -> String {
    let (head, had_query) = match text.split_once(['?', '#']) {
        Some((head, _)) => (head, true),
        None => (text, false),
    };
    let head = match head.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => head.to_owned(),
            }
        }
        None => head.to_owned(),
    };
    if had_query {
        format!("{head}?…")
    } else {
        head
    }
}

pub(crate) fn invalid(shown: &str, reason: impl Into<String>) -> Error {
    Error::Remote {
        url: shown.to_owned(),
        op: "open".to_owned(),
        kind: RemoteErrorKind::InvalidUrl,
        status: None,
        attempts: 0,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests;
