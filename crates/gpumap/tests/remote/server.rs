//! A tiny HTTP/1.1 range server on 127.0.0.1, for the remote tests: GET and HEAD with `Range`,
//! keep-alive, a thread per connection, and faults injected into the next GETs (statuses,
//! stalls, bodies cut short, wrong ranges, garbage). In S3 mode it serves path-style
//! `/bucket/key`, answers S3's XML errors, and refuses requests not signed with the expected
//! access key id (it does not verify signatures: object_store's signing is not under test).
//! S3 mode also takes writes: plain PUTs and multipart uploads (create, parts, complete with
//! AWS's rules on part order, ETags and the 5 MiB minimum, abort), with their own fault queue.
//! GCS mode is S3's requests with a bearer token; Azure mode serves `/container/blob` with
//! Azure's listings, block uploads and batch deletes.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// The access key id the tests' process signs with ([`aws_environment`]), which
/// [`Server::s3`] is usually told to want, and its secret, which no message may show.
#[allow(dead_code)] // Not every test binary signs.
pub const KEY_ID: &str = "GPUMAPTESTKEYID";
#[allow(dead_code)]
pub const SECRET: &str = "gpumap-test-secret-never-shown";

/// The standard AWS variables, set once before any test opens an S3 object (every test calls
/// this first, so no test reads the environment while it changes): [`KEY_ID`] and [`SECRET`]
/// in us-east-1, with no endpoint or session token from elsewhere.
#[allow(dead_code)]
pub fn aws_environment() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", KEY_ID);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
        std::env::set_var("AWS_DEFAULT_REGION", "us-east-1");
        std::env::remove_var("AWS_ENDPOINT_URL");
        std::env::remove_var("AWS_SESSION_TOKEN");
    });
}

/// The AWS variables that give credentials or an endpoint: what a test binary that sets up an
/// environment of its own (the AWS files, or nothing) removes first.
#[allow(dead_code)] // Used by the binaries that set their own environment.
pub const AWS_CREDENTIAL_AND_ENDPOINT_VARS: [&str; 9] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
];

/// What the server does to one GET instead of answering it well.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// Wait this long before answering (well).
    Stall(Duration),
    /// Promise the whole range, send half of it, close the connection.
    Truncate,
    /// A 206 whose Content-Range is one byte off from the range asked for.
    WrongRange,
    /// A 200 with the whole object, as a server that ignores `Range` sends.
    IgnoreRange,
    /// Bytes that are not HTTP.
    Garbage,
}

/// What the server does to one write (PUT object, PUT part, POST complete) instead of answering
/// it well. A faulted write stores nothing.
#[allow(dead_code)] // Not every test binary writes.
#[derive(Debug, Clone)]
pub enum WriteFault {
    /// Answer with this status and an S3 XML error body (503: `SlowDown`, 500: `InternalError`).
    Status(u16),
    /// Wait this long before handling it (well).
    Stall(Duration),
    /// Read the request, then close the connection without answering.
    Drop,
}

/// AWS's smallest part, but for the last of an upload.
const MIN_PART: usize = 5 * 1024 * 1024;

/// One uploaded part: its ETag (quoted) and bytes.
struct Part {
    etag: String,
    bytes: Vec<u8>,
}

/// A multipart upload in progress, for the object at `path`.
struct Upload {
    path: String,
    parts: BTreeMap<u16, Part>,
}

#[derive(Default)]
struct State {
    objects: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    faults: Mutex<VecDeque<Fault>>,
    /// The access key id S3 mode requires in `Authorization`; `None`: plain HTTP mode.
    s3_key_id: Option<String>,
    /// WebHDFS mode: files under `/webhdfs/v1/`, sized by `op=GETFILESTATUS` (counted as a
    /// HEAD) and read by `op=OPEN`, which redirects (307) to a "datanode" path first.
    webhdfs: bool,
    /// Spaces added to every WebHDFS file status, to make it as long as a hostile one.
    status_padding: AtomicUsize,
    /// Every GET waits this long, so that concurrency can be seen.
    get_delay: Mutex<Duration>,
    heads: AtomicUsize,
    gets: AtomicUsize,
    active_gets: AtomicUsize,
    max_active_gets: AtomicUsize,
    write_faults: Mutex<VecDeque<WriteFault>>,
    /// Faults for the next creations of multipart uploads, apart from the other writes'.
    create_faults: Mutex<VecDeque<WriteFault>>,
    /// Multipart uploads by upload id.
    uploads: Mutex<HashMap<String, Upload>>,
    /// Every part put waits this long (after its body is in), so that concurrency can be seen.
    part_delay: Mutex<Duration>,
    uploads_created: AtomicUsize,
    aborts: AtomicUsize,
    completes: AtomicUsize,
    part_puts: AtomicUsize,
    plain_puts: AtomicUsize,
    active_part_puts: AtomicUsize,
    max_active_part_puts: AtomicUsize,
    /// Keys a listing page holds at most (S3's is 1000); 0 means 1000.
    list_page: AtomicUsize,
    lists: AtomicUsize,
    /// Connections accepted, and those still open.
    accepted: AtomicUsize,
    open_connections: AtomicUsize,
    /// GCS mode (reads only): the bearer token requests must carry.
    gcs_token: Option<String>,
    /// Azure mode: the bearer token requests must carry. An unsigned request for an object
    /// not public is refused as an account without anonymous access refuses it (409).
    azure_token: Option<String>,
    /// Azure mode: the blocks put and not yet committed, by blob path and block id.
    blocks: Mutex<HashMap<(String, String), Vec<u8>>>,
    /// S3 and GCS modes: objects anyone may read, unsigned requests served (a signed request
    /// with another key is still refused, as S3 refuses it).
    public: Mutex<HashSet<String>>,
    /// S3 and GCS modes: requests that came with no `Authorization` header, and with one.
    unsigned: AtomicUsize,
    signed: AtomicUsize,
}

