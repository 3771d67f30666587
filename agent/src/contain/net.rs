//! `run --contain --contain-net registries`: the box gets a network namespace of its own, whose
//! only way out is credwatch's HTTP/CONNECT proxy ([`super::proxy`]).
//!
//! Namespaces are per thread: a thread of credwatch unshares one, brings its `lo` up, binds the
//! proxy's listener on 127.0.0.1 there, and hands back an fd of the namespace; then it ends. The
//! child joins that namespace with `setns` in [`Containment::enter`]. Sockets keep the namespace
//! they were made in, so the proxy accepts the box's connections on that listener from any
//! thread, and connects out from threads of the machine's namespace. In the box nothing else
//! routes anywhere: the machine's abstract unix sockets, the cloud metadata address and every
//! direct connect fail at once.

use std::{
    ffi::OsString,
    fs::File,
    io::{self, Read as _, Seek as _},
    net::{SocketAddr, TcpListener},
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::Path,
    sync::{mpsc, Mutex},
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    contain::net::{self as decide, Allowed, Endpoint},
    event::{Connect, Event, EventData},
    rules::RuleSet,
};

use super::{check, proxy::Proxy, Containment, Failure};

/// The step of [`Containment::enter`] that joins the box's network namespace.
pub const STEP_NET: u32 = u32::MAX - 20;
/// Processes and fds looked at to find which process made a refused connection.
const MAX_PROCESSES: usize = 65_536;
const MAX_FDS: usize = 65_536;

/// What the box joins, and the environment that points its clients at the proxy.
pub(super) struct Joined {
    namespace: OwnedFd,
    env: Vec<(String, String)>,
}

/// A connection the proxy refused: to `to`, by `pid` when found.
pub struct Refusal {
    pub pid: Option<u32>,
    pub to: Endpoint,
    pub time_ns: u64,
    /// Told once the refusal is queued for the engine: the proxy holds its 403 until then, so
    /// that the process cannot exit (and leave the engine's table) before its refusal is judged.
    pub queued: mpsc::Sender<()>,
}

/// The proxy's side, for credwatch: its refusals, for the engine.
pub struct Network {
    refusals: mpsc::Receiver<Refusal>,
}

impl Network {
    /// The refusals since the last call, as connect events of the processes that made them
    /// (`root`'s when not found).
    pub fn refused(&self, root: u32) -> Vec<Event> {
        self.refusals
            .try_iter()
            .map(|refusal| {
                let _ = refusal.queued.send(());
                let ip = refusal.to.ip();
                Event {
                    time_ns: refusal.time_ns,
                    pid: refusal.pid.unwrap_or(root),
                    data: EventData::Connect(Connect {
                        tid: 0,
                        family: if ip.is_some_and(|ip| ip.is_ipv6()) { "inet6" } else { "inet" }.into(),
                        socket_type: Some("stream".into()),
                        address: ip.map(|ip| ip.to_string()),
                        port: Some(refusal.to.port),
                        proxy_refused: Some(refusal.to.host),
                        ..Connect::default()
                    }),
                }
            })
            .collect()
    }
}

/// Where the box's sockets are, as the proxy sees them: its namespace's TCP tables, opened in
/// it (a `/proc/.../net` file shows the namespace of its opener), and the namespace's inode.
pub(super) struct BoxSockets {
    tables: Mutex<[File; 2]>,
    namespace: u64,
    listen_port: u16,
}

