//! A tiny HTTP/1.1 range server on 127.0.0.1, for the remote tests: GET and HEAD with `Range`,
//! keep-alive, a thread per connection, and faults injected into the next GETs (statuses,
//! stalls, bodies cut short, wrong ranges, garbage). In S3 mode it serves path-style
//! `/bucket/key`, answers S3's XML errors, and refuses requests not signed with the expected
//! access key id (it does not verify signatures: object_store's signing is not under test).

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

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

#[derive(Default)]
struct State {
    objects: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    faults: Mutex<VecDeque<Fault>>,
    /// The access key id S3 mode requires in `Authorization`; `None`: plain HTTP mode.
    s3_key_id: Option<String>,
    /// Every GET waits this long, so that concurrency can be seen.
    get_delay: Mutex<Duration>,
    heads: AtomicUsize,
    gets: AtomicUsize,
    active_gets: AtomicUsize,
    max_active_gets: AtomicUsize,
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

    fn start(s3_key_id: Option<String>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State { s3_key_id, ..State::default() });
        let shared = Arc::clone(&state);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let state = Arc::clone(&shared);
                // A dropped Server leaves the accept loop blocked; tests are short-lived.
                thread::spawn(move || serve(stream, &state));
            }
        });
        Server { addr, state }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves `bytes` at `path` (`/dir/file`, or `/bucket/key` in S3 mode).
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.state.objects.lock().unwrap().insert(path.to_owned(), Arc::new(bytes));
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
    pub fn max_active_gets(&self) -> usize {
        self.state.max_active_gets.load(Ordering::SeqCst)
    }
}

struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?;
    let path = target.split('?').next()?.to_owned();
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
    if let Some(n) = headers.get("content-length").and_then(|v| v.parse::<u64>().ok()) {
        std::io::copy(&mut reader.by_ref().take(n), &mut std::io::sink()).ok()?;
    }
    Some(Request { method, path: percent_decode(&path), headers })
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
    while let Some(request) = read_request(&mut reader) {
        let keep_open = match request.method.as_str() {
            "HEAD" => {
                state.heads.fetch_add(1, Ordering::SeqCst);
                answer(&mut writer, state, &request, true)
            }
            "GET" => {
                state.gets.fetch_add(1, Ordering::SeqCst);
                let now = state.active_gets.fetch_add(1, Ordering::SeqCst) + 1;
                state.max_active_gets.fetch_max(now, Ordering::SeqCst);
                let delay = *state.get_delay.lock().unwrap();
                thread::sleep(delay);
                let fault = state.faults.lock().unwrap().pop_front();
                let keep = match fault {
                    None => answer(&mut writer, state, &request, false),
                    Some(fault) => misbehave(&mut writer, state, &request, fault),
                };
                state.active_gets.fetch_sub(1, Ordering::SeqCst);
                keep
            }
            _ => respond(&mut writer, 405, &[], b""),
        };
        if !keep_open {
            return;
        }
    }
}

fn respond(out: &mut TcpStream, status: u16, headers: &[(&str, String)], body: &[u8]) -> bool {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-length")) {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes()).is_ok() && out.write_all(body).is_ok()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// The object a request names, or the error response it gets (already sent: `Err(keep_open)`).
fn lookup(out: &mut TcpStream, state: &State, request: &Request) -> Result<Arc<Vec<u8>>, bool> {
    if let Some(key_id) = &state.s3_key_id {
        let signed = request
            .headers
            .get("authorization")
            .is_some_and(|a| a.contains(&format!("Credential={key_id}/")));
        if !signed {
            let body = s3_error("InvalidAccessKeyId", "The AWS Access Key Id does not exist");
            return Err(respond(out, 403, &[("Content-Type", "application/xml".into())], &body));
        }
    }
    match state.objects.lock().unwrap().get(&request.path) {
        Some(bytes) => Ok(Arc::clone(bytes)),
        None if state.s3_key_id.is_some() => {
            let body = s3_error("NoSuchKey", "The specified key does not exist.");
            Err(respond(out, 404, &[("Content-Type", "application/xml".into())], &body))
        }
        None => Err(respond(out, 404, &[], b"not found")),
    }
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
