//! `watch`'s socket: each connection's peer is known by SO_PEERCRED and sees only what it may;
//! live alerts reach each client through its own bounded queue and writer thread, so a client
//! that stops reading is dropped and never slows the agent.

use std::{
    collections::HashSet,
    fs,
    io::{self, BufReader, Write as _},
    os::{
        fd::AsRawFd as _,
        unix::{
            fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
            net::{UnixListener, UnixStream},
        },
    },
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc::{self, RecvTimeoutError, SyncSender, TrySendError},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use credwatch_core::{alert::Alert, engine::SelftestRoots, output::escape};
use prometheus_client::metrics::counter::Counter;
use tracing::{debug, warn};

use super::{
    log,
    protocol::{self, AlertsRequest, Logged, Reply, Request},
};

/// Alert lines a client may have waiting before it is dropped.
pub const CLIENT_QUEUE: usize = 1024;
/// Clients at once.
pub const MAX_CLIENTS: usize = 64;
/// The most logged alerts one request gets (the latest).
pub const MAX_HISTORY: usize = 10_000;
/// The group whose members see every alert, as root does.
pub const GROUP: &str = "credwatch";
/// How long a new connection has to send its request.
const REQUEST_WITHIN: Duration = Duration::from_secs(10);
/// How often an idle follower's connection is checked for a client that went away.
const IDLE_CHECK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the alerts socket {}: {what}", escape(&.path.display().to_string()))]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the alerts socket {}: another credwatch serves it", escape(&.0.display().to_string()))]
    InUse(PathBuf),
}

/// The peer of a connection, from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Who sees what: root and group `credwatch` everything, anyone else its own uid's alerts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sees {
    All,
    Uid(u32),
}

impl Sees {
    pub fn alert(self, alert: &Alert) -> bool {
        match self {
            Sees::All => true,
            Sees::Uid(uid) => alert.user.id == uid,
        }
    }
}

struct Client {
    id: u64,
    peer: Peer,
    sees: Sees,
    queue: SyncSender<Arc<str>>,
    /// To cut a dropped client's writer short in a blocked write.
    stream: UnixStream,
}

struct State {
    clients: Vec<Client>,
    last_seq: u64,
    next_id: u64,
}

struct Shared {
    state: Mutex<State>,
    log: PathBuf,
    roots: SelftestRoots,
    dropped: Counter,
    /// Connections being served, followers or not.
    connections: AtomicUsize,
}

/// The socket, served by its own threads until dropped.
pub struct Server {
    path: PathBuf,
    shared: Arc<Shared>,
    listener: UnixListener,
    accepting: Option<thread::JoinHandle<()>>,
}

