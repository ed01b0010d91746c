//! One failed request, classified: what kind of failure, the HTTP status, and a reason that
//! carries no credentials. [`Failure::retryable`] decides retries; [`Failure::into_error`]
//! makes the [`Error::Remote`] a caller sees.
#![forbid(unsafe_code)]

use crate::error::{Error, RemoteErrorKind};
use crate::remote::options::RemoteOptions;
use crate::remote::url::RemoteUrl;

/// What went wrong with one attempt of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) kind: RemoteErrorKind,
    pub(crate) status: Option<u16>,
    pub(crate) reason: String,
}

impl Failure {
    pub(crate) fn new(
        kind: RemoteErrorKind,
        status: Option<u16>,
        reason: impl Into<String>,
    ) -> Self {
        Self { kind, status, reason: reason.into() }
    }

    /// Classifies an object_store error. object_store keeps the status of a failed request in a
    /// crate-private type, so the status is read from its message ("...status code: 503 ...");
    /// the transport's kind (timeout, connect) from its public `HttpError`.
    pub(crate) fn from_store(error: &object_store::Error, url: &RemoteUrl) -> Self {
        use object_store::Error as E;
        let reason = in_plain_words(scrub(&innermost(error), url));
        // The status the server sent, where the error carries it: object_store files a 405 (a
        // HEAD refused) under NotFound, which is not what the server said.
        if let Some(status) = status_in_chain(error) {
            let kind = match status {
                404 => RemoteErrorKind::NotFound,
                401 | 403 => RemoteErrorKind::AccessDenied,
                409 if refuses_anonymous(url, &reason) => RemoteErrorKind::AccessDenied,
                _ => RemoteErrorKind::Status,
            };
            return Self::new(kind, Some(status), reason);
        }
        match error {
            E::InvalidPath { source } => Self::new(
                RemoteErrorKind::UnsupportedKey,
                None,
                format!("the store holds a key this client cannot name: {source}"),
            ),
            E::NotFound { .. } => Self::new(RemoteErrorKind::NotFound, Some(404), reason),
            E::PermissionDenied { .. } => {
                Self::new(RemoteErrorKind::AccessDenied, Some(403), reason)
            }
            E::Unauthenticated { .. } => {
                Self::new(RemoteErrorKind::AccessDenied, Some(401), reason)
            }
            // An `If-Match` that no longer matches: object_store keeps no status for it.
            E::Precondition { .. } => Self::new(RemoteErrorKind::BadResponse, Some(412), reason),
            _ => {
                let kind = match transport_kind(error) {
                    Some(object_store::client::HttpErrorKind::Timeout) => RemoteErrorKind::Timeout,
                    Some(object_store::client::HttpErrorKind::Decode) => {
                        RemoteErrorKind::BadResponse
                    }
                    Some(_) => RemoteErrorKind::Connection,
                    // Not a transport failure and no status: object_store refused the answer
                    // itself (not a 206, a Content-Range other than the one asked for).
                    None => RemoteErrorKind::BadResponse,
                };
                Self::new(kind, None, reason)
            }
        }
    }

    /// Whether another attempt may succeed: a status configured as retryable, or a connection
    /// that failed or broke mid-body. Timeouts, refusals and malformed answers are final.
    pub(crate) fn retryable(&self, options: &RemoteOptions) -> bool {
        match self.kind {
            RemoteErrorKind::Connection => true,
            _ => self.status.is_some_and(|s| options.retry_status_codes.contains(&s)),
        }
    }

    /// The error a caller sees, after `attempts` requests.
    pub(crate) fn into_error(self, url: &RemoteUrl, op: impl Into<String>, attempts: u32) -> Error {
        Error::Remote {
            url: url.redacted(),
            op: op.into(),
            kind: self.kind,
            status: self.status,
            attempts,
            reason: self.reason,
        }
    }
}

/// Whether a 409 of `url`'s store is Azure's refusal of unsigned requests where the account
/// allows no anonymous access (the default for new accounts), a refusal as 401 and 403 are:
/// its code `PublicAccessNotPermitted`, or no code at all, as in the answer to a HEAD, whose
/// code travels in a header object_store does not keep (a HEAD meets no other 409).
fn refuses_anonymous(url: &RemoteUrl, reason: &str) -> bool {
    matches!(url, RemoteUrl::Azure { .. })
        && (reason.starts_with("PublicAccessNotPermitted")
            || reason.trim_end().ends_with("409 Conflict:"))
}

/// The deepest message of the chain: the one that says what happened (the connection was
/// refused, the status and body) without the layers above that repeat the request's URL.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = error;
    while let Some(next) = deepest.source() {
        deepest = next;
    }
    let text = deepest.to_string();
    // An S3 error document says what went wrong in its Code and Message, whatever line
    // they are on (the first is often `<?xml ...?>`).
    if let Some(code) = xml_element(&text, "Code") {
        let message = xml_element(&text, "Message").map(|m| format!(": {m}")).unwrap_or_default();
        let shown: String = format!("{code}{message}").chars().take(300).collect();
        return shown;
    }
    // A status error's body can be a whole XML document: its first line is enough.
    let first: String = text.lines().next().unwrap_or_default().chars().take(300).collect();
    if first.len() < text.len() {
        format!("{first}…")
    } else {
        first
    }
}

