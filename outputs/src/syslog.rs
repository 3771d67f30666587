//! The syslog output: each alert as one RFC 5424 message (or RFC 3164, as an option) to a local
//! datagram socket (`/dev/log`-style), over UDP (one datagram per alert), over TCP
//! (octet-counting framing, RFC 6587) or over RELP (rsyslog's protocol with acknowledgements,
//! see [`crate::relp`]).
//!
//! The message: `<PRI>1 TIMESTAMP HOST credwatch PID RULE-ID [credwatch@32473 id=".." rule=".."
//! severity=".." ...] [HIGH] npm package x@1.0.0 (postinstall) opened /home/u/.ssh/id_ed25519`.
//! - PRI: the facility (default `authpriv`: the alerts name credential files, and Debian's and
//!   Red Hat's rsyslog keep authpriv in a file only root and `adm` read) and the alert's
//!   severity: critical → crit (2), high → err (3), medium → warning (4), low → notice (5).
//! - TIMESTAMP: the event's time, in UTC with microseconds (RFC 5424 allows at most six digits).
//! - The structured data carries the fields a receiver filters on, values as in the alert. Its
//!   SD-ID uses 32473, the private enterprise number RFC 5612 reserves for documentation:
//!   credwatch has none registered.
//! - MSG: the alert's one-line summary, as on the terminal (escaped: always one line). Plain
//!   UTF-8 without the BOM RFC 5424 suggests: rsyslog keeps the BOM in the message text.
//!
//! Size: a message longer than the cap loses the end of its MSG (marked `...`), never any of
//! its structured data. Caps by default: 8096 bytes on the local socket and over TCP (rsyslog's
//! default `maxMessageSize`, which imrelp takes as its `maxDataSize` too; measured with rsyslog
//! 8.2302: over TCP, the rest of a longer frame comes out as separate garbage messages), 2048
//! over UDP (RFC 5426: receivers should take
//! 2048), 1024 for RFC 3164 over UDP (its own limit).
//!
//! Delivery: plain syslog has no acknowledgement. Over the local socket, UDP and TCP, `send`
//! returns `Ok` once every message of the batch is written to the socket, which is not proof
//! that the receiver has it: a TCP receiver that dies with data unread (stopped, hung, then
//! killed) loses it silently (measured: a stopped then killed rsyslogd lost all 500 alerts
//! written to it). Over RELP, `send` returns `Ok` only once the receiver answered `200` to every
//! message of the batch; until then the batch stays in the spool and is sent again. Before each
//! batch, a TCP connection or RELP session that the receiver has closed is noticed and reopened,
//! so a receiver's restart between batches costs no retry. UDP loses what the network or the receiver drops, unseen: measured here, a
//! burst of 100,000 alerts over UDP to rsyslog on loopback, 54% arrived (its socket buffer
//! overflowed), against all of them over TCP (37,000 alerts/s written, 19,000/s through
//! rsyslog) and over the local socket (whose sender waits when the receiver's queue is full).
//!
//! Receivers: rsyslog's network inputs (imudp, imtcp) parse both formats as they are. On a local
//! socket, rsyslog's imuxsock expects syslog(3)'s format unless told otherwise: RFC 5424 there
//! needs `input(type="imuxsock" Socket="..." UseSpecialParser="off" ParseHostname="on")`, or
//! use `rfc3164` (measured with rsyslog 8.2302: with the defaults, an RFC 5424 message arrives
//! with `1` as its tag and the rest as text). The tests run both against a real rsyslogd.
//!
//! Errors: a failed connect, write or send, or one that makes no progress for the timeout, is a
//! [`TransportError::Retry`] and the socket is reopened on the next batch. A message that no
//! datagram can carry (structured data over 64 KiB) is [`TransportError::Refused`], after the
//! rest of its batch went.

use std::{borrow::Cow, fmt::Write as _, io, path::PathBuf, time::Duration};

use credwatch_core::{
    alert::{Alert, Severity},
    output,
};
use serde::{Deserialize, Serialize};
use time::{format_description::well_known::Rfc3339, macros::format_description, OffsetDateTime, UtcOffset};
use tokio::net::{TcpStream, UdpSocket, UnixDatagram};

use crate::{
    relp,
    timed::{within, write_all},
    Outgoing, Transport, TransportError,
};

/// Where the messages go (also what `syslog:` destinations parse into).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SyslogTarget {
    /// A local datagram socket, such as `/dev/log`.
    Unix(PathBuf),
    /// One datagram per alert. The host is resolved again whenever the socket is reopened.
    Udp { host: String, port: u16 },
    /// One connection, reopened after an error; RFC 6587 octet-counting framing.
    Tcp { host: String, port: u16 },
    /// One RELP session, reopened after an error; each message acknowledged.
    Relp { host: String, port: u16 },
}

