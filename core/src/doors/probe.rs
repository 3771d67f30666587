//! Asks a running door what it holds, for `credwatch exposure`, never reading a secret: an
//! ssh-agent how many keys it holds (not the keys), gpg-agent how many keys it knows and has
//! unlocked (keygrips only, counted), a container engine whether it answers, the session bus
//! whether a Secret Service is on it. Each probe has a deadline; a peer that says nothing, too
//! much or nonsense gives a line saying so, never a hang or a panic.

use std::{
    fs,
    io::{self, BufRead as _, BufReader, Read, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::FileTypeExt as _, net::UnixStream},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::Serialize;

use super::Door;
use crate::rules::door::Probe;

/// How long a connect may wait for the listener (a full queue).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long one door's whole conversation may take.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// Most bytes read from one door (a bus's activatable names are a few KiB).
const MAX_REPLY_BYTES: u64 = 1 << 20;
/// gpg-agent sockets looked for in a directory door (`d.<hash>/` for each GNUPGHOME).
const MAX_GPG_SOCKETS: usize = 8;
/// The Secret Service's well-known bus name (freedesktop.org Secret Service API).
const SECRET_SERVICE: &str = "org.freedesktop.secrets";

/// What a door said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "kebab-case")]
pub enum Answer {
    /// An ssh-agent: its identities answer's count.
    SshAgent { keys: u32 },
    /// gpg-agent: the keys of `KEYINFO --list`, and those cached (unlocked, usable without a
    /// passphrase).
    GpgAgent { keys: u32, cached: u32 },
    /// An HTTP API answered `GET /_ping` with this status.
    Http { status: u16 },
    /// The session bus, and the Secret Service on it.
    SessionBus { secret_service: SecretService },
    /// Nothing useful: why, in words.
    NoAnswer { why: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SecretService {
    /// A process owns `org.freedesktop.secrets`.
    Running,
    /// None owns it, but the bus starts one on the first request.
    Activatable,
    Absent,
}

impl Answer {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Answer::SshAgent { keys: 1 } => "1 key loaded".into(),
            Answer::SshAgent { keys } => format!("{keys} keys loaded"),
            Answer::GpgAgent { keys, cached } => {
                format!("{keys} key{} known, {cached} unlocked (cached)", if *keys == 1 { "" } else { "s" })
            }
            Answer::Http { status: 200 } => "answers (HTTP 200)".into(),
            Answer::Http { status } => format!("answered HTTP {status}"),
            Answer::SessionBus { secret_service: SecretService::Running } => {
                "a Secret Service is running on it (org.freedesktop.secrets)".into()
            }
            Answer::SessionBus { secret_service: SecretService::Activatable } => {
                "a Secret Service starts on the first request (org.freedesktop.secrets is activatable)".into()
            }
            Answer::SessionBus { secret_service: SecretService::Absent } => "answers; no Secret Service on it".into(),
            Answer::NoAnswer { why } => why.clone(),
        }
    }
}

/// Asks `door` what it holds, as its entry's `probe` says; none when it says nothing, or the
/// door is a socket the probe does not speak to (`S.dirmngr`).
pub fn probe(door: &Door) -> Option<Answer> {
    let name = door.path.file_name().unwrap_or_default();
    match door.probe? {
        Probe::SshAgent => Some(ask(&door.path, ssh_agent)),
        Probe::HttpPing => Some(ask(&door.path, http_ping)),
        Probe::SessionBus => Some(ask(&door.path, session_bus)),
        Probe::GpgAgent if door.directory => gpg_directory(&door.path),
        Probe::GpgAgent if name == "S.gpg-agent" => Some(ask(&door.path, gpg_agent)),
        // gpg-agent's ssh socket speaks the ssh-agent protocol.
        Probe::GpgAgent if name == "S.gpg-agent.ssh" => Some(ask(&door.path, ssh_agent)),
        Probe::GpgAgent => None,
    }
}

/// The agents of a gpg runtime directory (its own `S.gpg-agent`, and each `d.<hash>/`'s),
/// summed; none when it holds none.
fn gpg_directory(dir: &Path) -> Option<Answer> {
    let mut sockets = vec![dir.join("S.gpg-agent")];
    if let Ok(entries) = fs::read_dir(dir) {
        let mut subdirs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().as_bytes().starts_with(b"d."))
            .map(|e| e.path().join("S.gpg-agent"))
            .collect();
        subdirs.sort();
        sockets.extend(subdirs);
    }
    sockets.retain(|s| fs::symlink_metadata(s).is_ok());
    sockets.truncate(MAX_GPG_SOCKETS);
    let answers: Vec<Answer> = sockets.iter().map(|s| ask(s, gpg_agent)).collect();
    let (mut keys, mut cached, mut answered) = (0, 0, false);
    for answer in &answers {
        if let Answer::GpgAgent { keys: k, cached: c } = answer {
            (keys, cached, answered) = (keys + k, cached + c, true);
        }
    }
    if answered {
        Some(Answer::GpgAgent { keys, cached })
    } else {
        answers.into_iter().next()
    }
}

