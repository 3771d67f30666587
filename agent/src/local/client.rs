//! The agent's socket from the other side: `credwatch alerts`, `show`, `notify` and `selftest`.

use std::{
    io::{self, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use credwatch_core::{alert::Alert, output::escape};

use super::{
    log::{self, LogError},
    protocol::{self, AlertsRequest, LineError, Logged, Reply, Request, SelftestRequest},
};

pub const DEFAULT_SOCKET: &str = "/run/credwatch/alerts.sock";
pub const DEFAULT_LOG: &str = "/var/lib/credwatch/alerts.jsonl";

/// How long a one-shot exchange (history, a self-test registration) waits for each line.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// What the agent sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Alert {
        seq: u64,
        alert: Box<Alert>,
    },
    /// The history is sent: `last_seq` is the last seq the agent wrote, seen or not.
    CaughtUp {
        last_seq: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no credwatch agent at {} (is `credwatch watch` running?)", shown(.socket))]
    NoAgent {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the agent's socket {}: {what}", shown(.socket))]
    Io {
        socket: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the agent's socket {}: nothing came within {timeout:?}", shown(.socket))]
    Timeout { socket: PathBuf, timeout: Duration },
    #[error("the agent's socket {}: the agent refused: {}", shown(.socket), escape(.why))]
    Refused { socket: PathBuf, why: String },
    #[error("the agent's socket {}: {why}", shown(.socket))]
    Protocol { socket: PathBuf, why: String },
    #[error(transparent)]
    Log(#[from] LogError),
}

fn shown(path: &Path) -> String {
    escape(&path.display().to_string()).into_owned()
}

/// A connection that receives alerts.
pub struct AlertStream {
    socket: PathBuf,
    reader: BufReader<UnixStream>,
    /// A line read in part before a timeout.
    pending: Vec<u8>,
}

impl AlertStream {
    /// Asks for the logged alerts after `since` (none when `None`), then with `follow` each new
    /// one. Errors: no agent there (ENOENT/ECONNREFUSED: [`ClientError::NoAgent`]), or any other.
    pub fn connect(socket: &Path, since: Option<u64>, follow: bool) -> Result<AlertStream, ClientError> {
        let stream = send(socket, &Request::Alerts(AlertsRequest { since, follow }))?;
        Ok(AlertStream { socket: socket.to_owned(), reader: BufReader::new(stream), pending: Vec::new() })
    }

    /// The next message; `Ok(None)` when the agent closed; [`ClientError::Timeout`] when nothing
    /// whole came within `timeout` (then call again: nothing is lost).
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<Message>, ClientError> {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        loop {
            let left = match deadline {
                Some(deadline) => {
                    match deadline.checked_duration_since(Instant::now()).filter(|left| !left.is_zero()) {
                        Some(left) => Some(left),
                        None => return Err(self.timeout(timeout)),
                    }
                }
                None => None,
            };
            self.reader.get_ref().set_read_timeout(left).map_err(|source| self.io("setting a timeout", source))?;
            return match protocol::read_line(&mut self.reader, &mut self.pending) {
                Ok(Some(line)) => parse_message(&self.socket, &line).map(Some),
                Ok(None) => Ok(None),
                Err(LineError::Io(error))
                    if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    continue;
                }
                Err(LineError::Io(error)) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(LineError::Io(error)) => Err(self.io("reading", error)),
                Err(error) => Err(ClientError::Protocol { socket: self.socket.clone(), why: error.to_string() }),
            };
        }
    }

    fn timeout(&self, timeout: Option<Duration>) -> ClientError {
        ClientError::Timeout { socket: self.socket.clone(), timeout: timeout.unwrap_or_default() }
    }

    fn io(&self, what: &'static str, source: io::Error) -> ClientError {
        ClientError::Io { socket: self.socket.clone(), what, source }
    }
}

/// Connects and sends the request line.
fn send(socket: &Path, request: &Request) -> Result<UnixStream, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ClientError::NoAgent { socket: socket.to_owned(), source }
        }
        _ => ClientError::Io { socket: socket.to_owned(), what: "connecting", source },
    })?;
    let mut line = serde_json::to_string(request).expect("a request serialises");
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(|source| ClientError::Io {
        socket: socket.to_owned(),
        what: "sending the request",
        source,
    })?;
    Ok(stream)
}

