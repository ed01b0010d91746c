//! [`CappedErrorBodies`]: object_store's HTTP client with the body of an error answer read to
//! [`MAX_ERROR_BODY`] bytes at most.
//!
//! object_store reads the whole body of a failed request to quote it in its error; a server
//! (or anything between) that answers 500 with an endless body would make a 100-byte read hold
//! gigabytes. The decorator keeps the start of such a body, which is all an error message
//! shows, and drops the rest with the connection. Successful answers pass untouched: their
//! bodies are the data, streamed and bounded by the range asked for.
#![forbid(unsafe_code)]

use async_trait::async_trait;
use futures_util::StreamExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpResponseBody, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;

/// Bytes of an error answer's body kept: more than any error document a store writes.
pub(crate) const MAX_ERROR_BODY: usize = 64 << 10;

/// Connects object_store's stores through [`CappedErrorBodies`] over its reqwest client.
#[derive(Debug, Default)]
pub(crate) struct CappedConnector;

impl HttpConnector for CappedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CappedErrorBodies { inner }))
    }
}

/// An HTTP client whose error answers (4xx, 5xx) carry at most [`MAX_ERROR_BODY`] bytes of
/// their body.
#[derive(Debug)]
pub(crate) struct CappedErrorBodies {
    inner: HttpClient,
}

#[async_trait]
impl HttpService for CappedErrorBodies {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let answer = self.inner.execute(request).await?;
        let status = answer.status();
        if !(status.is_client_error() || status.is_server_error()) {
            return Ok(answer);
        }
        let (parts, body) = answer.into_parts();
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::from(start_of(body).await)))
    }
}

/// The first [`MAX_ERROR_BODY`] bytes of `body` (fewer where it ends, or fails, first).
async fn start_of(body: HttpResponseBody) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut stream = body.bytes_stream();
    while kept.len() < MAX_ERROR_BODY {
        match stream.next().await {
            Some(Ok(chunk)) => {
                let room = MAX_ERROR_BODY - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Some(Err(_)) | None => break,
        }
    }
    kept
}
