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

use super::{Engine, Id, Judgement, Proc};
use crate::{
    alert::{Alert, AlertDestination},
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
    /// By root id: credential files package code of the tree opened, and whether more were.
    touched: BTreeMap<Id, Vec<String>>,
    /// By process id: the names it looked up, most recent last.
    lookups: BTreeMap<Id, VecDeque<String>>,
}

impl Egress {
    /// Package code of the tree of `root` opened the credential file `path`.
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

    /// Forgets a process (its pid was reused, or it left the table).
    pub(super) fn forget(&mut self, id: Id) {
        self.lookups.remove(&id);
        self.touched.remove(&id);
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
        let destination = Destination { connect, name: self.egress.last_lookup(id) };
        let mut hits = Vec::new();
        for &index in self.rules.connect_rules() {
            let rule = &self.rules.rules()[index];
            let Some(m) = &rule.connect else { continue };
            if !self.connect_matches(p, m, &destination) || !self.conditions_hold(&rule.conditions, p, false) {
                continue;
            }
            let Some(judgement) = self.verdict(p, rule, false, None) else { continue };
            hits.push((index, self.connect_alert(event, id, rule, judgement, &destination, m.after_credential)));
        }
        let subject = format!(
            "{}\0{}\0{}",
            destination.name.unwrap_or_default(),
            connect.address.as_deref().or(connect.path.as_deref()).unwrap_or_default(),
            connect.port.unwrap_or_default()
        );
        let tree = p.tree;
        hits.into_iter()
            .filter_map(|(index, alert)| self.deliver(tree, index, subject.clone(), alert, event.time_ns))
            .collect()
    }

    fn connect_matches(&self, p: &Proc, m: &ConnectMatch, to: &Destination) -> bool {
        let connect = to.connect;
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
        if m.after_credential && self.egress.touched.get(&p.tree).is_none_or(Vec::is_empty) {
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
        // verdict (see the README); nothing it would send after the connect leaves.
        let blocked = connect.held && rule.action == crate::rules::schema::Action::Kill;
        let mut alert = self.alert(event, id, rule, judgement, "connect", blocked, None);
        if blocked {
            alert.credwatch.enforcement = "kernel-hold".into();
        }
        alert.destination = Some(AlertDestination {
            address: connect.address.clone().or_else(|| connect.path.clone()).unwrap_or_default(),
            port: connect.port,
            domain: to.name.map(str::to_owned),
            family: connect.family.clone(),
        });
        if with_credentials {
            alert.credwatch.credentials_touched = self.egress.touched.get(&p.tree).cloned().unwrap_or_default();
        }
        alert
    }
}
