//! The loopback stand-in for everything the attacks reach over the network (GitHub's API, the
//! npm registry, the Bun and TruffleHog downloads): an HTTP listener on 127.0.0.1, port 0, that
//! answers each request with what the payload expects and notes it.

use std::{
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::attacks::{BUN_STAND_IN, TRUFFLEHOG_STAND_IN};

/// A request the stub answered.
#[derive(Clone, Debug, Serialize)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The body's length: the upload's size.
    pub bytes: usize,
}

pub struct Stub {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    serving: Option<JoinHandle<()>>,
}

/// A request head or body larger than this is cut off (the payloads send a few kB).
const MOST: u64 = 16 << 20;

impl Stub {
    pub fn start() -> Result<Stub> {
        let listener = TcpListener::bind("127.0.0.1:0").context("listening on 127.0.0.1 for the self-test's stub")?;
        listener.set_nonblocking(true).context("the stub's listener")?;
        let addr = listener.local_addr().context("the stub's address")?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let serving = {
            let (requests, stop) = (Arc::clone(&requests), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if let Ok(request) = answer(stream) {
                                requests.lock().expect("the stub's list").push(request);
                            }
                        }
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Ok(Stub { addr, requests, stop, serving: Some(serving) })
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("the stub's list").clone()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(serving) = self.serving.take() {
            let _ = serving.join();
        }
    }
}

/// Reads one request and answers it; one request a connection (`Connection: close`).
fn answer(stream: TcpStream) -> io::Result<Request> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MOST));
    let mut head = String::new();
    reader.read_line(&mut head)?;
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let path = words.next().unwrap_or_default().to_owned();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = Vec::new();
    reader.take(length.min(MOST)).read_to_end(&mut body)?;
    let (status, reply): (&str, &[u8]) = match (method.as_str(), path.as_str()) {
        ("GET", p) if p.contains("/bun-") => ("200 OK", BUN_STAND_IN.as_bytes()),
        ("GET", p) if p.contains("trufflehog") => ("200 OK", TRUFFLEHOG_STAND_IN.as_bytes()),
        ("GET", "/-/whoami") => ("200 OK", br#"{"username":"credwatch-selftest"}"#),
        ("POST", "/user/repos") => ("201 Created", br#"{"owner":{"login":"credwatch-selftest"}}"#),
        ("PUT", _) => ("201 Created", b"{}"),
        _ => ("404 Not Found", b"{}"),
    };
    let mut stream = stream;
    write!(stream, "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", reply.len())?;
    stream.write_all(reply)?;
    Ok(Request { method, path, bytes: body.len() })
}