/// The text of the first `<name>…</name>` of `xml`, where it has one on a line of its own or
/// within one.
fn xml_element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{name}>"))?;
    Some(xml[start..start + end].trim())
}

/// object_store's words for an answer it refused, where they do not say what the server did,
/// replaced by words that do; other messages as they are.
fn in_plain_words(reason: String) -> String {
    const WHOLE: &str = "the server sent the whole object (200 OK) where a range was asked \
                         for (206 Partial Content)";
    const SAID: [(&str, &str); 3] = [
        ("Range request not supported by", WHOLE),
        ("Received non-partial response when range requested", WHOLE),
        (
            "Content-Length Header missing",
            "the answer has no Content-Length (a chunked or compressed body), which a ranged \
             read needs",
        ),
    ];
    match SAID.iter().find(|(theirs, _)| reason.starts_with(theirs)) {
        Some((_, ours)) => (*ours).to_owned(),
        None => reason,
    }
}

/// The HTTP status of a failed request, from the message object_store writes for it.
fn status_in_chain(error: &(dyn std::error::Error + 'static)) -> Option<u16> {
    const MARKER: &str = "status code: ";
    let mut current = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if let Some(at) = text.find(MARKER) {
            let digits: String =
                text[at + MARKER.len()..].chars().take_while(char::is_ascii_digit).collect();
            if let Ok(status) = digits.parse::<u16>() {
                return Some(status);
            }
        }
        current = e.source();
    }
    None
}

fn transport_kind(
    error: &(dyn std::error::Error + 'static),
) -> Option<object_store::client::HttpErrorKind> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(http) = e.downcast_ref::<object_store::client::HttpError>() {
            return Some(http.kind());
        }
        current = e.source();
    }
    None
}

/// `text` with every secret of `url` (the URL itself where it has a query string, the query
/// string) replaced, since lower layers print the URLs they requested.
pub(crate) fn scrub(text: &str, url: &RemoteUrl) -> String {
    let mut secrets = url.secrets();
    // Longest first, so that the whole URL goes before its query string is looked for.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.iter().fold(text.to_owned(), |text, secret| text.replace(secret.as_str(), "[redacted]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_answers_are_said_in_plain_words() {
        let said = |theirs: &str| in_plain_words(theirs.to_owned());
        assert!(said("Range request not supported by ").contains("whole object (200 OK)"));
        assert!(said("Received non-partial response when range requested").contains("200 OK"));
        assert!(said("Content-Length Header missing from response").contains("chunked"));
        assert_eq!(said("connection refused"), "connection refused");
    }

    #[test]
    fn statuses_are_read_from_the_chain() {
        #[derive(Debug)]
        struct Outer(Inner);
        #[derive(Debug)]
        struct Inner;
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Error performing GET http://h/k?sig=s in 1ms")
            }
        }
        impl std::fmt::Display for Inner {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Server returned non-2xx status code: 503 Service Unavailable: busy")
            }
        }
        impl std::error::Error for Inner {}
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(status_in_chain(&Outer(Inner)), Some(503));
        assert!(innermost(&Outer(Inner)).starts_with("Server returned"));
        assert_eq!(status_in_chain(&std::io::Error::other("status code: none")), None);
    }

    #[test]
    fn s3_error_documents_are_shown_by_their_code_and_message() {
        let body = "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\n\
                    <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not \
                    exist</Message></Error>";
        let shown = innermost(&std::io::Error::other(body));
        assert_eq!(shown, "NoSuchBucket: The specified bucket does not exist");
        assert_eq!(xml_element("<a><Code> X </Code>", "Code"), Some("X"));
        assert_eq!(xml_element("<Code>unclosed", "Code"), None);
    }

    #[test]
    fn secrets_are_scrubbed_from_messages() {
        let url = RemoteUrl::parse("https://h/k?X-Amz-Signature=deadbeef").unwrap();
        let text =
            scrub("GET https://h/k?X-Amz-Signature=deadbeef: X-Amz-Signature=deadbeef", &url);
        assert!(!text.contains("deadbeef"), "{text}");
    }

    #[test]
    fn only_configured_statuses_and_broken_connections_are_retried() {
        let o = RemoteOptions::default();
        assert!(Failure::new(RemoteErrorKind::Status, Some(503), "").retryable(&o));
        assert!(!Failure::new(RemoteErrorKind::Status, Some(501), "").retryable(&o));
        assert!(!Failure::new(RemoteErrorKind::NotFound, Some(404), "").retryable(&o));
        assert!(Failure::new(RemoteErrorKind::Connection, None, "").retryable(&o));
        assert!(!Failure::new(RemoteErrorKind::Timeout, None, "").retryable(&o));
        assert!(!Failure::new(RemoteErrorKind::BadResponse, None, "").retryable(&o));
    }
}
