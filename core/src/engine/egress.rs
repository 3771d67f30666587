//! Egress of package code: connects (TCP, UDP, unix) and the DNS names looked up before them.
//!
//! Per tree, the engine remembers the credential files its package code opened (any credential
//! rule's target, at whatever severity it alerted, including low; not opens that an actor
//! allowed, such as npm reading its own `~/.npmrc`). Per process, it remembers the names the
//! process looked up (its own DNS queries, not its tree's: a name looked up by the manager must
//! not vouch for a package's connect to an address literal).
//!
//! A connect is named by the **most recent name that the same process looked up before it**
//! (queries are seen, answers are not: a process that looks up a usual name and then connects
//! to an address literal is taken at its word). Destinations are judged by that name when there
//! is one, else by address, against the tree's usual destinations (`network` in the rules).
//! Connects to port 53 are the lookups themselves and unix sockets stay on the machine: neither
//! is "elsewhere".

use std::collections::{BTreeMap, VecDeque};

use super::{
    alerts::{Judgement, Stop},
    process::Proc,
    Engine, Id,
};
use crate::{
    alert::{Alert, AlertBlindSpot, AlertDestination},
    event::{Connect, DnsQuery, Event},
    rules::{
        schema::{ConnectMatch, SocketPath},
        Rule,
    },
};

/// Credential files remembered per tree (the first ones; the alert lists them).
const MAX_TOUCHED: usize = 32;
/// Names remembered per process, most recent last.
const MAX_LOOKUPS: usize = 8;
/// Processes and trees with egress state; past it the oldest entries go first (their exits
/// were probably lost).
const MAX_ENTRIES: usize = 4096;
const DNS_PORT: u16 = 53;

#[derive(Default)]
pub(super) struct Egress {
    /// By root id: the first credential files members of the tree opened (see `touched`).
    touched: BTreeMap<Id, Vec<String>>,
    /// By process id: the names it looked up, most recent last.
    lookups: BTreeMap<Id, VecDeque<String>>,
    /// By root id: trees a process of which the kernel could not mark (its table was full), so
    /// it ran unwatched: they count as having touched credentials.
    unwatched: BTreeMap<Id, AlertBlindSpot>,
}

impl Egress {
    /// A member of the tree of `root` opened the credential file `path`, and no actor allowed it.
    pub(super) fn touched(&mut self, root: Id, path: &str) {
        let files = self.touched.entry(root).or_default();
        if files.len() < MAX_TOUCHED && !files.iter().any(|f| f == path) {
            files.push(path.to_owned());
        }
        while self.touched.len() > MAX_ENTRIES {
            self.touched.pop_first();
        }
    }

    fn looked_up(&mut self, id: Id, name: &str) {
        let names = self.lookups.entry(id).or_default();
        // glibc asks for A and AAAA of the same name back to back.
        if names.back().is_some_and(|last| last == name) {
            return;
        }
        if names.len() >= MAX_LOOKUPS {
            names.pop_front();
        }
        names.push_back(name.to_owned());
        while self.lookups.len() > MAX_ENTRIES {
            self.lookups.pop_first();
        }
    }

    fn last_lookup(&self, id: Id) -> Option<&str> {
        self.lookups.get(&id).and_then(|names| names.back()).map(String::as_str)
    }

    /// A process of the tree of `root` ran unwatched (`spot`: the kernel's table was full).
    pub(super) fn unwatched(&mut self, root: Id, spot: AlertBlindSpot) {
        self.unwatched.insert(root, spot);
        while self.unwatched.len() > MAX_ENTRIES {
            self.unwatched.pop_first();
        }
    }

    /// Forgets a process (its pid was reused, or it left the table).
    pub(super) fn forget(&mut self, id: Id) {
        self.lookups.remove(&id);
        self.touched.remove(&id);
        self.unwatched.remove(&id);
    }
}

/// One connect, as rules see it.
struct Destination<'a> {
    connect: &'a Connect,
    name: Option<&'a str>,
}

