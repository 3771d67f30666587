//! The box's way out under `--contain-net registries`: an HTTP proxy that tunnels `CONNECT
//! host:port` and forwards absolute-URI plain-HTTP requests (`GET http://host/...`) to the hosts
//! [`Allowed`] lets through, and answers 403 to the rest, telling credwatch who asked for what.
//! It accepts in the box's network namespace and connects out from the machine's (through the
//! user's own proxy, `HTTPS_PROXY`/`HTTP_PROXY` of credwatch's environment, when one is set).
//!
//! What clients send is the monitored system's: heads are bounded ([`MAX_HEAD`]), connections
//! counted ([`MAX_CONNECTIONS`]), every wait timed out, and a bad request gets a clear error.

use std::{
    fs::File,
    io::{self, Read as _, Seek as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _},
    os::unix::fs::MetadataExt as _,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    contain::net::{endpoint, request_head, response, Allowed, Endpoint, RequestHead, Target, MAX_HEAD},
    output::escape,
};
use tracing::{debug, warn};

/// Processes and fds looked at to find which process made a refused connection.
const MAX_PROCESSES: usize = 65_536;
const MAX_FDS: usize = 65_536;
/// Connections served at once; past it a client gets 503.
const MAX_CONNECTIONS: usize = 256;
/// For a client's request head, and for a destination's (or the upstream proxy's) answer to connect.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for credwatch to queue a refusal for the engine before the 403 goes anyway.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(2);
/// A relayed connection with nothing sent either way for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// A connection the proxy refused: to `to`, by `pid` when found.
pub struct Refusal {
    pub pid: Option<u32>,
    pub to: Endpoint,
    pub time_ns: u64,
    /// Told once the refusal is queued for the engine: the proxy holds its 403 until then, so
    /// that the process cannot exit (and leave the engine's table) before its refusal is judged.
    pub queued: mpsc::Sender<()>,
}

/// Where the box's sockets are, as the proxy sees them: its namespace's TCP tables, opened in
/// it (a `/proc/.../net` file shows the namespace of its opener), and the namespace's inode.
pub(super) struct BoxSockets {
    tables: Mutex<[File; 2]>,
    namespace: u64,
    listen_port: u16,
}

impl BoxSockets {
    pub(super) fn new(tables: [File; 2], namespace: u64, listen_port: u16) -> BoxSockets {
        BoxSockets { tables: Mutex::new(tables), namespace, listen_port }
    }

    /// The process of the box whose socket connected from `peer` to the proxy, if it is still
    /// open: its inode from the namespace's TCP table, then the fd of a process in the
    /// namespace that holds it.
    pub(super) fn owner(&self, peer: SocketAddr) -> Option<u32> {
        let inode = {
            let mut tables = self.tables.lock().ok()?;
            let table = if peer.is_ipv4() { &mut tables[0] } else { &mut tables[1] };
            let mut text = String::new();
            table.rewind().ok()?;
            table.read_to_string(&mut text).ok()?;
            socket_inode(&text, peer.port(), self.listen_port)?
        };
        let wanted = format!("socket:[{inode}]");
        let processes = std::fs::read_dir("/proc").ok()?;
        for entry in processes.flatten().take(MAX_PROCESSES) {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            let in_box = std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|ns| ns.ino() == self.namespace);
            if !in_box {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
            for fd in fds.flatten().take(MAX_FDS) {
                if std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str()) {
                    return Some(pid);
                }
            }
        }
        None
    }
}

/// The inode of the socket in a `/proc/net/tcp{,6}` table whose local port is `port` and remote
/// port `remote_port`.
fn socket_inode(table: &str, port: u16, remote_port: u16) -> Option<u64> {
    let port_of = |address: &str| address.rsplit_once(':').and_then(|(_, port)| u16::from_str_radix(port, 16).ok());
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        (port_of(local) == Some(port) && port_of(remote) == Some(remote_port)).then(|| inode.parse().ok())?
    })
}

pub(super) struct Proxy {
    allowed: Allowed,
    sockets: BoxSockets,
    refusals: mpsc::Sender<Refusal>,
    /// The user's proxy, for tunnels and for plain HTTP.
    upstream_tunnel: Option<Endpoint>,
    upstream_http: Option<Endpoint>,
    active: AtomicUsize,
}