/// Connects to `path` and runs `talk`, within the deadline; every failure becomes a
/// [`Answer::NoAnswer`] saying why.
fn ask(path: &Path, talk: fn(&mut Peer) -> Result<Answer, String>) -> Answer {
    match fs::metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Answer::NoAnswer { why: "not a socket (nothing listens)".into() };
        }
        Ok(_) => {}
        Err(error) => return Answer::NoAnswer { why: format!("cannot look at it: {error}") },
    }
    let stream = match connect(path) {
        Ok(stream) => stream,
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            return Answer::NoAnswer { why: "nothing listens (connection refused)".into() };
        }
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            return Answer::NoAnswer { why: "not this user's to connect to (permission denied)".into() };
        }
        Err(error) => return Answer::NoAnswer { why: format!("cannot connect: {error}") },
    };
    let mut peer = Peer { stream, deadline: Instant::now() + PROBE_DEADLINE, read: 0 };
    talk(&mut peer).unwrap_or_else(|why| Answer::NoAnswer { why })
}

/// A connected door, read and written against one deadline and a byte budget.
struct Peer {
    stream: UnixStream,
    deadline: Instant,
    read: u64,
}

impl Peer {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"));
        }
        Ok(left)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        let left = self.remaining().map_err(|e| describe_io(&e))?;
        self.stream.set_write_timeout(Some(left)).map_err(|e| describe_io(&e))?;
        self.stream.write_all(bytes).map_err(|e| describe_io(&e))
    }

    fn receive(&mut self, buf: &mut [u8]) -> Result<(), String> {
        self.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => "it hung up mid-answer".into(),
            _ => describe_io(&e),
        })
    }
}

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read >= MAX_REPLY_BYTES {
            return Err(io::Error::other(format!("it said more than {MAX_REPLY_BYTES} bytes")));
        }
        let left = self.remaining()?;
        self.stream.set_read_timeout(Some(left))?;
        let room = usize::try_from(MAX_REPLY_BYTES - self.read).unwrap_or(usize::MAX).min(buf.len());
        let n = self.stream.read(&mut buf[..room])?;
        self.read += n as u64;
        Ok(n)
    }
}

fn describe_io(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no answer within {} ms", PROBE_DEADLINE.as_millis())
        }
        _ => error.to_string(),
    }
}

/// A unix stream connected to `path` within [`CONNECT_TIMEOUT`].
fn connect(path: &Path) -> io::Result<UnixStream> {
    // SAFETY: plain system calls on a socket this function owns; the address is a zeroed
    // sockaddr_un with a NUL-terminated path that fits.
    unsafe {
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= address.sun_path.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("its path is longer than a socket address holds ({} bytes)", address.sun_path.len() - 1),
            ));
        }
        for (slot, byte) in address.sun_path.iter_mut().zip(bytes) {
            *slot = *byte as libc::c_char;
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let length = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::connect(fd.as_raw_fd(), (&raw const address).cast(), length) < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINPROGRESS) => {
                    let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                    let ms = CONNECT_TIMEOUT.as_millis() as libc::c_int;
                    match libc::poll(&mut poll, 1, ms) {
                        0 => return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
                        n if n < 0 => return Err(io::Error::last_os_error()),
                        _ => {}
                    }
                    let mut code: libc::c_int = 0;
                    let mut size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                    let at = (&raw mut code).cast();
                    if libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ERROR, at, &mut size) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(code));
                    }
                }
                Some(libc::EAGAIN) => {
                    return Err(io::Error::new(io::ErrorKind::WouldBlock, "its listener's queue is full"));
                }
                _ => return Err(error),
            }
        }
        let stream = UnixStream::from(fd);
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}