/// A running server; it stops accepting when dropped (connections in progress finish).
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Server {
    /// A plain HTTP range server.
    pub fn http() -> Server {
        Self::start(None)
    }

    /// An S3-compatible responder that wants requests signed with `key_id`.
    pub fn s3(key_id: &str) -> Server {
        Self::start(Some(key_id.to_owned()))
    }

    /// A Google Cloud Storage stand-in (object_store's XML API requests, which are S3's in
    /// shape: HEAD and ranged GETs of `/bucket/object`, listings, PUTs, multipart uploads and
    /// deletes) that wants `Authorization: Bearer <token>`.
    #[allow(dead_code)] // Used by the GCS test binary alone.
    pub fn gcs(token: &str) -> Server {
        Self::start_with(State { gcs_token: Some(token.to_owned()), ..State::default() })
    }

    /// An Azure Blob Storage stand-in (object_store's requests with an endpoint given:
    /// `/container/blob`; listings, block blobs and batch deletes) that wants
    /// `Authorization: Bearer <token>`.
    #[allow(dead_code)] // Used by the Azure test binary alone.
    pub fn azure(token: &str) -> Server {
        Self::start_with(State { azure_token: Some(token.to_owned()), ..State::default() })
    }

    /// A WebHDFS namenode and datanode in one: `put("/webhdfs/v1/<path>", ...)` files.
    pub fn webhdfs() -> Server {
        Self::start_with(State { webhdfs: true, ..State::default() })
    }

    fn start(s3_key_id: Option<String>) -> Server {
        Self::start_with(State { s3_key_id, ..State::default() })
    }

    fn start_with(state: State) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(state);
        let shared = Arc::clone(&state);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                // An answer is written as its head, then its body: with Nagle's algorithm the
                // body would wait for the client's delayed ACK of the head, 40 ms an answer.
                let _ = stream.set_nodelay(true);
                let state = Arc::clone(&shared);
                state.accepted.fetch_add(1, Ordering::SeqCst);
                state.open_connections.fetch_add(1, Ordering::SeqCst);
                // A dropped Server leaves the accept loop blocked; tests are short-lived.
                thread::spawn(move || {
                    serve(stream, &state);
                    state.open_connections.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Server { addr, state }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Connections accepted and not yet closed by the client.
    pub fn open_connections(&self) -> usize {
        self.state.open_connections.load(Ordering::SeqCst)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves `bytes` at `path` (`/dir/file`, or `/bucket/key` in S3 mode).
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.state.objects.lock().unwrap().insert(path.to_owned(), Arc::new(bytes));
    }

    /// S3 and GCS modes: lets requests without a signature read the object at `path`.
    #[allow(dead_code)] // Not every test binary has public objects.
    pub fn make_public(&self, path: &str) {
        self.state.public.lock().unwrap().insert(path.to_owned());
    }

    /// S3 and GCS modes: requests that came without a signature, and with one (faults injected
    /// answer before either is counted).
    #[allow(dead_code)]
    pub fn unsigned_and_signed_requests(&self) -> (usize, usize) {
        (self.state.unsigned.load(Ordering::SeqCst), self.state.signed.load(Ordering::SeqCst))
    }

    /// Queues faults for the next GETs, one each.
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.faults.lock().unwrap().extend(faults);
    }

    /// Makes every GET wait `delay` before answering.
    pub fn delay_gets(&self, delay: Duration) {
        *self.state.get_delay.lock().unwrap() = delay;
    }

    pub fn heads(&self) -> usize {
        self.state.heads.load(Ordering::SeqCst)
    }

    pub fn gets(&self) -> usize {
        self.state.gets.load(Ordering::SeqCst)
    }

    /// The most GETs seen in progress at once.
    /// Listing pages hold at most `keys` keys (and common prefixes), so that tests see
    /// continuation tokens.
    #[allow(dead_code)] // Not every test binary lists.
    pub fn list_page_size(&self, keys: usize) {
        self.state.list_page.store(keys, Ordering::SeqCst);
    }

    /// WebHDFS file statuses come padded with `bytes` spaces.
    #[allow(dead_code)]
    pub fn pad_status(&self, bytes: usize) {
        self.state.status_padding.store(bytes, Ordering::SeqCst);
    }

    /// Listing pages asked for (GET with `list-type=2`), answered or faulted.
    #[allow(dead_code)]
    pub fn lists(&self) -> usize {
        self.state.lists.load(Ordering::SeqCst)
    }

    /// The paths (`/bucket/key`) of the objects held, in order.
    #[allow(dead_code)]
    pub fn paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.state.objects.lock().unwrap().keys().cloned().collect();
        paths.sort();
        paths
    }

    /// The most GETs seen at once, each counted from its arrival until its answer starts (the
    /// delay of [`delay_gets`](Self::delay_gets) included).
    pub fn max_active_gets(&self) -> usize {
        self.state.max_active_gets.load(Ordering::SeqCst)
    }

    /// Starts counting [`max_active_gets`](Self::max_active_gets) afresh, from the GETs
    /// active now.
    #[allow(dead_code)] // Not every test binary counts GETs at once.
    pub fn restart_max_active_gets(&self) {
        let now = self.state.active_gets.load(Ordering::SeqCst);
        self.state.max_active_gets.store(now, Ordering::SeqCst);
    }
}

/// The write side, for the tests of writers.
#[allow(dead_code)] // Not every test binary writes.
impl Server {
    /// Queues faults for the next writes (PUT object, PUT part, POST complete), one each.
    pub fn inject_writes(&self, faults: impl IntoIterator<Item = WriteFault>) {
        self.state.write_faults.lock().unwrap().extend(faults);
    }

    /// Queues faults for the next creations of multipart uploads, one each.
    pub fn inject_creates(&self, faults: impl IntoIterator<Item = WriteFault>) {
        self.state.create_faults.lock().unwrap().extend(faults);
    }

    /// Makes every part put wait `delay` before answering.
    pub fn delay_part_puts(&self, delay: Duration) {
        *self.state.part_delay.lock().unwrap() = delay;
    }

    /// The bytes stored at `path`, by [`Server::put`] or by a write.
    pub fn object(&self, path: &str) -> Option<Vec<u8>> {
        self.state.objects.lock().unwrap().get(path).map(|bytes| bytes.to_vec())
    }

    /// Multipart uploads created and neither completed nor aborted.
    pub fn open_uploads(&self) -> usize {
        self.state.uploads.lock().unwrap().len()
    }

    /// Multipart uploads created, ever.
    pub fn uploads_created(&self) -> usize {
        self.state.uploads_created.load(Ordering::SeqCst)
    }