impl Proxy {
    pub(super) fn new(allowed: Allowed, sockets: BoxSockets, refusals: mpsc::Sender<Refusal>) -> Proxy {
        let upstream = |names: [&str; 2]| {
            let url = names.iter().find_map(|name| std::env::var(name).ok().filter(|url| !url.is_empty()))?;
            let found = url.starts_with("http://").then(|| endpoint(&url)).flatten();
            if found.is_none() {
                warn!("contained: {} is not an http:// proxy URL; the box's proxy connects directly", escape(&url));
            }
            found
        };
        Proxy {
            allowed,
            sockets,
            refusals,
            upstream_tunnel: upstream(["HTTPS_PROXY", "https_proxy"]),
            upstream_http: upstream(["HTTP_PROXY", "http_proxy"]),
            active: AtomicUsize::new(0),
        }
    }

    /// Serves `listener` (in the box's namespace) on a thread of its own, for as long as
    /// credwatch runs.
    pub(super) fn start(self, listener: TcpListener) -> Result<()> {
        let proxy = Arc::new(self);
        std::thread::Builder::new()
            .name("contain-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let client = match client {
                        Ok(client) => client,
                        Err(error) => {
                            debug!("contained: the proxy's accept failed: {error}");
                            continue;
                        }
                    };
                    if proxy.active.fetch_add(1, Ordering::Relaxed) >= MAX_CONNECTIONS {
                        proxy.active.fetch_sub(1, Ordering::Relaxed);
                        let _ = (&client).write_all(&response(503, "too many connections through the proxy"));
                        continue;
                    }
                    let proxy = Arc::clone(&proxy);
                    let served = std::thread::Builder::new().name("contain-proxy-conn".into()).spawn(move || {
                        proxy.serve(client);
                        proxy.active.fetch_sub(1, Ordering::Relaxed);
                    });
                    if let Err(error) = served {
                        warn!("contained: the proxy could not start a thread: {error}");
                    }
                }
            })
            .context("--contain-net: starting the proxy")?;
        Ok(())
    }

    fn serve(&self, client: TcpStream) {
        let peer = client.peer_addr().ok();
        if let Err(error) = self.relay(&client, peer) {
            debug!("contained: the proxy's connection from {peer:?}: {error:#}");
        }
    }

    fn relay(&self, client: &TcpStream, peer: Option<SocketAddr>) -> Result<()> {
        client.set_read_timeout(Some(HEAD_TIMEOUT))?;
        let (head, read) = match read_head(client)? {
            Ok(found) => found,
            Err((status, why)) => {
                warn!("contained: the proxy refused a bad request ({status}): {}", escape(&why));
                return Ok((&*client).write_all(&response(status, &why))?);
            }
        };
        let to = head.target.endpoint().clone();
        if !self.allowed.allows(&to) {
            let pid = peer.and_then(|peer| self.sockets.owner(peer));
            warn!(
                "contained: the proxy refused {} {} (pid {})",
                escape(&head.method),
                to.authority(),
                pid.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string())
            );
            let time_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
            let (queued, taken) = mpsc::channel();
            if self.refusals.send(Refusal { pid, to: to.clone(), time_ns, queued }).is_ok() {
                let _ = taken.recv_timeout(QUEUE_TIMEOUT);
            }
            let why = format!("{} is not a registry the box may reach", to.authority());
            return Ok((&*client).write_all(&response(403, &why))?);
        }
        let tunnel = matches!(head.target, Target::Tunnel(_));
        let upstream = if tunnel { &self.upstream_tunnel } else { &self.upstream_http };
        let server = match self.open(&head, &to, upstream.as_ref()) {
            Ok(server) => server,
            Err((status, why)) => {
                warn!("contained: the proxy could not reach {}: {}", to.authority(), escape(&why));
                return Ok((&*client).write_all(&response(status, &why))?);
            }
        };
        let body = &read[head.length..];
        if tunnel {
            (&*client).write_all(&response(200, ""))?;
        }
        (&server).write_all(body)?;
        client.set_read_timeout(Some(IDLE_TIMEOUT))?;
        server.set_read_timeout(Some(IDLE_TIMEOUT))?;
        splice(client, &server)
    }

    /// A connection to `to` (or through `upstream` to it), with the request head sent on: for a
    /// tunnel, ready for its bytes; for a forward, ready for the body.
    fn open(&self, head: &RequestHead, to: &Endpoint, upstream: Option<&Endpoint>) -> Result<TcpStream, (u16, String)> {
        let hop = upstream.unwrap_or(to);
        let server = connect(hop).map_err(|error| (502, format!("connecting to {}: {error}", hop.authority())))?;
        let sent = match (&head.target, upstream) {
            (Target::Tunnel(_), None) => Ok(()),
            (Target::Tunnel(_), Some(_)) => {
                let request = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", to.authority());
                (&server).write_all(request.as_bytes()).and_then(|()| upstream_accepts(&server))
            }
            (Target::Forward { .. }, upstream) => (&server).write_all(&head.forwarded(upstream.is_some())),
        };
        sent.map_err(|error| (502, format!("through {}: {error}", hop.authority())))?;
        Ok(server)
    }
}