/// The message format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyslogFormat {
    /// With structured data: what rsyslog, syslog-ng and SIEM collectors parse into fields.
    #[default]
    Rfc5424,
    /// The BSD format, for receivers that take nothing else; the structured data then opens the
    /// message text, where a pattern can still find it. On the local socket, without the host
    /// name, as syslog(3) writes it.
    Rfc3164,
}

/// The syslog facility (RFC 5424 section 6.2.1; the kernel's is not for programs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Facility {
    User = 1,
    Mail = 2,
    Daemon = 3,
    Auth = 4,
    Syslog = 5,
    Lpr = 6,
    News = 7,
    Uucp = 8,
    Cron = 9,
    #[default]
    Authpriv = 10,
    Ftp = 11,
    Local0 = 16,
    Local1 = 17,
    Local2 = 18,
    Local3 = 19,
    Local4 = 20,
    Local5 = 21,
    Local6 = 22,
    Local7 = 23,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyslogOptions {
    pub format: SyslogFormat,
    pub facility: Facility,
    /// Longest message in bytes, framing excluded; `None`: the target's default (see the
    /// module's documentation).
    pub max_message: Option<usize>,
    /// How long a connect, a write or (RELP) an acknowledgement may make no progress before the
    /// batch is retried.
    pub timeout: Duration,
}

impl Default for SyslogOptions {
    fn default() -> Self {
        SyslogOptions {
            format: SyslogFormat::Rfc5424,
            facility: Facility::Authpriv,
            max_message: None,
            timeout: Duration::from_secs(10),
        }
    }
}

/// RFC 5426's size that every IPv4 receiver must take: a smaller cap leaves too little room.
const MIN_MESSAGE: usize = 480;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SyslogError {
    #[error("{output}: max_message {max} is below {MIN_MESSAGE} bytes, the least every syslog receiver takes")]
    TooSmall { output: String, max: usize },
    #[error("{output}: {what}")]
    Target { output: String, what: &'static str },
}

/// The SD-ID of credwatch's structured data (see the module's documentation).
pub const SD_ID: &str = "credwatch@32473";
const APP_NAME: &str = "credwatch";

/// A syslog destination: one socket, opened on first use and reopened after an error.
#[derive(Debug)]
pub struct Syslog {
    name: String,
    target: SyslogTarget,
    options: SyslogOptions,
    max_message: usize,
    procid: u32,
    connection: Option<Connection>,
}

#[derive(Debug)]
enum Connection {
    Tcp(TcpStream),
    Relp(relp::Session),
    Datagram(Datagram),
}

#[derive(Debug)]
enum Datagram {
    Unix(UnixDatagram),
    Udp(UdpSocket),
}

impl Datagram {
    async fn send(&self, message: &[u8]) -> io::Result<usize> {
        match self {
            Datagram::Unix(socket) => socket.send(message).await,
            Datagram::Udp(socket) => socket.send(message).await,
        }
    }
}

impl Syslog {
    /// Checks the destination; opens nothing yet: a receiver that is down at start-up gets the
    /// alerts once it is up (the caller retries).
    pub fn new(target: SyslogTarget, options: SyslogOptions) -> Result<Syslog, SyslogError> {
        let name = match &target {
            SyslogTarget::Unix(path) => format!("syslog:unix:{}", path.display()),
            SyslogTarget::Udp { host, port } => format!("syslog:udp:{}", credwatch_core::net::host_port(host, *port)),
            SyslogTarget::Tcp { host, port } => format!("syslog:tcp:{}", credwatch_core::net::host_port(host, *port)),
            SyslogTarget::Relp { host, port } => format!("syslog:relp:{}", credwatch_core::net::host_port(host, *port)),
        };
        let bad = |what| Err(SyslogError::Target { output: name.clone(), what });
        match &target {
            SyslogTarget::Unix(path) if path.as_os_str().is_empty() => return bad("the socket path is empty"),
            SyslogTarget::Udp { host, .. } | SyslogTarget::Tcp { host, .. } | SyslogTarget::Relp { host, .. }
                if host.is_empty() =>
            {
                return bad("the host is empty")
            }
            SyslogTarget::Udp { port: 0, .. }
            | SyslogTarget::Tcp { port: 0, .. }
            | SyslogTarget::Relp { port: 0, .. } => return bad("port 0"),
            _ if options.timeout.is_zero() => return bad("a timeout of 0 fails every delivery"),
            _ => {}
        }
        let max_message = options.max_message.unwrap_or(match (&target, options.format) {
            (SyslogTarget::Udp { .. }, SyslogFormat::Rfc3164) => 1024,
            (SyslogTarget::Udp { .. }, SyslogFormat::Rfc5424) => 2048,
            (SyslogTarget::Unix(_) | SyslogTarget::Tcp { .. } | SyslogTarget::Relp { .. }, _) => 8096,
        });
        if max_message < MIN_MESSAGE {
            return Err(SyslogError::TooSmall { output: name, max: max_message });
        }
        Ok(Syslog { name, target, options, max_message, procid: std::process::id(), connection: None })
    }

    async fn deliver(&mut self, batch: &[Outgoing]) -> Result<(), Failure> {
        let timeout = self.options.timeout;
        let closed = match &self.connection {
            Some(Connection::Tcp(stream)) => peer_closed(stream),
            Some(Connection::Relp(session)) => session.stale(),
            _ => false,
        };
        if closed {
            self.connection = None;
        }
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => self.connection.insert(within(timeout, "connect", connect(&self.target, timeout)).await?),
        };
        let local = matches!(connection, Connection::Datagram(Datagram::Unix(_)));
        let render = |outgoing| message(outgoing, &self.options, local, self.procid, self.max_message);
        let socket = match connection {
            Connection::Tcp(stream) => {
                let mut frames = Vec::new();
                for outgoing in batch {
                    let message = render(outgoing);
                    frames.extend_from_slice(format!("{} ", message.len()).as_bytes());
                    frames.extend_from_slice(&message);
                }
                return Ok(write_all(stream, &frames, timeout).await?);
            }
            Connection::Relp(session) => {
                let messages: Vec<Vec<u8>> = batch.iter().map(render).collect();
                return Ok(session.send(&messages).await?);
            }
            Connection::Datagram(socket) => socket,
        };
        let mut too_long = Vec::new();
        for outgoing in batch {
            match within(timeout, "send", socket.send(&render(outgoing))).await {
                // Only structured data over 64 KiB does that: the rest of the batch still goes.
                Err(error) if error.raw_os_error() == Some(libc::EMSGSIZE) => too_long.push(outgoing.id.clone()),
                sent => drop(sent?),
            }
        }
        if too_long.is_empty() {
            Ok(())
        } else {
            Err(Failure::TooLong(too_long))
        }
    }
}

