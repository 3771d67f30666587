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
    io,
    net::TcpListener,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::Path,
    sync::mpsc,
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    contain::net::{self as decide, Allowed, Endpoint},
    event::{Connect, Event, EventData},
    rules::RuleSet,
};

use super::{
    check,
    proxy::{BoxSockets, Proxy, Refusal},
    Containment, Failure,
};

/// The step of [`Containment::enter`] that joins the box's network namespace.
pub const STEP_NET: u32 = u32::MAX - 20;
/// What the box joins, and the environment that points its clients at the proxy.
pub(super) struct Joined {
    namespace: OwnedFd,
    env: Vec<(String, String)>,
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
        let sockets = BoxSockets::new(tables, File::from(namespace.try_clone()?).metadata()?.ino(), listen.port());
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