    /// Multipart uploads aborted (a DELETE of an upload that was open).
    pub fn aborts(&self) -> usize {
        self.state.aborts.load(Ordering::SeqCst)
    }

    /// Multipart uploads completed.
    pub fn completes(&self) -> usize {
        self.state.completes.load(Ordering::SeqCst)
    }

    /// Signed part puts received, those answered with a fault included.
    pub fn part_puts(&self) -> usize {
        self.state.part_puts.load(Ordering::SeqCst)
    }

    /// Signed plain object puts received, those answered with a fault included.
    pub fn plain_puts(&self) -> usize {
        self.state.plain_puts.load(Ordering::SeqCst)
    }

    /// The most part puts seen in progress at once (from their head to their answer).
    pub fn max_active_part_puts(&self) -> usize {
        self.state.max_active_part_puts.load(Ordering::SeqCst)
    }
}

struct Request {
    method: String,
    /// Percent-decoded, without the query.
    path: String,
    /// Percent-decoded; a name without `=` has an empty value.
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    fn is_part_put(&self) -> bool {
        self.method == "PUT"
            && self.query.contains_key("partNumber")
            && self.query.contains_key("uploadId")
    }
}

fn read_head(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    let query = parse_query(query);
    Some(Request { method, path: percent_decode(path), query, headers, body: Vec::new() })
}

fn parse_query(query: &str) -> HashMap<String, String> {
    let pairs = query.split('&').filter(|pair| !pair.is_empty());
    pairs
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

/// Reads the body that `Content-Length` or `Transfer-Encoding: chunked` announces. object_store
/// sends a `Content-Length` with every write, streamed payloads included; chunked costs little.
fn read_body(reader: &mut BufReader<TcpStream>, request: &mut Request) -> Option<()> {
    let encoding = request.headers.get("transfer-encoding");
    if encoding.is_some_and(|e| e.to_ascii_lowercase().contains("chunked")) {
        request.body = read_chunked(reader)?;
    } else if let Some(n) = request.headers.get("content-length") {
        let n: u64 = n.parse().ok()?;
        reader.by_ref().take(n).read_to_end(&mut request.body).ok()?;
        (request.body.len() as u64 == n).then_some(())?;
    }
    Some(())
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(reader)?;
        let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            break;
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).ok()?;
        read_line(reader)?;
    }
    // Trailers, up to the empty line.
    while !read_line(reader)?.is_empty() {}
    Some(body)
}