/// Why a batch did not all go.
enum Failure {
    /// The socket failed: the connection is dropped and the batch retried.
    Io(io::Error),
    /// These alerts' messages are longer than a datagram can carry even without their text;
    /// the others of the batch went.
    TooLong(Vec<String>),
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Io(error)
    }
}

impl Transport for Syslog {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
        let result = self.deliver(batch).await;
        let output = self.name.clone();
        match result {
            Ok(()) => Ok(()),
            Err(Failure::TooLong(ids)) => Err(TransportError::Refused {
                output,
                message: format!("alerts {} are too long for a datagram, even without their text", ids.join(", ")),
            }),
            Err(Failure::Io(error)) => {
                // After a failed or partial write the stream may hold half a frame: start afresh.
                self.connection = None;
                Err(TransportError::Retry { output, message: error.to_string() })
            }
        }
    }

    async fn close(&mut self) {
        if let Some(Connection::Relp(session)) = self.connection.take() {
            // Everything sent was answered already: a failure to close loses nothing.
            let _ = session.close().await;
        }
    }
}

async fn connect(target: &SyslogTarget, timeout: Duration) -> io::Result<Connection> {
    match target {
        SyslogTarget::Unix(path) => {
            let socket = UnixDatagram::unbound()?;
            socket.connect(path).map_err(|e| context(e, format!("connect to {}", path.display())))?;
            Ok(Connection::Datagram(Datagram::Unix(socket)))
        }
        SyslogTarget::Udp { host, port } => {
            let address = tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|e| context(e, format!("resolve {host}")))?
                .next()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")))?;
            let local = if address.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            let socket = UdpSocket::bind(local).await?;
            // Connected, so that an ICMP "port unreachable" comes back as an error on a later send.
            socket.connect(address).await.map_err(|e| context(e, format!("connect to {address}")))?;
            Ok(Connection::Datagram(Datagram::Udp(socket)))
        }
        SyslogTarget::Tcp { host, port } => {
            let stream = TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| context(e, format!("connect to {}", credwatch_core::net::host_port(host, *port))))?;
            Ok(Connection::Tcp(stream))
        }
        SyslogTarget::Relp { host, port } => Ok(Connection::Relp(relp::Session::open(host, *port, timeout).await?)),
    }
}

/// A syslog receiver never writes: a stream with an end (or an error) to read is one the
/// receiver closed. Asked of the socket itself: tokio's `try_read` answers from the readiness
/// its reactor last saw, which misses a close that came while the runtime was busy.
fn peer_closed(stream: &TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::uninit()];
    match socket2::SockRef::from(stream).peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