impl Server {
    /// Binds `path` (its directory made 0755, the socket 0666), for the log at `log` whose last
    /// seq is `last_seq`. `dropped` counts the clients dropped for not reading; `roots` takes
    /// the self-test registrations.
    pub fn start(
        path: &Path,
        log: &Path,
        last_seq: u64,
        roots: SelftestRoots,
        dropped: Counter,
    ) -> Result<Server, ServeError> {
        let error = |what| move |source| ServeError::Io { path: path.to_owned(), what, source };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(error("creating its directory"))?;
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(ServeError::InUse(path.to_owned())),
            // A socket left by an agent that died.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                fs::remove_file(path).map_err(error("removing a stale socket"))?
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(path).map_err(error("binding it"))?;
        // Anyone may connect: what each sees is decided by its credentials.
        fs::set_permissions(path, fs::Permissions::from_mode(0o666)).map_err(error("making it 0666"))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State { clients: Vec::new(), last_seq, next_id: 0 }),
            log: log.to_owned(),
            roots,
            dropped,
            connections: AtomicUsize::new(0),
        });
        let accepting = {
            let (listener, shared) = (listener.try_clone().map_err(error("binding it"))?, Arc::clone(&shared));
            thread::Builder::new()
                .name("alerts-socket".into())
                .spawn(move || accept(&listener, &shared))
                .map_err(error("starting its thread"))?
        };
        Ok(Server { path: path.to_owned(), shared, listener, accepting: Some(accepting) })
    }

    /// Hands the alert logged as `seq` (its log line, newline included) to every client that
    /// may see it, without waiting for any: a client whose queue is full is dropped.
    pub fn publish(&self, seq: u64, alert: &Alert, line: &str) {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.last_seq = seq;
        let line: Arc<str> = Arc::from(line);
        let dropped = &self.shared.dropped;
        state.clients.retain(|client| {
            if !client.sees.alert(alert) {
                return true;
            }
            match client.queue.try_send(Arc::clone(&line)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    let Peer { pid, uid, .. } = client.peer;
                    warn!(pid, uid, "dropped an alerts client (pid {pid}, uid {uid}): it stopped reading and {CLIENT_QUEUE} alerts were waiting for it");
                    dropped.inc();
                    let _ = client.stream.shutdown(std::net::Shutdown::Both);
                    false
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: shutdown(2) on the listening socket we own: the accept thread's accept returns.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
        let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        for client in &state.clients {
            let _ = client.stream.shutdown(std::net::Shutdown::Both);
        }
        let _ = fs::remove_file(&self.path);
    }
}

fn accept(listener: &UnixListener, shared: &Arc<Shared>) {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if matches!(error.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {
                continue
            }
            Err(error) if error.raw_os_error() == Some(libc::EMFILE) || error.raw_os_error() == Some(libc::ENFILE) => {
                warn!("the alerts socket: {error}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
            // Shut down by the server's drop.
            Err(_) => return,
        };
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            refuse(&stream, "too many clients");
            continue;
        }
        let shared = Arc::clone(shared);
        let spawned = thread::Builder::new().name("alerts-client".into()).spawn(move || {
            serve(stream, &shared);
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(error) = spawned {
            warn!("the alerts socket: starting a client's thread: {error}");
        }
    }
}

fn refuse(mut stream: &UnixStream, why: &str) {
    let _ = stream.write_all(Reply::Error(why.to_owned()).line().as_bytes());
}

/// One connection: its request, then what it asked for.
fn serve(stream: UnixStream, shared: &Shared) {
    let peer = match peer_of(&stream) {
        Ok(peer) => peer,
        Err(error) => {
            warn!("the alerts socket: SO_PEERCRED: {error}");
            return refuse(&stream, "credwatch could not tell who you are");
        }
    };
    let Ok(reading) = stream.try_clone() else { return refuse(&stream, "credwatch could not serve you") };
    let _ = reading.set_read_timeout(Some(REQUEST_WITHIN));
    let line = match protocol::read_line(&mut BufReader::new(reading), &mut Vec::new()) {
        Ok(Some(line)) => line,
        Ok(None) => return,
        Err(error) => return refuse(&stream, &format!("no request: {error}")),
    };
    match protocol::parse_request(&line) {
        Err(why) => refuse(&stream, &why),
        Ok(Request::Selftest(request)) => match register_selftest(peer, request.pid, &shared.roots) {
            Ok(()) => {
                let _ = (&stream).write_all(Reply::Selftest { ok: true }.line().as_bytes());
            }
            Err(why) => refuse(&stream, &why),
        },
        Ok(Request::Alerts(request)) => {
            let sees = sees(peer);
            debug!(pid = peer.pid, uid = peer.uid, "alerts client: {request:?}, sees {sees:?}");
            send_alerts(stream, peer, sees, &request, shared);
        }
    }
}

fn send_alerts(stream: UnixStream, peer: Peer, sees: Sees, request: &AlertsRequest, shared: &Shared) {
    let (queue, receiver) = mpsc::sync_channel::<Arc<str>>(CLIENT_QUEUE);
    // Registered and the seq read at once: every later alert is in the queue, every earlier in
    // the history.
    let (id, last_seq) = {
        let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let id = state.next_id;
        state.next_id += 1;
        if request.follow {
            match stream.try_clone() {
                Ok(clone) => state.clients.push(Client { id, peer, sees, queue, stream: clone }),
                Err(_) => return refuse(&stream, "credwatch could not serve you"),
            }
        }
        (id, state.last_seq)
    };
    let sent = send_history(&stream, sees, request.since, last_seq, &shared.log)
        .and_then(|()| (&stream).write_all(Reply::CaughtUp { last_seq }.line().as_bytes()));
    if sent.is_ok() && request.follow {
        follow(&stream, &receiver);
    }
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    state.clients.retain(|client| client.id != id);
}

fn send_history(mut stream: &UnixStream, sees: Sees, since: Option<u64>, last_seq: u64, log: &Path) -> io::Result<()> {
    let Some(since) = since else { return Ok(()) };
    let logged = match log::read(log, since, &mut |why| warn!("{why}")) {
        Ok(logged) => logged,
        Err(error) => {
            warn!("{error}");
            Vec::new()
        }
    };
    let seen: Vec<Logged> =
        logged.into_iter().filter(|logged| logged.seq <= last_seq && sees.alert(&logged.alert)).collect();
    for logged in &seen[seen.len().saturating_sub(MAX_HISTORY)..] {
        let mut line = serde_json::to_string(logged).map_err(io::Error::other)?;
        line.push('\n');
        stream.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// Writes the queued alerts until the client goes away or is dropped.
fn follow(mut stream: &UnixStream, receiver: &mpsc::Receiver<Arc<str>>) {
    loop {
        match receiver.recv_timeout(IDLE_CHECK) {
            Ok(line) => {
                if stream.write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
            Err(RecvTimeoutError::Timeout) if gone(stream) => return,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Whether the client closed its connection; one that only shut its sending side (it has
/// nothing to say after its request) still follows.
fn gone(stream: &UnixStream) -> bool {
    let mut poll = libc::pollfd { fd: stream.as_raw_fd(), events: 0, revents: 0 };
    // SAFETY: poll(2) of one pollfd we own, without waiting.
    let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

fn peer_of(stream: &UnixStream) -> io::Result<Peer> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) SO_PEERCRED writes a ucred of at most `len` bytes into `cred`.
    let done = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &raw mut len)
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Peer { pid: cred.pid, uid: cred.uid, gid: cred.gid })
}

/// What `peer` may see: all when root or a member of [`GROUP`] (its group, a supplementary
/// group of its process, or listed for its user in /etc/group).
fn sees(peer: Peer) -> Sees {
    if peer.uid == 0 {
        return Sees::All;
    }
    let group = fs::read_to_string("/etc/group").unwrap_or_default();
    let Some((gid, members)) = group_entry(&group, GROUP) else { return Sees::Uid(peer.uid) };
    let status = fs::read_to_string(format!("/proc/{}/status", peer.pid)).unwrap_or_default();
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let user = user_name(&passwd, peer.uid);
    if peer.gid == gid
        || supplementary_groups(&status).contains(&gid)
        || user.is_some_and(|user| members.contains(&user))
    {
        Sees::All
    } else {
        Sees::Uid(peer.uid)
    }
}

/// The gid and members of the group `name` in group(5) text.
fn group_entry<'a>(text: &'a str, name: &str) -> Option<(u32, HashSet<&'a str>)> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields[..] {
            [group, _, gid, members] if group == name => {
                Some((gid.parse().ok()?, members.split(',').filter(|m| !m.is_empty()).collect()))
            }
            _ => None,
        }
    })
}

fn user_name(passwd: &str, uid: u32) -> Option<&str> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 3 && fields[2].parse() == Ok(uid)).then_some(fields[0])
    })
}