/// One line without its line end; `None` at the end of the stream.
fn read_line(reader: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    Some(line.trim_end().to_owned())
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(stream: TcpStream, state: &State) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(mut request) = read_head(&mut reader) {
        // A part put is in progress from its head on, the transfer of its body included.
        let _active = request
            .is_part_put()
            .then(|| Active::enter(&state.active_part_puts, &state.max_active_part_puts));
        // A client that asked to close waits for the end of the stream.
        let close =
            request.headers.get("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
        if read_body(&mut reader, &mut request).is_none() || !handle(&mut writer, state, request) {
            return;
        }
        if close {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Answers one request; false: close the connection.
fn handle(out: &mut TcpStream, state: &State, request: Request) -> bool {
    match request.method.as_str() {
        "HEAD" => {
            state.heads.fetch_add(1, Ordering::SeqCst);
            answer(out, state, &request, true)
        }
        "GET" => get(out, state, &request),
        "PUT" | "POST" | "DELETE" if state.azure_token.is_some() => {
            azure_write(out, state, request)
        }
        "PUT" | "POST" | "DELETE" if state.buckets() => write(out, state, request),
        _ => respond(out, 405, &[], b""),
    }
}

fn get(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    if state.webhdfs {
        return webhdfs(out, state, request);
    }
    if state.buckets() && request.query.get("list-type").is_some_and(|t| t == "2") {
        return list(out, state, request);
    }
    if state.azure_token.is_some() && request.query.get("comp").is_some_and(|c| c == "list") {
        return list(out, state, request);
    }
    plain_get(out, state, request)
}

/// A GET of an object, whole or ranged, counted, delayed and faulted as the tests ask.
fn plain_get(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    state.gets.fetch_add(1, Ordering::SeqCst);
    let now = state.active_gets.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_active_gets.fetch_max(now, Ordering::SeqCst);
    let delay = *state.get_delay.lock().unwrap();
    thread::sleep(delay);
    // No longer counted once the answer starts: the client may have all of it, and its next
    // request under way, before this thread would get to count it done, and the count would
    // then pass the client's bound on requests in flight that it is there to check.
    state.active_gets.fetch_sub(1, Ordering::SeqCst);
    let fault = state.faults.lock().unwrap().pop_front();
    match fault {
        None => answer(out, state, request, false),
        Some(fault) => misbehave(out, state, request, fault),
    }
}

/// Counts one request in progress while it lives, and keeps the most seen at once.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn enter(active: &'a AtomicUsize, max: &AtomicUsize) -> Active<'a> {
        let now = active.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(now, Ordering::SeqCst);
        Active(active)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn respond(out: &mut TcpStream, status: u16, headers: &[(&str, String)], body: &[u8]) -> bool {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    // A 204 has no body, and says so by sending no length at all.
    let has_length = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    if status != 204 && !has_length {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes()).is_ok() && out.write_all(body).is_ok()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        400 => "Bad Request",
        201 => "Created",
        202 => "Accepted",
        403 => "Forbidden",
        409 => "Conflict",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// In S3 mode, refuses (403) a request not signed with the expected access key id; the error
/// response is already sent: `Err(keep_open)`.
fn authorize(out: &mut TcpStream, state: &State, request: &Request) -> Result<(), bool> {
    if let Some(token) = &state.gcs_token {
        return authorize_bearer(out, state, request, token);
    }
    if let Some(token) = &state.azure_token {
        return authorize_azure(out, state, request, token);
    }
    let Some(key_id) = &state.s3_key_id else { return Ok(()) };
    let Some(authorization) = request.headers.get("authorization") else {
        state.unsigned.fetch_add(1, Ordering::SeqCst);
        let read = matches!(request.method.as_str(), "GET" | "HEAD");
        if read && state.public.lock().unwrap().contains(&request.path) {
            return Ok(());
        }
        return Err(s3_reply(out, 403, "AccessDenied", "Access Denied"));
    };
    state.signed.fetch_add(1, Ordering::SeqCst);
    if authorization.contains(&format!("Credential={key_id}/")) {
        return Ok(());
    }
    Err(s3_reply(out, 403, "InvalidAccessKeyId", "The AWS Access Key Id does not exist"))
}

/// In GCS mode, refuses (401) a request without the bearer token, unless it reads a public
/// object unsigned.
fn authorize_bearer(
    out: &mut TcpStream,
    state: &State,
    request: &Request,
    token: &str,
) -> Result<(), bool> {
    let public = || state.public.lock().unwrap().contains(&request.path);
    match request.headers.get("authorization") {
        None => {
            state.unsigned.fetch_add(1, Ordering::SeqCst);
            if public() {
                return Ok(());
            }
            Err(s3_reply(out, 401, "AccessDenied", "Anonymous caller does not have access"))
        }
        Some(given) => {
            state.signed.fetch_add(1, Ordering::SeqCst);
            if *given == format!("Bearer {token}") {
                return Ok(());
            }
            Err(s3_reply(out, 401, "AuthenticationRequired", "Invalid Credentials"))
        }
    }
}

/// The object a request names, or the error response it gets (already sent: `Err(keep_open)`).
fn lookup(out: &mut TcpStream, state: &State, request: &Request) -> Result<Arc<Vec<u8>>, bool> {
    authorize(out, state, request)?;
    match state.objects.lock().unwrap().get(&request.path) {
        Some(bytes) => Ok(Arc::clone(bytes)),
        None if state.buckets() => {
            Err(s3_reply(out, 404, "NoSuchKey", "The specified key does not exist."))
        }
        None => Err(respond(out, 404, &[], b"not found")),
    }
}

/// An S3 error: `status` with the XML body naming `code`.
fn s3_reply(out: &mut TcpStream, status: u16, code: &str, message: &str) -> bool {
    let body = s3_error(code, message);
    respond(out, status, &[("Content-Type", "application/xml".into())], &body)
}

fn s3_error(code: &str, message: &str) -> Vec<u8> {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message></Error>"
    )
    .into_bytes()
}

fn object_headers(len: u64) -> Vec<(&'static str, String)> {
    vec![
        ("ETag", "\"0123456789abcdef\"".to_owned()),
        ("Last-Modified", "Tue, 24 Nov 2026 12:00:00 GMT".to_owned()),
        ("Accept-Ranges", "bytes".to_owned()),
        ("Content-Length", len.to_string()),
    ]
}

/// `bytes=a-b` as `a..=b`, clipped to the object.
fn parse_range(header: &str, len: u64) -> Option<(u64, u64)> {
    let (a, b) = header.strip_prefix("bytes=")?.split_once('-')?;
    let start: u64 = a.parse().ok()?;
    let end: u64 = if b.is_empty() { len.checked_sub(1)? } else { b.parse().ok()? };
    (start <= end && start < len).then_some((start, end.min(len - 1)))
}

fn answer(out: &mut TcpStream, state: &State, request: &Request, head: bool) -> bool {
    let bytes = match lookup(out, state, request) {
        Ok(bytes) => bytes,
        Err(keep_open) => return keep_open,
    };
    let len = bytes.len() as u64;
    if head {
        return respond(out, 200, &object_headers(len), b"");
    }
    match request.headers.get("range").map(|r| parse_range(r, len)) {
        None => respond(out, 200, &object_headers(len), &bytes),
        Some(None) => respond(out, 416, &[("Content-Range", format!("bytes */{len}"))], b""),
        Some(Some((start, end))) => {
            let mut headers = object_headers(end - start + 1);
            headers.push(("Content-Range", format!("bytes {start}-{end}/{len}")));
            respond(out, 206, &headers, &bytes[start as usize..=end as usize])
        }
    }
}

fn misbehave(out: &mut TcpStream, state: &State, request: &Request, fault: Fault) -> bool {
    match fault {
        Fault::Status(status) => respond(out, status, &[], b""),
        Fault::Stall(wait) => {
            thread::sleep(wait);
            answer(out, state, request, false)
        }
        Fault::Garbage => {
            let _ = out.write_all(b"HTTP/1.1 2x0 NOPE\r\nContent-Length: banana\r\n\r\nzzz");
            false
        }
        Fault::IgnoreRange => {
            let Ok(bytes) = lookup(out, state, request) else { return false };
            respond(out, 200, &object_headers(bytes.len() as u64), &bytes)
        }
        Fault::Truncate | Fault::WrongRange => {
            let Ok(bytes) = lookup(out, state, request) else { return false };
            let len = bytes.len() as u64;
            let range = request.headers.get("range").and_then(|r| parse_range(r, len));
            let Some((start, end)) = range else { return respond(out, 500, &[], b"") };
            let mut headers = object_headers(end - start + 1);
            if let Fault::WrongRange = fault {
                let (s, e) =
                    if end + 1 < len { (start + 1, end + 1) } else { (start - 1, end - 1) };
                headers.push(("Content-Range", format!("bytes {s}-{e}/{len}")));
                return respond(out, 206, &headers, &bytes[s as usize..=e as usize]);
            }
            headers.push(("Content-Range", format!("bytes {start}-{end}/{len}")));
            let body = &bytes[start as usize..=end as usize];
            let _ = respond(out, 206, &headers, b"");
            let _ = out.write_all(&body[..body.len() / 2]);
            let _ = out.shutdown(std::net::Shutdown::Both);
            false
        }
    }
}

/// The S3 writes: a plain PUT, and a multipart upload's create, parts, complete and abort. The
/// puts and the complete take the next write fault, if one is queued; the create takes the
/// next create fault.
fn write(out: &mut TcpStream, state: &State, request: Request) -> bool {
    if let Err(keep_open) = authorize(out, state, &request) {
        return keep_open;
    }
    let upload_id = request.query.get("uploadId").cloned();
    match (request.method.as_str(), upload_id) {
        ("POST", None) if request.query.contains_key("uploads") => {
            let fault = state.create_faults.lock().unwrap().pop_front();
            with_fault(fault, out, |out| create_upload(out, state, &request))
        }
        ("DELETE", Some(id)) => abort_upload(out, state, &request, &id),
        ("DELETE", None) => {
            let found = state.objects.lock().unwrap().remove(&request.path).is_some();
            // S3 deletes what is not there without a word; GCS answers 404.
            if !found && state.gcs_token.is_some() {
                return s3_reply(out, 404, "NoSuchKey", "No such object.");
            }
            respond(out, 204, &[], b"")
        }
        ("POST", None) if request.query.contains_key("delete") => {
            delete_objects(out, state, &request)
        }
        ("PUT", Some(id)) => {
            state.part_puts.fetch_add(1, Ordering::SeqCst);
            let delay = *state.part_delay.lock().unwrap();
            thread::sleep(delay);
            faulted(out, state, |out| put_part(out, state, request, &id))
        }
        ("PUT", None) => {
            state.plain_puts.fetch_add(1, Ordering::SeqCst);
            faulted(out, state, |out| put_object(out, state, request))
        }
        ("POST", Some(id)) => faulted(out, state, |out| complete_upload(out, state, request, &id)),
        _ => s3_reply(out, 501, "NotImplemented", "This server does not implement that request."),
    }
}

/// Runs `handle` (which answers well) unless the next queued write fault says otherwise.
fn faulted(
    out: &mut TcpStream,
    state: &State,
    handle: impl FnOnce(&mut TcpStream) -> bool,
) -> bool {
    let fault = state.write_faults.lock().unwrap().pop_front();
    with_fault(fault, out, handle)
}

/// Runs `handle` (which answers well) as `fault`, if any, says.
fn with_fault(
    fault: Option<WriteFault>,
    out: &mut TcpStream,
    handle: impl FnOnce(&mut TcpStream) -> bool,
) -> bool {
    match fault {
        None => handle(out),
        Some(WriteFault::Stall(wait)) => {
            thread::sleep(wait);
            handle(out)
        }
        Some(WriteFault::Status(status)) => {
            let (code, message) = match status {
                503 => ("SlowDown", "Please reduce your request rate."),
                500 => ("InternalError", "We encountered an internal error. Please try again."),
                _ => ("InjectedFault", "A fault the test injected."),
            };
            s3_reply(out, status, code, message)
        }
        Some(WriteFault::Drop) => {
            let _ = out.shutdown(Shutdown::Both);
            false
        }
    }
}

fn put_object(out: &mut TcpStream, state: &State, request: Request) -> bool {
    let etag = content_etag(&request.body);
    state.objects.lock().unwrap().insert(request.path, Arc::new(request.body));
    respond(out, 200, &[("ETag", etag)], b"")
}

fn create_upload(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    let n = state.uploads_created.fetch_add(1, Ordering::SeqCst) + 1;
    let id = format!("gpumap-test-upload-{n:06}");
    let upload = Upload { path: request.path.clone(), parts: BTreeMap::new() };
    state.uploads.lock().unwrap().insert(id.clone(), upload);
    let inner = format!("{}<UploadId>{id}</UploadId>", bucket_and_key(&request.path));
    respond_xml(out, "InitiateMultipartUploadResult", &inner)
}

fn abort_upload(out: &mut TcpStream, state: &State, request: &Request, id: &str) -> bool {
    let known = {
        let mut uploads = state.uploads.lock().unwrap();
        let known = uploads.get(id).is_some_and(|upload| upload.path == request.path);
        if known {
            uploads.remove(id);
        }
        known
    };
    if !known {
        return no_such_upload(out);
    }
    state.aborts.fetch_add(1, Ordering::SeqCst);
    respond(out, 204, &[], b"")
}

fn put_part(out: &mut TcpStream, state: &State, request: Request, id: &str) -> bool {
    let number = request.query.get("partNumber").and_then(|n| n.parse::<u16>().ok());
    let Some(number) = number.filter(|n| (1..=10_000).contains(n)) else {
        let message = "Part number must be an integer between 1 and 10000, inclusive";
        return s3_reply(out, 400, "InvalidArgument", message);
    };
    let etag = content_etag(&request.body);
    let stored = {
        let mut uploads = state.uploads.lock().unwrap();
        let upload = uploads.get_mut(id).filter(|upload| upload.path == request.path);
        let part = Part { etag: etag.clone(), bytes: request.body };
        upload.map(|upload| upload.parts.insert(number, part)).is_some()
    };
    if !stored {
        return no_such_upload(out);
    }
    respond(out, 200, &[("ETag", etag)], b"")
}

fn complete_upload(out: &mut TcpStream, state: &State, request: Request, id: &str) -> bool {
    let Some(listed) = listed_parts(&String::from_utf8_lossy(&request.body)) else {
        let message = "The XML you provided was not well-formed or did not validate against \
                       our published schema";
        return s3_reply(out, 400, "MalformedXML", message);
    };
    let assembled = {
        let mut uploads = state.uploads.lock().unwrap();
        match uploads.get(id).filter(|upload| upload.path == request.path) {
            None => None,
            Some(upload) => {
                let assembled = assemble(upload, &listed);
                if assembled.is_ok() {
                    uploads.remove(id);
                }
                Some(assembled)
            }
        }
    };
    let bytes = match assembled {
        None => return no_such_upload(out),
        Some(Err((code, message))) => return s3_reply(out, 400, code, message),
        Some(Ok(bytes)) => bytes,
    };
    let etags: String = listed.iter().map(|(_, etag)| etag.as_str()).collect();
    let etag = content_etag(etags.as_bytes());
    let etag = format!("{}-{}\"", etag.trim_end_matches('"'), listed.len());
    let inner = format!("{}<ETag>{}</ETag>", bucket_and_key(&request.path), xml_escape(&etag));
    state.objects.lock().unwrap().insert(request.path, Arc::new(bytes));
    state.completes.fetch_add(1, Ordering::SeqCst);
    respond_xml(out, "CompleteMultipartUploadResult", &inner)
}

/// AWS's rules for a completion: part numbers ascend, each listed part was uploaded with the
/// ETag given, and every part but the last is at least 5 MiB. `Ok`: the object's bytes.
fn assemble(
    upload: &Upload,
    listed: &[(u16, String)],
) -> Result<Vec<u8>, (&'static str, &'static str)> {
    if listed.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
        return Err((
            "InvalidPartOrder",
            "The list of parts was not in ascending order. The parts list must be specified in \
             order by part number.",
        ));
    }
    let mut bytes = Vec::new();
    for (i, (number, etag)) in listed.iter().enumerate() {
        let part = upload.parts.get(number).filter(|part| unquote(&part.etag) == unquote(etag));
        let Some(part) = part else {
            return Err((
                "InvalidPart",
                "One or more of the specified parts could not be found. The part may not have \
                 been uploaded, or the specified entity tag may not match the part's entity tag.",
            ));
        };
        if i + 1 < listed.len() && part.bytes.len() < MIN_PART {
            return Err((
                "EntityTooSmall",
                "Your proposed upload is smaller than the minimum allowed object size.",
            ));
        }
        bytes.extend_from_slice(&part.bytes);
    }
    Ok(bytes)
}

/// The `(PartNumber, ETag)` of each `<Part>` of a `CompleteMultipartUpload` body, in order
/// (other elements, such as checksums, are ignored); `None`: malformed, or no part at all.
fn listed_parts(xml: &str) -> Option<Vec<(u16, String)>> {
    let mut parts = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<Part>") {
        let (part, after) = rest[start + "<Part>".len()..].split_once("</Part>")?;
        let number = element(part, "PartNumber")?.trim().parse().ok()?;
        parts.push((number, xml_unescape(element(part, "ETag")?.trim())));
        rest = after;
    }
    (!parts.is_empty()).then_some(parts)
}

/// The text of the first `<name>` element in `xml`.
fn element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let (_, after) = xml.split_once(&format!("<{name}>"))?;
    Some(after.split_once(&format!("</{name}>"))?.0)
}

fn unquote(etag: &str) -> &str {
    etag.trim_matches('"')
}

fn xml_escape(text: &str) -> String {
    let text = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    text.replace('"', "&quot;").replace('\'', "&apos;")
}

fn xml_unescape(text: &str) -> String {
    let text = text.replace("&quot;", "\"").replace("&apos;", "'").replace("&#34;", "\"");
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

/// `<Bucket>..</Bucket><Key>..</Key>` for a path-style `/bucket/key`.
fn bucket_and_key(path: &str) -> String {
    let (bucket, key) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
    format!("<Bucket>{}</Bucket><Key>{}</Key>", xml_escape(bucket), xml_escape(key))
}

fn respond_xml(out: &mut TcpStream, root: &str, inner: &str) -> bool {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <{root} xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">{inner}</{root}>"
    );
    respond(out, 200, &[("Content-Type", "application/xml".into())], body.as_bytes())
}

fn no_such_upload(out: &mut TcpStream) -> bool {
    let message = "The specified upload does not exist. The upload ID may be invalid, or the \
                   upload may have been aborted or completed.";
    s3_reply(out, 404, "NoSuchUpload", message)
}

/// A quoted ETag that tells contents apart, as S3's MD5 does (a 64-bit mix of the bytes, a
/// word at a time so that tens of MiB hash quickly in a debug build, and the length).
fn content_etag(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for word in words.by_ref() {
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        hash = (hash ^ word).wrapping_mul(0x0100_0000_01b3).rotate_left(23);
    }
    for &byte in words.remainder() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3).rotate_left(23);
    }
    format!("\"{hash:016x}{:016x}\"", bytes.len())
}

