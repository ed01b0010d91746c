//! One request's attempts: each within the options' timeout, retried with exponential backoff
//! while its failure is retryable ([`Failure::retryable`]), up to the options' attempts. Shared
//! by the reads' GETs and the writes' uploads, so both retry alike.
#![forbid(unsafe_code)]

use std::future::Future;

use crate::error::{Error, RemoteErrorKind};
use crate::remote::failure::Failure;
use crate::remote::options::RemoteOptions;
use crate::remote::url::RemoteUrl;

/// A request that failed for good: what was asked, why, and after how many requests.
#[derive(Debug, Clone)]
pub(crate) struct GaveUp {
    pub(crate) op: String,
    pub(crate) failure: Failure,
    pub(crate) attempts: u32,
}

impl GaveUp {
    /// The error a caller sees.
    pub(crate) fn into_error(self, url: &RemoteUrl) -> Error {
        self.failure.into_error(url, self.op, self.attempts)
    }
}

/// The attempts of one request so far.
pub(crate) struct Attempts<'a> {
    options: &'a RemoteOptions,
    url: &'a RemoteUrl,
    made: u32,
}

impl<'a> Attempts<'a> {
    pub(crate) fn new(options: &'a RemoteOptions, url: &'a RemoteUrl) -> Self {
        Self { options, url, made: 0 }
    }

    /// Runs one attempt within the timeout.
    pub(crate) async fn attempt<T>(
        &mut self,
        request: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        self.made += 1;
        match tokio::time::timeout(self.options.timeout, request).await {
            Ok(answer) => answer,
            Err(_) => Err(Failure::new(
                RemoteErrorKind::Timeout,
                None,
                format!("no complete answer within {:?}", self.options.timeout),
            )),
        }
    }

    /// After an attempt of `op` failed with `failure`: waits the backoff and returns `Ok` for
    /// another attempt, or gives up when the failure is final or the attempts are spent.
    pub(crate) async fn retry_after(&mut self, failure: Failure, op: &str) -> Result<(), GaveUp> {
        if self.made >= self.options.max_attempts || !failure.retryable(self.options) {
            return Err(GaveUp { op: op.to_owned(), failure, attempts: self.made });
        }
        let wait = self.options.backoff_after(self.made);
        tracing::warn!(
            url = %self.url, op, attempt = self.made, status = ?failure.status,
            reason = %failure.reason, wait_ms = wait.as_millis() as u64,
            "remote request failed; retrying"
        );
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// Runs `request` (made afresh for each attempt) until it succeeds or gives up.
    pub(crate) async fn run<T, F, R>(mut self, op: &str, mut request: R) -> Result<T, GaveUp>
    where
        R: FnMut() -> F,
        F: Future<Output = Result<T, Failure>>,
    {
        loop {
            match self.attempt(request()).await {
                Ok(value) => return Ok(value),
                Err(failure) => self.retry_after(failure, op).await?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    fn options(attempts: u32) -> RemoteOptions {
        let mut o = RemoteOptions::default();
        o.max_attempts(attempts)
            .unwrap()
            .backoff(Duration::from_millis(1), Duration::from_millis(2));
        o.timeout(Duration::from_millis(50)).unwrap();
        o
    }

    /// Runs `request`'s attempts, counting them: the outcome and the count.
    fn run(o: &RemoteOptions, fail: impl Fn(u32) -> Option<Failure>) -> (Result<u32, GaveUp>, u32) {
        let url = RemoteUrl::parse("s3://bucket/key").unwrap();
        let made = AtomicU32::new(0);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let outcome = runtime.block_on(Attempts::new(o, &url).run("PUT", || async {
            let n = made.fetch_add(1, Ordering::SeqCst) + 1;
            match fail(n) {
                Some(failure) => Err(failure),
                None => Ok(n),
            }
        }));
        (outcome, made.load(Ordering::SeqCst))
    }

    #[test]
    fn retryable_failures_are_retried_up_to_the_attempts() {
        let busy = |_| Some(Failure::new(RemoteErrorKind::Status, Some(503), "busy"));
        let (outcome, made) = run(&options(3), busy);
        let gave_up = outcome.unwrap_err();
        assert_eq!((made, gave_up.attempts, gave_up.op.as_str()), (3, 3, "PUT"));
        assert_eq!(gave_up.failure.status, Some(503));
        // Two broken connections, then an answer.
        let broken = |n| (n < 3).then(|| Failure::new(RemoteErrorKind::Connection, None, "reset"));
        assert_eq!(run(&options(3), broken).0.unwrap(), 3);
    }

    #[test]
    fn final_failures_and_timeouts_are_not_retried() {
        let refused = |_| Some(Failure::new(RemoteErrorKind::AccessDenied, Some(403), "no"));
        let (outcome, made) = run(&options(5), refused);
        assert_eq!((made, outcome.unwrap_err().attempts), (1, 1));
        let url = RemoteUrl::parse("s3://bucket/key").unwrap();
        let o = options(5);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let gave_up = runtime
            .block_on(Attempts::new(&o, &url).run("PUT", || async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<(), Failure>(())
            }))
            .unwrap_err();
        assert_eq!((gave_up.failure.kind, gave_up.attempts), (RemoteErrorKind::Timeout, 1));
    }
}