/// SSH2_AGENTC_REQUEST_IDENTITIES (11); the answer, SSH2_AGENT_IDENTITIES_ANSWER (12), starts
/// with the count: only that is read (draft-miller-ssh-agent, 4.4).
fn ssh_agent(peer: &mut Peer) -> Result<Answer, String> {
    const REQUEST_IDENTITIES: u8 = 11;
    const IDENTITIES_ANSWER: u8 = 12;
    const FAILURE: u8 = 5;
    peer.send(&[0, 0, 0, 1, REQUEST_IDENTITIES])?;
    let mut head = [0u8; 5];
    peer.receive(&mut head)?;
    let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    match head[4] {
        IDENTITIES_ANSWER if length >= 5 => {
            let mut count = [0u8; 4];
            peer.receive(&mut count)?;
            Ok(Answer::SshAgent { keys: u32::from_be_bytes(count) })
        }
        FAILURE => Err("it refused to list its keys (SSH_AGENT_FAILURE)".into()),
        other => Err(format!("not an ssh-agent's answer (message type {other}, {length} bytes)")),
    }
}

/// Assuan: `KEYINFO --list` gives one `S KEYINFO <keygrip> <type> <serial> <idstr> <cached>
/// ...` line a key, `<cached>` `1` when its passphrase is cached (gpg-agent's manual, "Ask
/// for information about a key").
fn gpg_agent(peer: &mut Peer) -> Result<Answer, String> {
    let mut reader = BufReader::new(peer);
    let mut line = Vec::new();
    let next = |reader: &mut BufReader<&mut Peer>, line: &mut Vec<u8>| -> Result<(), String> {
        line.clear();
        match reader.read_until(b'\n', line) {
            Ok(0) => Err("it hung up".into()),
            Ok(_) => Ok(()),
            Err(error) => Err(describe_io(&error)),
        }
    };
    next(&mut reader, &mut line)?;
    if !line.starts_with(b"OK") {
        return Err(format!("not gpg-agent's greeting: {}", printable(&line)));
    }
    reader.get_mut().send(b"KEYINFO --list\n")?;
    let (mut keys, mut cached) = (0u32, 0u32);
    loop {
        next(&mut reader, &mut line)?;
        if line.starts_with(b"S KEYINFO ") {
            keys += 1;
            let fields: Vec<&[u8]> = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty()).collect();
            if fields.get(6) == Some(&&b"1"[..]) {
                cached += 1;
            }
        } else if line.starts_with(b"OK") {
            let _ = reader.get_mut().send(b"BYE\n");
            return Ok(Answer::GpgAgent { keys, cached });
        } else if line.starts_with(b"ERR") {
            return Err(format!("it refused to list its keys: {}", printable(&line)));
        }
    }
}

/// Docker's and Podman's API answer `GET /_ping` with `OK`.
fn http_ping(peer: &mut Peer) -> Result<Answer, String> {
    peer.send(b"GET /_ping HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut reader = BufReader::new(peer.take(256));
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).map_err(|e| describe_io(&e))?;
    let text = String::from_utf8_lossy(&line);
    let mut words = text.split_whitespace();
    match (words.next(), words.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(status))) if version.starts_with("HTTP/") => Ok(Answer::Http { status }),
        _ if line.is_empty() => Err("it hung up without an answer".into()),
        _ => Err(format!("not an HTTP answer: {}", printable(&line))),
    }
}

/// D-Bus: authenticate as this process's uid (EXTERNAL), then `Hello`, `NameHasOwner` and
/// `ListActivatableNames` of the bus driver, whose replies come in order.
fn session_bus(peer: &mut Peer) -> Result<Answer, String> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let hex: String = uid.to_string().bytes().map(|b| format!("{b:02x}")).collect();
    peer.send(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
    let mut line = Vec::new();
    {
        let mut reader = BufReader::new((&mut *peer).take(512));
        reader.read_until(b'\n', &mut line).map_err(|e| describe_io(&e))?;
    }
    if !line.starts_with(b"OK ") {
        return Err(format!("the bus did not let this user in: {}", printable(&line)));
    }
    let mut out = b"BEGIN\r\n".to_vec();
    out.extend(method_call(1, "Hello", None));
    out.extend(method_call(2, "NameHasOwner", Some(SECRET_SERVICE)));
    out.extend(method_call(3, "ListActivatableNames", None));
    peer.send(&out)?;
    let mut replies = Vec::new();
    while replies.len() < 3 {
        let (kind, body, little) = read_message(peer)?;
        match kind {
            METHOD_RETURN | ERROR => replies.push((kind, body, little)),
            _ => {} // signals (NameAcquired)
        }
    }
    let owned = match &replies[1] {
        (METHOD_RETURN, body, little) if body.len() >= 4 => u32_at(body, 0, *little) == Some(1),
        _ => return Err("the bus driver did not answer NameHasOwner".into()),
    };
    let activatable = match &replies[2] {
        (METHOD_RETURN, body, little) => strings(body, *little)?.iter().any(|name| name == SECRET_SERVICE),
        _ => false,
    };
    let secret_service = match (owned, activatable) {
        (true, _) => SecretService::Running,
        (false, true) => SecretService::Activatable,
        (false, false) => SecretService::Absent,
    };
    Ok(Answer::SessionBus { secret_service })
}