/// Reads a request head: the head and every byte read (the head's, then the body's start), or
/// the status and reason to refuse it with.
#[allow(clippy::type_complexity)]
fn read_head(client: &TcpStream) -> io::Result<Result<(RequestHead, Vec<u8>), (u16, String)>> {
    let mut read = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match (&*client).read(&mut chunk) {
            Ok(n) => n,
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Ok(Err((408, "no request head in time".into())));
            }
            Err(error) => return Err(error),
        };
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before its request head"));
        }
        read.extend_from_slice(&chunk[..n]);
        match request_head(&read) {
            Ok(Some(head)) => return Ok(Ok((head, read))),
            Ok(None) => continue,
            Err(error) => return Ok(Err((error.status(), error.to_string()))),
        }
    }
}

/// Connects from the machine's network namespace (this thread's), with a bound on the wait.
fn connect(to: &Endpoint) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for address in (to.host.as_str(), to.port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// Reads the upstream proxy's answer to CONNECT, byte by byte up to its blank line (nothing of
/// the tunnel is read): a 2xx, else an error with its status line.
fn upstream_accepts(server: &TcpStream) -> io::Result<()> {
    server.set_read_timeout(Some(HEAD_TIMEOUT))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD || (&*server).read(&mut byte)? == 0 {
            return Err(io::Error::other("no answer to CONNECT"));
        }
        head.push(byte[0]);
    }
    let status_line = String::from_utf8_lossy(head.split(|&b| b == b'\r').next().unwrap_or_default()).into_owned();
    match status_line.split_whitespace().nth(1) {
        Some(status) if status.starts_with('2') => Ok(()),
        _ => Err(io::Error::other(format!("the upstream proxy answered {status_line:?}"))),
    }
}

/// Copies both ways until each side has closed (or stayed idle past [`IDLE_TIMEOUT`]).
fn splice(client: &TcpStream, server: &TcpStream) -> Result<()> {
    let (mut from_client, mut to_server) = (client.try_clone()?, server.try_clone()?);
    let upload = std::thread::Builder::new().name("contain-proxy-up".into()).spawn(move || {
        let _ = io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(Shutdown::Write);
    })?;
    let _ = io::copy(&mut &*server, &mut &*client);
    let _ = client.shutdown(Shutdown::Write);
    // The client may keep its side open: the upload ends when it closes or idles out.
    let _ = client.shutdown(Shutdown::Read);
    let _ = upload.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_found_by_its_ports_in_the_tcp_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A8F3 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A8F3 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 5552 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:D431 0100007F:A8F3 01 00000000:00000000 00:00000000 00000000  1000        0 5553 1 0000000000000000 20 4 30 10 -1
";
        assert_eq!(socket_inode(table, 0xD431, 0xA8F3), Some(5553));
        assert_eq!(socket_inode(table, 0xA8F3, 0xD431), Some(5552));
        assert_eq!(socket_inode(table, 0xD432, 0xA8F3), None);
        assert_eq!(socket_inode("garbage\n1 2", 1, 2), None);
    }
}