/// ListObjectsV2 of `/bucket`: the keys under `prefix` after `start-after` and the continuation
/// token, in order, with `delimiter` grouping what lies below the next `/` into common prefixes;
/// a page holds at most the page size of entries. Takes the next GET fault (status, stall or a
/// dropped connection), so that a listing's retries can be seen.
fn list(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    state.lists.fetch_add(1, Ordering::SeqCst);
    if let Err(keep_open) = authorize(out, state, request) {
        return keep_open;
    }
    match state.faults.lock().unwrap().pop_front() {
        None => {}
        Some(Fault::Status(status)) => return respond(out, status, &[], b""),
        Some(Fault::Stall(wait)) => thread::sleep(wait),
        Some(_) => {
            let _ = out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n<List");
            return false;
        }
    }
    let bucket = request.path.trim_start_matches('/').trim_end_matches('/').to_owned();
    let query = |name: &str| request.query.get(name).cloned().unwrap_or_default();
    let (prefix, delimiter) = (query("prefix"), query("delimiter"));
    let after = query("continuation-token").max(query("start-after")).max(query("marker"));
    // Azure's `startFrom` is the first key listed: everything after the key just before it.
    let after = match request.query.get("startFrom") {
        Some(from) => after.max(before(from)),
        None => after,
    };
    let page = match state.list_page.load(Ordering::SeqCst) {
        0 => 1000,
        n => n,
    };
    let mut keys: Vec<(String, usize)> = state
        .objects
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(path, bytes)| {
            let key = path.strip_prefix(&format!("/{bucket}/"))?;
            Some((key.to_owned(), bytes.len()))
        })
        .filter(|(key, _)| key.starts_with(&prefix) && *key > after)
        .collect();
    keys.sort();
    let (mut contents, mut prefixes, mut entries, mut last) = (String::new(), Vec::new(), 0, None);
    let mut truncated = false;
    for (key, len) in keys {
        let below = key[prefix.len()..].find(delimiter.as_str()).filter(|_| !delimiter.is_empty());
        if let Some(at) = below {
            let common = key[..prefix.len() + at + delimiter.len()].to_owned();
            if prefixes.last() == Some(&common) {
                continue;
            }
            if entries == page {
                truncated = true;
                break;
            }
            prefixes.push(common.clone());
            // The next page starts after every key below this prefix.
            last = Some(format!("{common}\u{10FFFF}"));
        } else {
            if entries == page {
                truncated = true;
                break;
            }
            contents.push_str(&if state.azure_token.is_some() {
                format!(
                    "<Blob><Name>{}</Name><Properties><Last-Modified>Tue, 24 Nov 2026 12:00:00 \
                     GMT</Last-Modified><Etag>0x8DC0123456789AB</Etag><Content-Length>{len}\
                     </Content-Length><Content-Type>application/octet-stream</Content-Type>\
                     <BlobType>BlockBlob</BlobType></Properties></Blob>",
                    xml_escape(&key)
                )
            } else {
                format!(
                    "<Contents><Key>{}</Key><LastModified>2026-11-24T12:00:00.000Z</LastModified>\
                     <ETag>\"0123456789abcdef\"</ETag><Size>{len}</Size>\
                     <StorageClass>STANDARD</StorageClass></Contents>",
                    xml_escape(&key)
                )
            });
            last = Some(key);
        }
        entries += 1;
    }
    if state.azure_token.is_some() {
        let next = if truncated { last } else { None };
        return azure_listing(out, &prefix, &contents, &prefixes, next);
    }
    let mut inner = format!(
        "<Name>{bucket}</Name><Prefix>{}</Prefix><KeyCount>{entries}</KeyCount>\
         <MaxKeys>{page}</MaxKeys><IsTruncated>{truncated}</IsTruncated>{contents}",
        xml_escape(&prefix)
    );
    for common in prefixes {
        inner.push_str(&format!(
            "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
            xml_escape(&common)
        ));
    }
    if let (true, Some(last)) = (truncated, last) {
        inner.push_str(&format!(
            "<NextContinuationToken>{}</NextContinuationToken>",
            xml_escape(&last)
        ));
    }
    respond_xml(out, "ListBucketResult", &inner)
}