impl Engine {
    pub(super) fn dns_query(&mut self, event: &Event, query: &DnsQuery) -> Vec<Alert> {
        if let Some(id) = self.live(event.pid) {
            self.egress.looked_up(id, &query.name);
        }
        Vec::new()
    }

    pub(super) fn connect(&mut self, event: &Event, connect: &Connect) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else { return Vec::new() };
        let p = &self.procs[&id];
        // Connect rules are about package code: an agent talks to its model's API and to
        // whatever the developer asked for.
        if super::process::agent_tree(p).is_some() {
            return Vec::new();
        }
        let name = connect.proxy_refused.as_deref().filter(|host| host.parse::<std::net::IpAddr>().is_err());
        let destination = Destination { connect, name: name.or_else(|| self.egress.last_lookup(id)) };
        let mut hits = Vec::new();
        for &index in self.rules.connect_rules() {
            let rule = &self.rules.rules()[index];
            let Some(m) = &rule.connect else { continue };
            if !self.connect_matches(p, m, &destination) || !self.conditions_hold(&rule.conditions, p, false) {
                continue;
            }
            let Some(judgement) = self.verdict(p, rule, false, None) else { continue };
            let mut alert = self.connect_alert(event, id, rule, judgement, &destination, m.after_credential);
            alert.credwatch.count = super::alerts::repeated(connect.repeats);
            hits.push((index, alert));
        }
        let subject = format!(
            "{}\0{}\0{}",
            destination.name.unwrap_or_default(),
            (connect.address.as_deref().or(connect.path.as_deref()))
                .or(connect.proxy_refused.as_deref())
                .unwrap_or_default(),
            connect.port.unwrap_or_default()
        );
        let tree = p.tree;
        hits.into_iter()
            .filter_map(|(index, alert)| self.deliver(tree, index, subject.clone(), alert, event.time_ns))
            .collect()
    }

    fn connect_matches(&self, p: &Proc, m: &ConnectMatch, to: &Destination) -> bool {
        let connect = to.connect;
        if m.proxy_refused != connect.proxy_refused.is_some() {
            return false;
        }
        let ip = connect.address.as_deref().filter(|_| matches!(connect.family.as_str(), "inet" | "inet6"));
        if !m.unix_paths.is_empty() {
            let Some(path) = connect.path.as_deref().filter(|_| connect.family == "unix") else { return false };
            let hit = m.unix_paths.iter().any(|pattern| match pattern {
                SocketPath::SshAuthSock => p.ssh_auth_sock.as_deref() == Some(path),
                SocketPath::Glob { matcher, .. } => matcher.is_match(path),
            });
            if !hit {
                return false;
            }
        }
        if !m.addresses.is_empty() || !m.names.is_empty() {
            let by_address = ip.is_some_and(|ip| m.addresses.iter().any(|cidr| cidr.contains(ip)));
            let by_name = ip.is_some() && to.name.is_some_and(|name| m.names.iter().any(|n| n.matcher.is_match(name)));
            if !by_address && !by_name {
                return false;
            }
        }
        if !m.ports.is_empty() && !connect.port.is_some_and(|port| m.ports.contains(&port)) {
            return false;
        }
        if m.unusual {
            let Some(ip) = ip else { return false };
            if connect.port == Some(DNS_PORT) || self.usual(p, ip, to.name) {
                return false;
            }
        }
        if m.after_credential
            && self.egress.touched.get(&p.tree).is_none_or(Vec::is_empty)
            && !self.egress.unwatched.contains_key(&p.root)
        {
            return false;
        }
        true
    }

    /// A usual destination of `p`'s tree: by the name looked up when there is one, else by
    /// address.
    fn usual(&self, p: &Proc, ip: &str, name: Option<&str>) -> bool {
        let mut usual = self.rules.usual_destinations(self.manager_name(p));
        match name {
            Some(name) => usual.any(|u| u.names.iter().any(|pattern| pattern.matcher.is_match(name))),
            None => usual.any(|u| u.addresses.iter().any(|cidr| cidr.contains(ip))),
        }
    }

    fn connect_alert(
        &self,
        event: &Event,
        id: Id,
        rule: &Rule,
        judgement: Judgement,
        to: &Destination,
        with_credentials: bool,
    ) -> Alert {
        let connect = to.connect;
        let p = &self.procs[&id];
        // Blocked: the kernel held the process at the connect, and the agent kills it on this
        // verdict (see docs/src/catches.md); nothing it would send after the connect leaves.
        let blocked = connect.held && rule.action == crate::rules::schema::Action::Kill;
        // Refused by the box's proxy: the process lives, and nothing left.
        let refused = connect.proxy_refused.is_some();
        let stop = match (blocked, refused) {
            (true, _) => Stop::Killed,
            (false, true) => Stop::Denied,
            (false, false) => Stop::None,
        };
        let mut alert = self.alert(event.time_ns, id, rule, judgement, "connect", stop, None);
        if blocked {
            alert.credwatch.enforcement = "kernel-hold".into();
            if connect.fail_closed {
                super::matching::fail_closed(&mut alert);
            }
        } else if refused {
            alert.credwatch.enforcement = "proxy".into();
        }
        alert.destination = Some(AlertDestination {
            address: (connect.address.clone().or_else(|| connect.path.clone()))
                .or_else(|| connect.proxy_refused.clone())
                .unwrap_or_default(),
            port: connect.port,
            domain: to.name.map(str::to_owned),
            family: connect.family.clone(),
            socket_type: connect.socket_type.clone(),
        });
        if with_credentials {
            alert.credwatch.credentials_touched = self.egress.touched.get(&p.tree).cloned().unwrap_or_default();
            alert.credwatch.blind_spot = self.egress.unwatched.get(&p.root).cloned();
        }
        // A socket `run --contain` shut (an empty file bound over it): the connect was refused,
        // so the agent behind it signed nothing.
        if connect.path.as_ref().is_some_and(|path| self.options.contained.contains(path)) {
            alert.credwatch.contained = true;
            alert.credwatch.rotate = Vec::new();
        }
        alert
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{
        alert::Severity,
        engine::EngineOptions,
        event::{EventData, Exec, Open},
        rules::{schema::Cidr, RuleSet, RulesError},
    };

    /// An engine over `rules` fed hand-written events, one microsecond apart.
    struct Run {
        engine: Engine,
        time_ns: u64,
    }

    impl Run {
        fn new(rules: RuleSet) -> Run {
            Run::with(rules, EngineOptions::default())
        }

        fn with(rules: RuleSet, options: EngineOptions) -> Run {
            Run { engine: Engine::new(rules, EngineOptions { host_name: "box".into(), ..options }), time_ns: 1 }
        }

        fn send(&mut self, pid: u32, data: EventData) -> Vec<Alert> {
            self.time_ns += 1_000;
            self.engine.handle(&Event { time_ns: self.time_ns, pid, data })
        }

        fn exec(&mut self, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) {
            if ppid != 0 {
                self.send(ppid, EventData::Fork(crate::event::Fork { child_pid: pid }));
            }
            let exec = Exec {
                ppid,
                filename: args[0].into(),
                executable: args[0].into(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                cwd: "/home/alice/app".into(),
                env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                ..Exec::default()
            };
            self.send(pid, EventData::Exec(exec));
        }

        fn open(&mut self, pid: u32, path: &str) -> Vec<Alert> {
            let open = Open { tid: pid, syscall: "openat".into(), dirfd: -100, path: path.into(), ..Open::default() };
            self.send(pid, EventData::Open(Open { abs_path: Some(path.into()), ret: 3, ..open }))
        }

        fn lookup(&mut self, pid: u32, name: &str) {
            let query = DnsQuery { tid: pid, name: name.into(), qtype: "A".into(), server: None };
            assert!(self.send(pid, EventData::DnsQuery(query)).is_empty());
        }

        fn connect(&mut self, pid: u32, address: &str, port: u16, held: bool) -> Vec<Alert> {
            let family = if address.contains(':') { "inet6" } else { "inet" };
            let connect = Connect {
                tid: pid,
                family: family.into(),
                address: Some(address.into()),
                port: Some(port),
                held,
                ..Connect::default()
            };
            self.send(pid, EventData::Connect(connect))
        }

        /// npm (100) and a postinstall (101) under it.
        fn npm_with_postinstall(rules: RuleSet) -> Run {
            let mut run = Run::new(rules);
            run.exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]);
            run.exec(
                101,
                100,
                &["node", "install.js"],
                &[("npm_package_name", "evil"), ("npm_lifecycle_event", "postinstall")],
            );
            run
        }
    }

    fn ids(alerts: &[Alert]) -> Vec<&str> {
        alerts.iter().map(|a| a.rule.id.as_str()).collect()
    }

    #[test]
    fn a_connect_is_named_by_its_own_process_lookups_not_its_trees() {
        let mut run = Run::npm_with_postinstall(RuleSet::defaults().unwrap());
        // The manager's lookup of the registry does not vouch for the package's address literal.
        run.lookup(100, "registry.npmjs.org");
        run.open(101, "/home/alice/.aws/credentials");
        let alerts = run.connect(101, "203.0.113.5", 443, false);
        assert_eq!(ids(&alerts), ["exfiltration"]);
        let alert = &alerts[0];
        let destination = alert.destination.as_ref().unwrap();
        assert_eq!(
            (destination.address.as_str(), destination.port, destination.domain.as_deref()),
            ("203.0.113.5", Some(443), None)
        );
        assert_eq!(alert.credwatch.credentials_touched, ["/home/alice/.aws/credentials"]);
        // Its own lookup of a usual name is taken at its word; of another, it names the alert.
        run.lookup(101, "registry.npmjs.org");
        assert!(run.connect(101, "104.16.1.35", 443, false).is_empty());
        run.lookup(101, "paste.example.invalid");
        let alerts = run.connect(101, "104.16.1.35", 443, false);
        assert_eq!(alerts[0].destination.as_ref().unwrap().domain.as_deref(), Some("paste.example.invalid"));
    }

    #[test]
    fn a_name_looked_up_decides_even_on_loopback_and_no_name_on_loopback_is_local() {
        let mut run = Run::npm_with_postinstall(RuleSet::defaults().unwrap());
        run.open(101, "/home/alice/.npmrc");
        assert!(run.connect(101, "127.0.0.1", 3000, false).is_empty());
        assert!(run.connect(101, "::1", 3000, false).is_empty());
        assert!(run.connect(101, "10.0.0.2", 53, false).is_empty(), "the resolver is not elsewhere");
        run.lookup(101, "collector.exfil.invalid");
        assert_eq!(ids(&run.connect(101, "127.0.0.9", 8080, false)), ["exfiltration"]);
    }

    #[test]
    fn reads_an_actor_allows_do_not_count_low_ones_do() {
        let mut run = Run::npm_with_postinstall(RuleSet::defaults().unwrap());
        assert!(run.open(100, "/home/alice/.npmrc").is_empty(), "npm reading its own token is allowed");
        run.lookup(101, "collector.exfil.invalid");
        assert!(run.connect(101, "198.51.100.1", 443, false).is_empty());
        // `npm whoami` started by package code reads the token at low: that counts.
        run.exec(102, 101, &["npm", "whoami"], &[]);
        let low = run.open(102, "/home/alice/.npmrc");
        assert_eq!(low.iter().map(|a| a.rule.severity).collect::<Vec<_>>(), [Severity::Low]);
        assert_eq!(ids(&run.connect(101, "198.51.100.1", 443, false)), ["exfiltration"]);
    }

    #[test]
    fn a_proxy_refusal_is_its_own_rule_alone_and_names_the_host_asked_for() {
        let mut run = Run::npm_with_postinstall(RuleSet::defaults().unwrap());
        // After a credential read, to the metadata address: still no exfiltration nor
        // cloud-metadata alert, since the connection went no further than the proxy.
        run.open(101, "/home/alice/.ssh/id_ed25519");
        let mut refused = |host: &str, address: Option<&str>, port: u16| {
            let connect = Connect {
                family: "inet".into(),
                address: address.map(str::to_owned),
                port: Some(port),
                proxy_refused: Some(host.into()),
                ..Connect::default()
            };
            run.send(101, EventData::Connect(connect))
        };
        let by_address = refused("169.254.169.254", Some("169.254.169.254"), 80);
        assert_eq!(ids(&by_address), ["contain-net-refused"]);
        let (outcome, enforcement) = (&by_address[0].event.outcome, &by_address[0].credwatch.enforcement);
        assert_eq!((outcome.as_str(), enforcement.as_str()), ("denied", "proxy"));
        let destination = by_address[0].destination.as_ref().unwrap();
        assert_eq!((destination.address.as_str(), destination.domain.as_deref()), ("169.254.169.254", None));
        let by_name = refused("collector.exfil.invalid", None, 443);
        assert_eq!(ids(&by_name), ["contain-net-refused"]);
        let destination = by_name[0].destination.as_ref().unwrap();
        assert_eq!(destination.domain.as_deref(), Some("collector.exfil.invalid"));
        assert_eq!(destination.port, Some(443));
        // Another host is another alert; each repeat is told too, with its count, as what the
        // kernel denied is.
        assert_eq!(ids(&refused("127.0.0.11", Some("127.0.0.11"), 80)), ["contain-net-refused"]);
        assert_eq!(refused("collector.exfil.invalid", None, 443)[0].credwatch.count, Some(2));
    }

    #[test]
    fn a_held_connect_is_blocked_by_a_kill_rule_and_told_once_per_destination() {
        let mut run = Run::npm_with_postinstall(RuleSet::defaults().unwrap());
        run.open(101, "/home/alice/.ssh/id_ed25519");
        run.lookup(101, "collector.exfil.invalid");
        let alerts = run.connect(101, "127.0.0.9", 8080, true);
        assert_eq!(ids(&alerts), ["exfiltration"]);
        assert_eq!(
            (alerts[0].event.outcome.as_str(), alerts[0].credwatch.enforcement.as_str()),
            ("blocked", "kernel-hold")
        );
        // Not held (no --enforce): alerted, and a repeat to the same destination is folded.
        let mut run = Run::npm_with_postinstall(RuleSet::defaults().unwrap());
        run.open(101, "/home/alice/.npmrc");
        run.lookup(101, "collector.exfil.invalid");
        assert_eq!(run.connect(101, "127.0.0.9", 8080, false)[0].event.outcome, "alerted");
        assert!(run.connect(101, "127.0.0.9", 8080, false).is_empty());
    }

    #[test]
    fn the_ssh_agent_socket_is_the_processes_own() {
        let mut run = Run::new(RuleSet::defaults().unwrap());
        run.exec(100, 1, &["npm", "install"], &[("SSH_AUTH_SOCK", "/run/user/1000/gcr/ssh")]);
        run.exec(101, 100, &["node", "x.js"], &[]);
        let unix =
            |path: &str| Connect { tid: 101, family: "unix".into(), path: Some(path.into()), ..Connect::default() };
        assert!(run.send(101, EventData::Connect(unix("/run/user/1000/bus"))).is_empty());
        let alerts = run.send(101, EventData::Connect(unix("/run/user/1000/gcr/ssh")));
        assert_eq!(ids(&alerts), ["ssh-agent-socket"]);
        assert!(!alerts[0].credwatch.contained && !alerts[0].credwatch.rotate.is_empty());
    }

    #[test]
    fn a_connect_to_a_socket_the_box_shut_is_contained_and_has_nothing_to_rotate() {
        let contained = ["/tmp/ssh-XXXXabcd/agent.4242".to_owned()].into();
        let mut run = Run::with(RuleSet::defaults().unwrap(), EngineOptions { contained, ..EngineOptions::default() });
        run.exec(100, 1, &["npm", "install"], &[]);
        run.exec(101, 100, &["node", "x.js"], &[]);
        let unix =
            |path: &str| Connect { tid: 101, family: "unix".into(), path: Some(path.into()), ..Connect::default() };
        let alerts = run.send(101, EventData::Connect(unix("/tmp/ssh-XXXXabcd/agent.4242")));
        assert_eq!(ids(&alerts), ["ssh-agent-socket"]);
        assert!(alerts[0].credwatch.contained && alerts[0].credwatch.rotate.is_empty(), "{:?}", alerts[0].credwatch);
        let text = crate::output::render(&alerts[0], false);
        assert!(text.contains("contained: the box shut the socket"), "{text}");
    }

    #[test]
    fn addresses_match_by_prefix_and_mapped_ipv4_counts_as_ipv4() {
        let cidr = |text: &str| Cidr::try_from(text.to_owned()).unwrap();
        assert!(cidr("127.0.0.0/8").contains("127.0.0.9"));
        assert!(cidr("127.0.0.0/8").contains("::ffff:127.0.0.9"));
        assert!(!cidr("127.0.0.0/8").contains("128.0.0.1"));
        assert!(cidr("169.254.169.254").contains("169.254.169.254"));
        assert!(!cidr("169.254.169.254").contains("169.254.169.253"));
        assert!(cidr("fd00:ec2::254").contains("fd00:ec2::254"));
        assert!(cidr("::/0").contains("2001:db8::1") && !cidr("::/0").contains("10.0.0.1"));
        assert!(cidr("0.0.0.0/0").contains("10.0.0.1"));
        assert!(!cidr("10.0.0.0/8").contains("not an address"));
        for bad in ["10.0.0.0/33", "::/129", "host.example", "10.0.0.0/x"] {
            assert!(Cidr::try_from(bad.to_owned()).is_err(), "{bad}");
        }
    }

    fn load(dir: &Path, text: &str) -> Result<RuleSet, RulesError> {
        std::fs::write(dir.join("extra.yaml"), text).unwrap();
        RuleSet::load(Some(dir))
    }

    #[test]
    fn a_rules_dir_extends_the_usual_destinations() {
        let dir = tempfile::tempdir().unwrap();
        let extra = "schema: 1\nnetwork:\n  - managers: [npm]\n    names: [\"*.corp.example\"]\n";
        let rules = load(dir.path(), extra).unwrap();
        let mut run = Run::npm_with_postinstall(rules);
        run.open(101, "/home/alice/.npmrc");
        run.lookup(101, "npm.mirror.corp.example");
        assert!(run.connect(101, "10.1.2.3", 443, false).is_empty());
        // The defaults still hold.
        run.lookup(101, "registry.npmjs.org");
        assert!(run.connect(101, "104.16.1.35", 443, false).is_empty());
    }

    #[test]
    fn bad_network_and_connect_parts_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let error = load(dir.path(), "schema: 1\nnetwork:\n  - managers: [nmp]\n    names: [x.example]\n").unwrap_err();
        assert!(
            error.to_string().contains("extra.yaml:3:5") && error.to_string().contains("unknown manager \"nmp\""),
            "{error}"
        );
        let error = load(dir.path(), "schema: 1\nnetwork:\n  - addresses: [\"10.0.0.0/40\"]\n").unwrap_err();
        assert!(error.to_string().contains("extra.yaml:3") && error.to_string().contains("bad address"), "{error}");
        let error = load(dir.path(), "schema: 1\nnetwork:\n  - hosts: [x]\n").unwrap_err();
        assert!(error.to_string().contains("unknown field `hosts`"), "{error}");
        let rule = |connect: &str| {
            format!("schema: 1\nrules:\n  - id: r\n    name: n\n    description: d\n    category: c\n    severity: high\n    connect: {connect}\n    samples:\n      positive: [{{root: {{pid: 1}}}}]\n      negative: [{{root: {{pid: 1}}}}]\n")
        };
        let error = load(dir.path(), &rule("{unix_paths: [/run/x.sock], unusual: true}")).unwrap_err();
        assert!(error.to_string().contains("`unix_paths` cannot go with"), "{error}");
        let error = load(dir.path(), &rule("{}")).unwrap_err();
        assert!(error.to_string().contains("a connect match needs"), "{error}");
        let error = load(dir.path(), &rule("{unix_paths: [docker.sock]}")).unwrap_err();
        assert!(error.to_string().contains("must be absolute"), "{error}");
    }
}