fn context(error: io::Error, what: String) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// One alert as a syslog message, without framing: at most `max` bytes, unless its header and
/// structured data alone are longer (then it goes without MSG, whole).
fn message(outgoing: &Outgoing, options: &SyslogOptions, local: bool, procid: u32, max: usize) -> Vec<u8> {
    // An alert from a spool written by another version may not read as today's `Alert`: it still
    // goes out, with the fields every alert has and its JSON as the text.
    let alert = serde_json::from_slice::<Alert>(&outgoing.json).ok();
    let pri = options.facility as u8 * 8 + severity_code(outgoing.severity);
    let time = alert
        .as_ref()
        .and_then(|alert| OffsetDateTime::parse(&alert.timestamp, &Rfc3339).ok())
        .map(|time| time.to_offset(UtcOffset::UTC));
    let sd = structured_data(outgoing, alert.as_ref());
    let host = header_field(&outgoing.host, 255);
    let mut text = String::new();
    match options.format {
        SyslogFormat::Rfc5424 => {
            let timestamp = time
                .and_then(|t| {
                    t.format(format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"))
                        .ok()
                })
                .unwrap_or_else(|| "-".into());
            let msgid = alert.as_ref().map_or(Cow::Borrowed("-"), |alert| header_field(&alert.rule.id, 32));
            let _ = write!(text, "<{pri}>1 {timestamp} {host} {APP_NAME} {procid} {msgid} {sd}");
        }
        SyslogFormat::Rfc3164 => {
            // RFC 3164 has no zone: the time is UTC, and the receiver's clock fills in the year.
            let timestamp = time
                .unwrap_or_else(OffsetDateTime::now_utc)
                .format(format_description!("[month repr:short] [day padding:space] [hour]:[minute]:[second]"))
                .unwrap_or_default();
            let _ = write!(text, "<{pri}>{timestamp} ");
            if !local {
                let _ = write!(text, "{host} ");
            }
            let _ = write!(text, "{APP_NAME}[{procid}]: {sd}");
        }
    }
    let summary = match &alert {
        Some(alert) => summary(alert),
        None => format!("unreadable alert: {}", output::escape(&String::from_utf8_lossy(&outgoing.json))),
    };
    let room = max.saturating_sub(text.len() + 1);
    let summary = truncate(&summary, room);
    if !summary.is_empty() {
        text.push(' ');
        text.push_str(&summary);
    }
    text.into_bytes()
}

fn severity_code(severity: Severity) -> u8 {
    match severity {
        Severity::Critical => 2,
        Severity::High => 3,
        Severity::Medium => 4,
        Severity::Low => 5,
    }
}

/// `[credwatch@32473 id=".." rule=".." ...]`: the alert's fields a receiver filters on, present
/// ones only, values escaped as RFC 5424 section 6.3.3 says.
fn structured_data(outgoing: &Outgoing, alert: Option<&Alert>) -> String {
    let mut params: Vec<(&str, Cow<'_, str>)> = vec![("id", outgoing.id.as_str().into())];
    if let Some(alert) = alert {
        params.push(("rule", alert.rule.id.as_str().into()));
    }
    params.push(("severity", outgoing.severity.as_str().into()));
    if let Some(alert) = alert {
        let package = &alert.package;
        params.push(("category", alert.rule.category.as_str().into()));
        params.push(("outcome", alert.event.outcome.as_str().into()));
        params.push(("manager", package.manager.as_str().into()));
        let optional = [("package", &package.name), ("version", &package.version), ("lifecycle", &package.lifecycle)];
        params.extend(optional.into_iter().filter_map(|(key, value)| Some((key, value.as_deref()?.into()))));
        if let Some(file) = &alert.file {
            params.push(("file", file.path.as_str().into()));
        }
        if let Some(destination) = &alert.destination {
            params.push(("destination", output::destination_text(destination).into()));
        }
        params.push(("pid", alert.process.pid.to_string().into()));
    }
    let mut sd = format!("[{SD_ID}");
    for (key, value) in params {
        let _ = write!(sd, " {key}=\"");
        for c in value.chars() {
            if matches!(c, '"' | '\\' | ']') {
                sd.push('\\');
            }
            sd.push(c);
        }
        sd.push('"');
    }
    sd.push(']');
    sd
}

/// The alert's headline as the terminal shows it: escaped, so always one line.
fn summary(alert: &Alert) -> String {
    output::render(alert, false).lines().next().unwrap_or_default().to_owned()
}

/// A header field (HOSTNAME, MSGID): printable ASCII without spaces, at most `max` bytes, `-`
/// when empty (RFC 5424 section 6.2).
fn header_field(value: &str, max: usize) -> Cow<'_, str> {
    if value.is_empty() {
        return Cow::Borrowed("-");
    }
    if value.len() <= max && value.bytes().all(|b| b.is_ascii_graphic()) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(value.chars().take(max).map(|c| if c.is_ascii_graphic() { c } else { '_' }).collect())
}

/// `text` cut to `room` bytes on a character boundary, the cut marked `...`.
fn truncate(text: &str, room: usize) -> Cow<'_, str> {
    const MARK: &str = "...";
    if text.len() <= room {
        Cow::Borrowed(text)
    } else if room < MARK.len() {
        Cow::Borrowed("")
    } else {
        Cow::Owned(format!("{}{MARK}", &text[..text.floor_char_boundary(room - MARK.len())]))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use serde_json::json;
    use tokio::{
        io::AsyncReadExt,
        net::{TcpListener, UdpSocket, UnixDatagram},
    };

    use super::*;

    const ID: &str = "5f0c0c1e0a9d4b7e";

    /// An alert as the engine writes it (JSON, so that it reads the same whatever fields
    /// `Alert` gains), with a file path of the caller's.
    fn outgoing(path: &str) -> Outgoing {
        let alert = json!({
            "@timestamp": "2026-11-29T20:00:00.123456789Z",
            "event": { "kind": "alert", "action": "open", "outcome": "alerted", "id": ID },
            "rule": { "id": "cred.ssh.private-key", "name": "SSH private key read by package code",
                      "category": "ssh", "severity": "high", "description": "" },
            "process": { "pid": 30, "executable": "/usr/bin/node", "args": ["node", "x.js"],
                         "working_directory": "/p", "parent": { "pid": 20 },
                         "ancestors": [{ "pid": 10, "executable": "/usr/bin/npm", "args": ["npm", "install"] }] },
            "file": { "path": path, "given_path": path, "flags": "O_RDONLY" },
            "package": { "manager": "npm", "name": "evil", "version": "1.0.0", "lifecycle": "postinstall" },
            "host": { "name": "dev" },
            "user": { "id": 1000 },
            "credwatch": { "root_pid": 10, "rotate": [], "enforcement": "userspace" }
        });
        Outgoing {
            id: ID.into(),
            severity: Severity::High,
            host: "dev".into(),
            json: Bytes::from(serde_json::to_vec(&alert).unwrap()),
        }
    }

    fn text(outgoing: &Outgoing, options: &SyslogOptions, local: bool, max: usize) -> String {
        String::from_utf8(message(outgoing, options, local, 4242, max)).unwrap()
    }

    const SD: &str = "[credwatch@32473 id=\"5f0c0c1e0a9d4b7e\" rule=\"cred.ssh.private-key\" severity=\"high\" \
                      category=\"ssh\" outcome=\"alerted\" manager=\"npm\" package=\"evil\" version=\"1.0.0\" \
                      lifecycle=\"postinstall\" file=\"/home/a/.ssh/id_ed25519\" pid=\"30\"]";

    #[test]
    fn rfc5424_message_has_pri_header_structured_data_and_summary() {
        let message = text(&outgoing("/home/a/.ssh/id_ed25519"), &SyslogOptions::default(), false, 8096);
        // authpriv (10) * 8 + err (3); microseconds, the nanoseconds cut.
        assert_eq!(
            message,
            format!(
                "<83>1 2026-11-29T20:00:00.123456Z dev credwatch 4242 cred.ssh.private-key {SD} \
                 [HIGH] npm package evil@1.0.0 (postinstall) opened /home/a/.ssh/id_ed25519"
            )
        );
    }

    #[test]
    fn pri_is_facility_and_severity() {
        let mut alert = outgoing("/x");
        for (facility, severity, pri) in [
            (Facility::Local0, Severity::Critical, "<130>"),
            (Facility::Authpriv, Severity::Low, "<85>"),
            (Facility::Daemon, Severity::Medium, "<28>"),
            (Facility::Local7, Severity::High, "<187>"),
        ] {
            alert.severity = severity;
            let options = SyslogOptions { facility, ..SyslogOptions::default() };
            let message = text(&alert, &options, false, 8096);
            assert!(message.starts_with(pri), "{message}");
            assert!(message.contains(&format!("severity=\"{}\"", severity.as_str())), "{message}");
        }
    }

    #[test]
    fn facility_and_format_read_from_configuration_names() {
        let facility: Facility = serde_json::from_str("\"local3\"").unwrap();
        assert_eq!(facility as u8, 19);
        assert_eq!(serde_json::from_str::<SyslogFormat>("\"rfc3164\"").unwrap(), SyslogFormat::Rfc3164);
        let error = serde_json::from_str::<Facility>("\"kern\"").unwrap_err().to_string();
        assert!(error.contains("unknown variant `kern`") && error.contains("authpriv"), "{error}");
    }

    #[test]
    fn param_values_escape_quote_backslash_and_bracket() {
        let message = text(&outgoing(r#"/home/a/"x\y]z"#), &SyslogOptions::default(), false, 8096);
        assert!(message.contains(r#" file="/home/a/\"x\\y\]z" pid="30"]"#), "{message}");
    }

    #[test]
    fn header_fields_are_printable_ascii_within_their_length() {
        assert_eq!(header_field("", 32), "-");
        assert_eq!(header_field("cred.ssh", 32), "cred.ssh");
        assert_eq!(header_field("a b\u{e9}\nc", 32), "a_b__c");
        assert_eq!(header_field(&"r".repeat(40), 32), "r".repeat(32));
        let mut alert = outgoing("/x");
        alert.host = "my host".into();
        assert!(text(&alert, &SyslogOptions::default(), false, 8096).contains(" my_host credwatch "));
    }

    #[test]
    fn a_long_message_loses_the_end_of_its_text_never_its_structured_data() {
        let path = format!("/home/a/{}", "\u{e9}".repeat(400));
        let whole = text(&outgoing(&path), &SyslogOptions::default(), false, 8096);
        assert!(whole.len() > 1200);
        for max in [1200, 1201, 1202] {
            let cut = text(&outgoing(&path), &SyslogOptions::default(), false, max);
            assert!(cut.len() <= max && cut.len() >= max - 4, "{} for {max}", cut.len());
            assert!(cut.ends_with("..."), "{cut}");
            let sd_end = whole.find("\"] ").unwrap() + 2;
            assert_eq!(cut[..sd_end], whole[..sd_end]);
            assert!(whole.starts_with(&cut[..cut.len() - 3]));
        }
        // Structured data longer than the cap: the message goes without its text, whole.
        let cut = text(&outgoing(&path), &SyslogOptions::default(), false, 600);
        assert!(cut.ends_with(&format!("file=\"{path}\" pid=\"30\"]")), "{cut}");
    }

    #[test]
    fn truncate_cuts_on_a_character_and_marks_it() {
        assert_eq!(truncate("abcdef", 6), "abcdef");
        assert_eq!(truncate("abcdef", 5), "ab...");
        assert_eq!(truncate("\u{e9}\u{e9}\u{e9}", 5), "\u{e9}...");
        assert_eq!(truncate("\u{e9}\u{e9}\u{e9}", 4), "...");
        assert_eq!(truncate("abcdef", 2), "");
    }

    #[test]
    fn rfc3164_puts_the_structured_data_first_in_the_text() {
        let options = SyslogOptions { format: SyslogFormat::Rfc3164, ..SyslogOptions::default() };
        let summary = "[HIGH] npm package evil@1.0.0 (postinstall) opened /home/a/.ssh/id_ed25519";
        let network = text(&outgoing("/home/a/.ssh/id_ed25519"), &options, false, 8096);
        assert_eq!(network, format!("<83>Nov 29 20:00:00 dev credwatch[4242]: {SD} {summary}"));
        // syslog(3)'s form on the local socket: no host name.
        let local = text(&outgoing("/home/a/.ssh/id_ed25519"), &options, true, 8096);
        assert_eq!(local, format!("<83>Nov 29 20:00:00 credwatch[4242]: {SD} {summary}"));
    }

    #[test]
    fn an_unreadable_alert_still_goes_out_with_its_id_and_severity() {
        let alert = Outgoing {
            id: "abc".into(),
            severity: Severity::Critical,
            host: "dev".into(),
            json: Bytes::from_static(b"{\"rule\":\n\"\x1b[2J\"}"),
        };
        let message = text(&alert, &SyslogOptions::default(), false, 8096);
        assert_eq!(
            message,
            "<82>1 - dev credwatch 4242 - [credwatch@32473 id=\"abc\" severity=\"critical\"] \
             unreadable alert: {\"rule\":\\n\"\\u{1b}[2J\"}"
        );
    }

    #[test]
    fn new_checks_the_destination_and_picks_the_cap() {
        let udp = || SyslogTarget::Udp { host: "127.0.0.1".into(), port: 514 };
        let tcp = SyslogTarget::Tcp { host: "::1".into(), port: 6514 };
        let syslog = Syslog::new(tcp, SyslogOptions::default()).unwrap();
        assert_eq!((syslog.name(), syslog.max_message), ("syslog:tcp:[::1]:6514", 8096));
        assert_eq!(Syslog::new(udp(), SyslogOptions::default()).unwrap().max_message, 2048);
        let bsd = SyslogOptions { format: SyslogFormat::Rfc3164, ..SyslogOptions::default() };
        assert_eq!(Syslog::new(udp(), bsd).unwrap().max_message, 1024);
        let unix = Syslog::new(SyslogTarget::Unix("/dev/log".into()), SyslogOptions::default()).unwrap();
        assert_eq!((unix.name(), unix.max_message), ("syslog:unix:/dev/log", 8096));

        let small = SyslogOptions { max_message: Some(100), ..SyslogOptions::default() };
        let error = Syslog::new(udp(), small).unwrap_err().to_string();
        assert_eq!(
            error,
            "syslog:udp:127.0.0.1:514: max_message 100 is below 480 bytes, the least every syslog receiver takes"
        );
        let error = Syslog::new(SyslogTarget::Tcp { host: "h".into(), port: 0 }, SyslogOptions::default());
        assert_eq!(error.unwrap_err().to_string(), "syslog:tcp:h:0: port 0");
        let error = Syslog::new(SyslogTarget::Udp { host: String::new(), port: 1 }, SyslogOptions::default());
        assert_eq!(error.unwrap_err().to_string(), "syslog:udp::1: the host is empty");
        let instant = SyslogOptions { timeout: Duration::ZERO, ..SyslogOptions::default() };
        let error = Syslog::new(udp(), instant).unwrap_err().to_string();
        assert_eq!(error, "syslog:udp:127.0.0.1:514: a timeout of 0 fails every delivery");
        let error = Syslog::new(SyslogTarget::Unix(PathBuf::new()), SyslogOptions::default());
        assert_eq!(error.unwrap_err().to_string(), "syslog:unix:: the socket path is empty");
    }

    fn batch(n: usize) -> Vec<Outgoing> {
        (0..n).map(|i| Outgoing { id: format!("id-{i}"), ..outgoing(&format!("/home/a/.ssh/key{i}")) }).collect()
    }

    /// Splits octet-counted frames (`LEN SP MSG`), checking each length.
    fn frames(mut bytes: &[u8]) -> Vec<String> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let space = bytes.iter().position(|&b| b == b' ').unwrap();
            let len: usize = std::str::from_utf8(&bytes[..space]).unwrap().parse().unwrap();
            frames.push(String::from_utf8(bytes[space + 1..space + 1 + len].to_vec()).unwrap());
            bytes = &bytes[space + 1 + len..];
        }
        frames
    }

    fn tcp(port: u16, timeout: Duration) -> Syslog {
        let options = SyslogOptions { timeout, ..SyslogOptions::default() };
        Syslog::new(SyslogTarget::Tcp { host: "127.0.0.1".into(), port }, options).unwrap()
    }

    /// The next connection, or a failure if none comes (never a hang).
    async fn accept(listener: &TcpListener) -> tokio::net::TcpStream {
        let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await;
        accepted.expect("no connection within 10 s").unwrap().0
    }

    /// Reads until `n` whole frames have come.
    async fn read_frames(stream: &mut tokio::net::TcpStream, n: usize) -> Vec<String> {
        let mut received = Vec::new();
        let mut chunk = vec![0; 64 * 1024];
        loop {
            if let Some(messages) = complete_frames(&received).filter(|m| m.len() >= n) {
                return messages;
            }
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await;
            let read = read.expect("no frames within 10 s").unwrap();
            assert_ne!(read, 0, "the connection ended after {received:?}");
            received.extend_from_slice(&chunk[..read]);
        }
    }

    /// `frames`, once the bytes end on a frame's end.
    fn complete_frames(bytes: &[u8]) -> Option<Vec<String>> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let space = rest.iter().position(|&b| b == b' ')?;
            let len: usize = std::str::from_utf8(&rest[..space]).unwrap().parse().unwrap();
            rest = rest.get(space + 1 + len..)?;
        }
        Some(frames(bytes))
    }

    #[tokio::test]
    async fn tcp_frames_by_octet_counting_and_reopens_a_connection_the_receiver_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut syslog = tcp(listener.local_addr().unwrap().port(), Duration::from_secs(5));
        syslog.send(&batch(3)).await.unwrap();
        let mut first = accept(&listener).await;
        let messages = read_frames(&mut first, 3).await;
        assert_eq!(messages.len(), 3, "{messages:?}");
        for (i, message) in messages.iter().enumerate() {
            assert!(message.starts_with("<83>1 2026-11-29T20:00:00.123456Z dev credwatch "), "{message}");
            assert!(message.contains(&format!("[credwatch@32473 id=\"id-{i}\" ")), "{message}");
            assert!(message.ends_with(&format!("opened /home/a/.ssh/key{i}")), "{message}");
        }
        // The receiver restarts between batches: the next batch goes on a new connection.
        drop(first);
        // Blocking: the runtime does not run meanwhile, so its reactor has not seen the close.
        std::thread::sleep(Duration::from_millis(50));
        syslog.send(&batch(1)).await.unwrap();
        let mut second = accept(&listener).await;
        assert_eq!(read_frames(&mut second, 1).await.len(), 1);
    }

    #[tokio::test]
    async fn a_tcp_receiver_closing_mid_batch_is_retried_then_delivered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut syslog = tcp(listener.local_addr().unwrap().port(), Duration::from_secs(5));
        // Far more than the sockets' buffers hold, so the close lands mid-write.
        let big = batch(20_000);
        let receiver = tokio::spawn(async move {
            let mut stream = accept(&listener).await;
            let mut some = vec![0; 4096];
            stream.read_exact(&mut some).await.unwrap();
            drop(stream);
            listener
        });
        let error = syslog.send(&big).await.unwrap_err();
        assert!(
            matches!(&error, TransportError::Retry { output, .. } if output.starts_with("syslog:tcp:127.0.0.1:")),
            "{error:?}"
        );
        // The retry opens a new connection and the whole batch arrives.
        let listener = receiver.await.unwrap();
        let reader = tokio::spawn(async move {
            let mut stream = accept(&listener).await;
            let mut all = Vec::new();
            stream.read_to_end(&mut all).await.unwrap();
            frames(&all).len()
        });
        syslog.send(&big).await.unwrap();
        drop(syslog);
        assert_eq!(reader.await.unwrap(), 20_000);
    }

    #[tokio::test]
    async fn a_stalled_tcp_receiver_times_out_into_a_retry() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut syslog = tcp(listener.local_addr().unwrap().port(), Duration::from_millis(300));
        // Accepted by the kernel, never read.
        let error = syslog.send(&batch(20_000)).await.unwrap_err();
        assert!(error.to_string().contains("write: no progress in 300ms"), "{error}");
        assert!(matches!(error, TransportError::Retry { .. }));
        drop(listener);
    }

    #[tokio::test]
    async fn no_tcp_receiver_is_a_retry() {
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let error = tcp(port, Duration::from_secs(5)).send(&batch(1)).await.unwrap_err();
        assert!(matches!(&error, TransportError::Retry { message, .. } if message.contains("refused")), "{error}");
    }

    #[tokio::test]
    async fn udp_sends_one_datagram_per_alert_within_the_cap() {
        let receiver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = receiver.local_addr().unwrap().port();
        let mut syslog = Syslog::new(SyslogTarget::Udp { host: "localhost".into(), port }, SyslogOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut alerts = batch(2);
        alerts[1] = Outgoing { id: "long".into(), ..outgoing(&format!("/home/a/{}", "k".repeat(1500))) };
        syslog.send(&alerts).await.unwrap();
        let mut datagram = vec![0; 65536];
        let n = receiver.recv(&mut datagram).await.unwrap();
        assert!(String::from_utf8_lossy(&datagram[..n]).contains("id=\"id-0\""));
        let n = receiver.recv(&mut datagram).await.unwrap();
        let long = String::from_utf8_lossy(&datagram[..n]);
        assert!(n <= 2048 && long.contains("id=\"long\"") && long.ends_with("..."), "{n}: {long}");
    }

    #[tokio::test]
    async fn an_alert_too_long_for_any_datagram_is_refused_after_the_rest_of_its_batch() {
        let receiver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = receiver.local_addr().unwrap().port();
        let mut syslog = Syslog::new(SyslogTarget::Udp { host: "127.0.0.1".into(), port }, SyslogOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut alerts = batch(3);
        alerts[1] = Outgoing { id: "huge".into(), ..outgoing(&format!("/{}", "k".repeat(70_000))) };
        let error = syslog.send(&alerts).await.unwrap_err();
        assert!(
            matches!(&error, TransportError::Refused { message, .. } if message.starts_with("alerts huge are too long")),
            "{error:?}"
        );
        let mut datagram = vec![0; 65536];
        for id in ["id-0", "id-2"] {
            let n = receiver.recv(&mut datagram).await.unwrap();
            assert!(String::from_utf8_lossy(&datagram[..n]).contains(&format!("id=\"{id}\"")));
        }
    }

    #[tokio::test]
    async fn unix_sends_one_datagram_per_alert_and_retries_without_a_receiver() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut syslog = Syslog::new(SyslogTarget::Unix(path.clone()), SyslogOptions::default()).unwrap();
        let error = syslog.send(&batch(1)).await.unwrap_err();
        assert!(matches!(&error, TransportError::Retry { message, .. } if message.contains("No such file")), "{error}");

        let receiver = UnixDatagram::bind(&path).unwrap();
        syslog.send(&batch(2)).await.unwrap();
        let mut datagram = vec![0; 65536];
        for i in 0..2 {
            let n = receiver.recv(&mut datagram).await.unwrap();
            let message = String::from_utf8_lossy(&datagram[..n]);
            assert!(message.contains(&format!("id=\"id-{i}\"")), "{message}");
        }
        // The receiver goes away (rsyslog restarting): a retry, then delivery to the new one.
        drop(receiver);
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(syslog.send(&batch(1)).await, Err(TransportError::Retry { .. })));
        let receiver = UnixDatagram::bind(&path).unwrap();
        syslog.send(&batch(1)).await.unwrap();
        let n = receiver.recv(&mut datagram).await.unwrap();
        assert!(String::from_utf8_lossy(&datagram[..n]).contains("id=\"id-0\""));
    }
}