/// The greatest key before `key` in the listing's order, as near as a test needs: `key` less
/// its last character where that is the smallest there is, else `key` with its last character
/// one less and the largest after it.
fn before(key: &str) -> String {
    let mut chars: Vec<char> = key.chars().collect();
    match chars.pop() {
        None => String::new(),
        Some('\0') => chars.into_iter().collect(),
        Some(last) => {
            let lower = char::from_u32(u32::from(last) - 1).unwrap_or('\0');
            chars.into_iter().chain([lower, '\u{10FFFF}']).collect()
        }
    }
}

/// DeleteObjects (`POST /bucket?delete`): every `<Key>` of the body removed, each reported
/// deleted (S3 reports a missing key deleted too).
fn delete_objects(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    let bucket = request.path.trim_start_matches('/').trim_end_matches('/').to_owned();
    let body = String::from_utf8_lossy(&request.body).into_owned();
    let mut deleted = String::new();
    let mut objects = state.objects.lock().unwrap();
    for piece in body.split("<Key>").skip(1) {
        let Some((key, _)) = piece.split_once("</Key>") else { continue };
        let key = xml_unescape(key);
        objects.remove(&format!("/{bucket}/{key}"));
        deleted.push_str(&format!("<Deleted><Key>{}</Key></Deleted>", xml_escape(&key)));
    }
    drop(objects);
    respond_xml(out, "DeleteResult", &deleted)
}