impl BoxSockets {
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

impl Containment {
    /// Gives the box a network namespace whose only way out is the proxy, started here; returns
    /// its refusals' side. `env` is CMD's environment (its configured registries pass).
    pub fn shut_network(&mut self, rules: &RuleSet, env: &[(OsString, OsString)]) -> Result<Network> {
        if !self.root {
            anyhow::bail!(
                "--contain-net needs root (a network namespace the box joins, and a proxy outside it); \
                 without root, run the install under `unshare --user --net` for no network at all"
            );
        }
        let home = env.iter().find(|(name, _)| name == "HOME").map(|(_, home)| Path::new(home).to_owned());
        // The npmrc files npm reads, for their `registry=` lines: the project's and the user's.
        let npmrcs: Vec<String> =
            [std::env::current_dir().ok().map(|dir| dir.join(".npmrc")), home.map(|home| home.join(".npmrc"))]
                .into_iter()
                .flatten()
                .filter_map(|path| std::fs::read_to_string(path).ok())
                .collect();
        let allowed =
            Allowed::new(rules, env.iter().map(|(name, value)| (name.as_os_str(), value.as_os_str())), &npmrcs);
        let (namespace, listener, tables) = std::thread::spawn(new_namespace)
            .join()
            .map_err(|_| anyhow::anyhow!("the thread creating the box's network namespace panicked"))?
            .context("--contain-net: creating the box's network namespace")?;
        let listen = listener.local_addr().context("--contain-net: the proxy's address")?;
        let sockets = BoxSockets {
            tables: Mutex::new(tables),
            namespace: File::from(namespace.try_clone()?).metadata()?.ino(),
            listen_port: listen.port(),
        };
        let proxy_url = format!("http://{listen}");
        let no_proxy = decide::no_proxy(&allowed);
        let mut variables: Vec<(String, String)> = [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            // Over a proxy an npmrc names (which the box cannot reach), and yarn 2+'s own.
            "npm_config_proxy",
            "npm_config_https_proxy",
            "YARN_HTTP_PROXY",
            "YARN_HTTPS_PROXY",
        ]
        .iter()
        .map(|name| ((*name).to_owned(), proxy_url.clone()))
        .collect();
        variables
            .extend(["NO_PROXY", "no_proxy", "npm_config_noproxy"].map(|name| (name.to_owned(), no_proxy.clone())));
        let configured: Vec<String> = allowed.configured().iter().map(Endpoint::authority).collect();
        tracing::info!(
            "contained: the network is credwatch's proxy alone ({listen} in the box), to the usual registries{}",
            if configured.is_empty() {
                String::new()
            } else {
                format!(" and the configured ones ({})", configured.join(", "))
            }
        );
        let (tell, refusals) = mpsc::channel();
        Proxy::new(allowed, sockets, tell).start(listener)?;
        self.network = Some(Joined { namespace, env: variables });
        Ok(Network { refusals })
    }

    /// Variables to set in CMD's environment.
    pub fn added_env(&self) -> &[(String, String)] {
        self.network.as_ref().map_or(&[], |joined| &joined.env)
    }

    /// In the child (async-signal-safe): joins the box's network namespace.
    pub(super) fn join_network(&self) -> Result<(), Failure> {
        let Some(joined) = &self.network else { return Ok(()) };
        // SAFETY: setns(2) on an fd that lives as long as `self`.
        check(unsafe { libc::setns(joined.namespace.as_raw_fd(), libc::CLONE_NEWNET) }, STEP_NET)
    }
}

/// On a thread of its own (the namespace stays with it): a new network namespace with `lo` up,
/// the proxy's listener in it, its fd and its TCP tables.
fn new_namespace() -> io::Result<(OwnedFd, TcpListener, [File; 2])> {
    // SAFETY: unshare(2) takes no pointer; it changes this thread's namespace only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    loopback_up()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let namespace = OwnedFd::from(File::open("/proc/thread-self/ns/net")?);
    let tables = [File::open("/proc/thread-self/net/tcp")?, File::open("/proc/thread-self/net/tcp6")?];
    Ok((namespace, listener, tables))
}

/// Brings `lo` of this thread's network namespace up (a new one's is down).
fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket for the ioctls, closed by OwnedFd.
    let socket = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if socket < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd of ours.
    let socket = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(socket) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (to, from) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *to = *from as libc::c_char;
    }
    // SAFETY: the ioctls read and write the ifreq we own.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) < 0 {
            return Err(io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
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