const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;

/// A little-endian method call to the bus driver, with one string argument or none.
fn method_call(serial: u32, member: &str, argument: Option<&str>) -> Vec<u8> {
    fn align(out: &mut Vec<u8>, to: usize) {
        while !out.len().is_multiple_of(to) {
            out.push(0);
        }
    }
    fn field(out: &mut Vec<u8>, code: u8, signature: u8, value: &str) {
        align(out, 8);
        out.extend([code, 1, signature, 0]);
        if signature == b'g' {
            out.push(value.len() as u8);
        } else {
            align(out, 4);
            out.extend((value.len() as u32).to_le_bytes());
        }
        out.extend(value.as_bytes());
        out.push(0);
    }
    let mut body = Vec::new();
    if let Some(text) = argument {
        body.extend((text.len() as u32).to_le_bytes());
        body.extend(text.as_bytes());
        body.push(0);
    }
    let mut out = vec![b'l', METHOD_CALL, 0, 1];
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(serial.to_le_bytes());
    out.extend([0; 4]); // the fields' length, set below
    field(&mut out, 1, b'o', "/org/freedesktop/DBus");
    field(&mut out, 2, b's', "org.freedesktop.DBus");
    field(&mut out, 3, b's', member);
    field(&mut out, 6, b's', "org.freedesktop.DBus");
    if argument.is_some() {
        field(&mut out, 8, b'g', "s");
    }
    let fields = (out.len() - 16) as u32;
    out[12..16].copy_from_slice(&fields.to_le_bytes());
    align(&mut out, 8);
    out.extend(body);
    out
}

/// One message: its type, its body, and whether it is little-endian.
fn read_message(peer: &mut Peer) -> Result<(u8, Vec<u8>, bool), String> {
    let mut head = [0u8; 16];
    peer.receive(&mut head)?;
    let little = match head[0] {
        b'l' => true,
        b'B' => false,
        other => return Err(format!("not a D-Bus message (byte order {other:#04x})")),
    };
    let body_length = u32_at(&head, 4, little).unwrap_or_default() as u64;
    let fields_length = u32_at(&head, 12, little).unwrap_or_default() as u64;
    let padded = (16 + fields_length).div_ceil(8) * 8 - 16;
    if padded + body_length > MAX_REPLY_BYTES {
        return Err(format!("a D-Bus message of {} bytes, more than {MAX_REPLY_BYTES}", padded + body_length));
    }
    let mut rest = vec![0u8; (padded + body_length) as usize];
    peer.receive(&mut rest)?;
    Ok((head[1], rest.split_off(padded as usize), little))
}

fn u32_at(bytes: &[u8], at: usize, little: bool) -> Option<u32> {
    let word: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(if little { u32::from_le_bytes(word) } else { u32::from_be_bytes(word) })
}

/// The strings of a body of signature `as`.
fn strings(body: &[u8], little: bool) -> Result<Vec<String>, String> {
    let bad = || "a malformed list of bus names".to_owned();
    let length = u32_at(body, 0, little).ok_or_else(bad)? as usize;
    let end = 4usize.checked_add(length).filter(|&end| end <= body.len()).ok_or_else(bad)?;
    let mut at = 4;
    let mut names = Vec::new();
    while at < end {
        at = at.div_ceil(4) * 4;
        let size = u32_at(body, at, little).ok_or_else(bad)? as usize;
        let text = body.get(at + 4..at + 4 + size).ok_or_else(bad)?;
        names.push(String::from_utf8_lossy(text).into_owned());
        at += 4 + size + 1;
    }
    Ok(names)
}

/// A peer's line, cut short and escaped for a terminal.
fn printable(line: &[u8]) -> String {
    let cut = &line[..line.len().min(80)];
    let text = String::from_utf8_lossy(cut);
    format!("\"{}\"", crate::output::escape(text.trim_end_matches(['\r', '\n'])))
}

#[cfg(test)]
mod tests;