/// WebHDFS: `GETFILESTATUS` answers the file's JSON status (counted as a HEAD; a 404 with a
/// RemoteException for a missing file); `OPEN` at the "namenode" redirects to the same path
/// with `datanode=true`, where it is served as the ranged GET of `offset` and `length` would be
/// (faults, delays and counts included; the body with a 200, as a datanode sends it).
fn webhdfs(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    let op = request.query.get("op").map(String::as_str).unwrap_or_default();
    match op {
        "GETFILESTATUS" => {
            state.heads.fetch_add(1, Ordering::SeqCst);
            let Some(bytes) = state.objects.lock().unwrap().get(&request.path).cloned() else {
                let body = "{\"RemoteException\":{\"exception\":\"FileNotFoundException\",\
                            \"message\":\"File does not exist\"}}";
                return respond(
                    out,
                    404,
                    &[("Content-Type", "application/json".into())],
                    body.as_bytes(),
                );
            };
            let padding = " ".repeat(state.status_padding.load(Ordering::SeqCst));
            let body = format!(
                "{{\"FileStatus\":{{\"length\":{},\"type\":\"FILE\",\"blockSize\":134217728,\
                 \"owner\":\"gpumap\",\"pathSuffix\":\"\",\"permission\":\"644\"}}}}{padding}",
                bytes.len()
            );
            respond(out, 200, &[("Content-Type", "application/json".into())], body.as_bytes())
        }
        "OPEN" if !request.query.contains_key("datanode") => {
            let mut query: Vec<String> =
                request.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            query.push("datanode=true".into());
            let location = format!("{}?{}", request.path, query.join("&"));
            respond(out, 307, &[("Location", location)], b"")
        }
        "OPEN" => {
            let number = |name: &str| request.query.get(name).and_then(|v| v.parse::<u64>().ok());
            let (Some(offset), Some(length)) = (number("offset"), number("length")) else {
                return respond(out, 400, &[], b"offset and length wanted");
            };
            let mut ranged = Request {
                method: "GET".into(),
                path: request.path.clone(),
                query: HashMap::new(),
                headers: request.headers.clone(),
                body: Vec::new(),
            };
            if length > 0 {
                ranged
                    .headers
                    .insert("range".into(), format!("bytes={offset}-{}", offset + length - 1));
            }
            plain_get(out, state, &ranged)
        }
        _ => respond(out, 400, &[], b"unsupported op"),
    }
}

impl State {
    /// Whether objects live in buckets (S3, GCS, Azure modes), with their errors and writes.
    fn buckets(&self) -> bool {
        self.s3_key_id.is_some() || self.gcs_token.is_some() || self.azure_token.is_some()
    }
}

/// In Azure mode, refuses (403) a request with another token, and (409, Azure's answer where
/// the account allows no anonymous access) an unsigned one, unless it reads a public object
/// or lists a public container.
fn authorize_azure(
    out: &mut TcpStream,
    state: &State,
    request: &Request,
    token: &str,
) -> Result<(), bool> {
    match request.headers.get("authorization") {
        None => {
            state.unsigned.fetch_add(1, Ordering::SeqCst);
            let read = matches!(request.method.as_str(), "GET" | "HEAD");
            if read && state.public.lock().unwrap().contains(request.path.trim_end_matches('/')) {
                return Ok(());
            }
            let message = "Public access is not permitted on this storage account.";
            Err(s3_reply(out, 409, "PublicAccessNotPermitted", message))
        }
        Some(given) => {
            state.signed.fetch_add(1, Ordering::SeqCst);
            if *given == format!("Bearer {token}") {
                return Ok(());
            }
            let message = "Server failed to authenticate the request.";
            Err(s3_reply(out, 403, "AuthenticationFailed", message))
        }
    }
}