fn parse_message(socket: &Path, line: &[u8]) -> Result<Message, ClientError> {
    let bad = |why: String| ClientError::Protocol { socket: socket.to_owned(), why };
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|error| bad(format!("a line that is no JSON: {error}")))?;
    if value.get("seq").is_some() {
        let logged: Logged =
            serde_json::from_value(value).map_err(|error| bad(format!("an alert line that is no alert: {error}")))?;
        return Ok(Message::Alert { seq: logged.seq, alert: Box::new(logged.alert) });
    }
    match serde_json::from_value::<Reply>(value) {
        Ok(Reply::CaughtUp { last_seq }) => Ok(Message::CaughtUp { last_seq }),
        Ok(Reply::Error(why)) => Err(ClientError::Refused { socket: socket.to_owned(), why }),
        Ok(Reply::Selftest { .. }) => Err(bad("an unasked self-test reply".into())),
        Err(error) => Err(bad(format!("an unknown line: {error}"))),
    }
}

/// Marks the process tree whose root is `pid` as a self-test for the agent: its alerts carry
/// `credwatch.selftest: true` until that process exits.
pub fn register_selftest(socket: &Path, pid: u32) -> Result<(), ClientError> {
    let stream = send(socket, &Request::Selftest(SelftestRequest { pid }))?;
    let io = |what, source| ClientError::Io { socket: socket.to_owned(), what, source };
    stream.set_read_timeout(Some(ANSWER_WITHIN)).map_err(|source| io("setting a timeout", source))?;
    let mut reader = BufReader::new(stream);
    let bad = |why: String| ClientError::Protocol { socket: socket.to_owned(), why };
    let line = match protocol::read_line(&mut reader, &mut Vec::new()) {
        Ok(Some(line)) => line,
        Ok(None) => return Err(bad("the agent closed without an answer".into())),
        Err(LineError::Io(error)) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
            return Err(ClientError::Timeout { socket: socket.to_owned(), timeout: ANSWER_WITHIN })
        }
        Err(LineError::Io(error)) => return Err(io("reading", error)),
        Err(error) => return Err(bad(error.to_string())),
    };
    match serde_json::from_slice::<Reply>(&line) {
        Ok(Reply::Selftest { ok: true }) => Ok(()),
        Ok(Reply::Error(why)) => Err(ClientError::Refused { socket: socket.to_owned(), why }),
        _ => Err(bad(format!("an unexpected answer: {}", escape(&String::from_utf8_lossy(&line))))),
    }
}

/// The logged alerts the caller can read: the log file directly when readable (root), else
/// through the socket (`since: 0, follow: false`). Oldest first. Lines skipped in the file (torn
/// by a crash) are logged as warnings.
pub fn logged_alerts(socket: &Path, log: &Path) -> Result<Vec<(u64, Alert)>, ClientError> {
    let direct = std::fs::File::open(log).is_ok() || std::fs::File::open(log::rotated(log)).is_ok();
    if !direct {
        return logged_by_agent(socket);
    }
    let logged = log::read(log, 0, &mut |why| tracing::warn!("{why}"))?;
    Ok(logged.into_iter().map(|logged| (logged.seq, logged.alert)).collect())
}

/// The logged alerts the agent at `socket` gives the caller (`since: 0, follow: false`), oldest
/// first: for a client of another agent than the log's (`notify --alerts-socket`).
pub fn logged_by_agent(socket: &Path) -> Result<Vec<(u64, Alert)>, ClientError> {
    let mut stream = AlertStream::connect(socket, Some(0), false)?;
    let mut logged = Vec::new();
    while let Some(Message::Alert { seq, alert }) = stream.next(Some(ANSWER_WITHIN))? {
        logged.push((seq, *alert));
    }
    Ok(logged)
}