/// The `Groups:` of a /proc/PID/status text.
fn supplementary_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|groups| groups.split_whitespace().filter_map(|gid| gid.parse().ok()).collect())
        .unwrap_or_default()
}

/// `credwatch selftest`'s registration of the tree rooted at `pid`: root's, or the owner's of
/// that process.
fn register_selftest(peer: Peer, pid: u32, roots: &SelftestRoots) -> Result<(), String> {
    let owner = fs::metadata(format!("/proc/{pid}")).map_err(|_| format!("no process {pid}"))?.uid();
    if peer.uid != 0 && peer.uid != owner {
        return Err(format!("process {pid} is not yours"));
    }
    roots.lock().unwrap_or_else(|e| e.into_inner()).insert(pid);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_gone_when_it_closed_not_when_it_only_stopped_sending() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        assert!(!gone(&ours));
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(!gone(&ours), "a half-closed client still reads");
        drop(theirs);
        assert!(gone(&ours));
    }

    #[test]
    fn the_credwatch_group_is_found_by_name_with_its_members() {
        let text = "root:x:0:\ncredwatchers:x:7:bob\ncredwatch:x:998:alice,carol\nbad line\n";
        let (gid, members) = group_entry(text, "credwatch").unwrap();
        assert_eq!(gid, 998);
        assert!(members.contains("alice") && members.contains("carol") && !members.contains("bob"));
        assert_eq!(group_entry("credwatch:x:999:\n", "credwatch").unwrap().1.len(), 0);
        assert!(group_entry(text, "nobody").is_none());
        assert_eq!(
            user_name("root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n", 1000),
            Some("alice")
        );
        assert_eq!(supplementary_groups("Uid:\t1\nGroups:\t4 24 998 \nNgid:\t0\n"), [4, 24, 998]);
        assert!(supplementary_groups("Groups:\t\n").is_empty());
    }
}