/// A List Blobs page: `contents` (its `<Blob>` elements), the common prefixes, and the marker
/// of the next page.
fn azure_listing(
    out: &mut TcpStream,
    prefix: &str,
    contents: &str,
    prefixes: &[String],
    next: Option<String>,
) -> bool {
    let levels: String = prefixes
        .iter()
        .map(|p| format!("<BlobPrefix><Name>{}</Name></BlobPrefix>", xml_escape(p)))
        .collect();
    let marker = next.map(|n| xml_escape(&n)).unwrap_or_default();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<EnumerationResults \
         ServiceEndpoint=\"http://127.0.0.1/\"><Prefix>{}</Prefix><Blobs>{contents}{levels}\
         </Blobs><NextMarker>{marker}</NextMarker></EnumerationResults>",
        xml_escape(prefix)
    );
    respond(out, 200, &[("Content-Type", "application/xml".into())], body.as_bytes())
}

/// Azure's writes: a block blob put whole, a block put, a block list committed, and a batch of
/// deletes. Blocks are kept, per blob, until a list commits them, as Azure keeps uncommitted
/// blocks. Block puts, commits and whole puts take the write faults, as S3's writes do.
fn azure_write(out: &mut TcpStream, state: &State, request: Request) -> bool {
    if let Err(keep_open) = authorize(out, state, &request) {
        return keep_open;
    }
    let comp = request.query.get("comp").cloned().unwrap_or_default();
    match (request.method.as_str(), comp.as_str()) {
        ("PUT", "block") => {
            state.part_puts.fetch_add(1, Ordering::SeqCst);
            let delay = *state.part_delay.lock().unwrap();
            thread::sleep(delay);
            faulted(out, state, |out| {
                let id = request.query.get("blockid").cloned().unwrap_or_default();
                state.blocks.lock().unwrap().insert((request.path.clone(), id), request.body);
                respond(out, 201, &[], b"")
            })
        }
        ("PUT", "blocklist") => faulted(out, state, |out| commit_blocks(out, state, request)),
        ("PUT", "") => {
            state.plain_puts.fetch_add(1, Ordering::SeqCst);
            faulted(out, state, |out| {
                let headers = azure_put_headers(&request.body);
                state.objects.lock().unwrap().insert(request.path, Arc::new(request.body));
                respond(out, 201, &headers, b"")
            })
        }
        ("POST", "batch") => batch_delete(out, state, &request),
        _ => s3_reply(out, 501, "NotImplemented", "This server does not implement that request."),
    }
}

/// The headers of a put's answer: the new blob's ETag and time.
fn azure_put_headers(bytes: &[u8]) -> Vec<(&'static str, String)> {
    vec![
        ("ETag", content_etag(bytes)),
        ("Last-Modified", "Tue, 24 Nov 2026 12:00:00 GMT".to_owned()),
    ]
}

/// The block ids a Put Block List body names, in its order, whichever list each is taken from.
fn listed_blocks(xml: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let Some(tag) =
            ["Uncommitted>", "Latest>", "Committed>"].iter().find(|t| rest.starts_with(**t))
        else {
            continue;
        };
        let close = format!("</{tag}");
        let Some((id, after)) = rest[tag.len()..].split_once(&close) else { break };
        ids.push(xml_unescape(id.trim()));
        rest = after;
    }
    ids
}

/// Put Block List: the blob becomes the listed blocks in order (each must have been put for
/// this blob), and the blob's uncommitted blocks are dropped.
fn commit_blocks(out: &mut TcpStream, state: &State, request: Request) -> bool {
    let ids = listed_blocks(&String::from_utf8_lossy(&request.body));
    let mut blocks = state.blocks.lock().unwrap();
    let mut bytes = Vec::new();
    for id in &ids {
        let Some(block) = blocks.get(&(request.path.clone(), id.clone())) else {
            drop(blocks);
            return s3_reply(out, 400, "InvalidBlockList", "The specified block list is invalid.");
        };
        bytes.extend_from_slice(block);
    }
    blocks.retain(|(path, _), _| *path != request.path);
    drop(blocks);
    state.completes.fetch_add(1, Ordering::SeqCst);
    let headers = azure_put_headers(&bytes);
    state.objects.lock().unwrap().insert(request.path, Arc::new(bytes));
    respond(out, 201, &headers, b"")
}

/// Blob Batch of deletes (`POST /container?restype=container&comp=batch`, a multipart/mixed
/// body of `DELETE /container/blob` subrequests): each blob removed, and each answered in a
/// multipart/mixed reply under its Content-ID (202, or 404 for a blob that is not there).
fn batch_delete(out: &mut TcpStream, state: &State, request: &Request) -> bool {
    let body = String::from_utf8_lossy(&request.body).into_owned();
    let asked = request.headers.get("content-type").and_then(|t| t.split_once("boundary="));
    let Some((_, asked)) = asked else {
        return s3_reply(out, 400, "InvalidInput", "A batch is a multipart/mixed body.");
    };
    let boundary = "batchresponse_gpumap";
    let mut reply = String::new();
    for part in body.split(&format!("--{asked}")).skip(1) {
        let id = part.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-id").then(|| value.trim().to_owned())
        });
        let target = part.lines().find_map(|line| line.strip_prefix("DELETE "));
        let (Some(id), Some(target)) = (id, target) else { continue };
        let target = target.split_whitespace().next().unwrap_or_default();
        let path = percent_decode(target.split_once('?').map_or(target, |(path, _)| path));
        let found = state.objects.lock().unwrap().remove(&path).is_some();
        let status = if found {
            "202 Accepted\r\nx-ms-delete-type-permanent: true"
        } else {
            "404 The specified blob does not exist.\r\nx-ms-error-code: BlobNotFound"
        };
        reply.push_str(&format!(
            "--{boundary}\r\nContent-Type: application/http\r\nContent-ID: {id}\r\n\r\n\
             HTTP/1.1 {status}\r\n\r\n"
        ));
    }
    reply.push_str(&format!("--{boundary}--\r\n"));
    let content_type = format!("multipart/mixed; boundary={boundary}");
    respond(out, 202, &[("Content-Type", content_type)], reply.as_bytes())
}
