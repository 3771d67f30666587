//! `run --contain --contain-net registries`: what the box's proxy lets through. The box has a
//! network namespace of its own whose only way out is credwatch's HTTP/CONNECT proxy; this
//! module decides, without I/O, which hosts the proxy reaches for it, and reads the heads of the
//! requests it gets. Those are bytes from the monitored system: lengths are bounded, nothing
//! panics.

use std::{ffi::OsStr, net::IpAddr, os::unix::ffi::OsStrExt as _};

use thiserror::Error;

use crate::rules::{schema::NamePattern, RuleSet};

/// Ports on which the rules' registry names are reached: HTTPS, and HTTP for the redirects to it.
pub const REGISTRY_PORTS: [u16; 2] = [443, 80];
/// Longest request head (request line and headers) read from a client.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most headers in a request head.
pub const MAX_HEADERS: usize = 64;
/// Longest host name, in its text form (RFC 1035).
const MAX_HOST: usize = 253;
/// Loopback, as `NO_PROXY` names it: the box's own, which its clients reach directly.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
/// Headers of a client's request meant for the proxy, or for one hop only: not sent on.
const HOP_HEADERS: [&str; 5] = ["proxy-connection", "proxy-authorization", "connection", "keep-alive", "te"];

/// A host (lowercase name without a final dot, or an IP address) and a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// `host:port`, with brackets around an IPv6 address.
    pub fn authority(&self) -> String {
        crate::net::host_port(&self.host, self.port)
    }

    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

/// The hosts the proxy reaches for the box.
#[derive(Clone, Debug, Default)]
pub struct Allowed {
    /// The rules' usual names (`network:`), on [`REGISTRY_PORTS`].
    names: Vec<NamePattern>,
    /// The user's configured registries, host and port exactly. Sorted.
    configured: Vec<Endpoint>,
}

impl Allowed {
    /// The rules' usual names of every manager (the proxy cannot tell which manager asks; their
    /// address ranges are left out, loopback included: the machine's own services are no
    /// registry), and the registries that `env` (CMD's environment) and `npmrcs` (the npmrc
    /// files' text) configure.
    pub fn new<'a>(
        rules: &RuleSet,
        env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
        npmrcs: &[String],
    ) -> Allowed {
        let names = rules.network().flat_map(|usual| usual.names.iter().cloned()).collect();
        let from_env = env.into_iter().flat_map(|(name, value)| configured_urls(name, value));
        let from_npmrcs = npmrcs.iter().flat_map(|text| npmrc_registries(text));
        let mut configured: Vec<Endpoint> = from_env.chain(from_npmrcs).filter_map(|url| endpoint(&url)).collect();
        configured.sort();
        configured.dedup();
        Allowed { names, configured }
    }

    /// The user's configured registries.
    pub fn configured(&self) -> &[Endpoint] {
        &self.configured
    }

    /// Whether the proxy reaches `to` for the box: a configured registry, or a usual name on an
    /// HTTP(S) port (an address literal is never a usual name).
    pub fn allows(&self, to: &Endpoint) -> bool {
        self.configured.contains(to)
            || (REGISTRY_PORTS.contains(&to.port)
                && to.ip().is_none()
                && self.names.iter().any(|pattern| pattern.matcher.is_match(&to.host)))
    }
}

/// The registry URLs an environment variable configures: npm's `npm_config_registry` and
/// `npm_config_@scope:registry`, yarn's and bun's, pip's and uv's index URLs (space-separated
/// lists; uv's `UV_INDEX` entries may be `name=url`), cargo's `CARGO_REGISTRIES_<NAME>_INDEX`.
pub fn configured_urls(name: &OsStr, value: &OsStr) -> Vec<String> {
    let name = String::from_utf8_lossy(name.as_bytes()).to_ascii_uppercase();
    let value = String::from_utf8_lossy(value.as_bytes());
    let one = (name.starts_with("NPM_CONFIG_") && name.ends_with("REGISTRY"))
        || (name.starts_with("CARGO_REGISTRIES_") && name.ends_with("_INDEX"))
        || ["YARN_NPM_REGISTRY_SERVER", "BUN_CONFIG_REGISTRY"].contains(&name.as_str());
    let lists =
        ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX"];
    if one {
        vec![value.trim().to_owned()]
    } else if lists.contains(&name.as_str()) {
        value
            .split_whitespace()
            .map(|entry| match entry.split_once('=') {
                Some((index_name, url)) if !index_name.contains("://") => url.to_owned(),
                _ => entry.to_owned(),
            })
            .collect()
    } else {
        Vec::new()
    }
}

/// The `registry=` and `@scope:registry=` URLs of an npmrc file's text.
pub fn npmrc_registries(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#') && !line.starts_with(';'))
        .filter_map(|line| line.split_once('='))
        .filter(|(key, _)| key.trim().ends_with("registry"))
        .map(|(_, value)| value.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
        .collect()
}

/// The host and port of an `http://` or `https://` URL (cargo's `sparse+https://` too), without
/// its user and password; `None` for another scheme or a malformed authority.
pub fn endpoint(url: &str) -> Option<Endpoint> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.rsplit('+').next().unwrap_or(scheme).to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    parse_authority(authority, Some(default_port))
}

/// `host[:port]` or `[v6][:port]`: a port is needed unless `default_port` is given.
fn parse_authority(authority: &str, default_port: Option<u16>) -> Option<Endpoint> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        host.parse::<std::net::Ipv6Addr>().ok()?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port.parse().ok().filter(|&port| port != 0)?,
        None => default_port?,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let name_ok = !host.is_empty()
        && host.len() <= MAX_HOST
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    (name_ok || host.parse::<IpAddr>().is_ok()).then_some(Endpoint { host, port })
}

/// `NO_PROXY` for the box: its own loopback, which its clients reach directly (a test server a
/// build starts), but for a configured registry's host there, which is the machine's and only
/// the proxy reaches.
pub fn no_proxy(allowed: &Allowed) -> String {
    let through_proxy = |name: &&str| allowed.configured.iter().any(|to| to.host == *name);
    LOOPBACK.iter().filter(|name| !through_proxy(name)).copied().collect::<Vec<_>>().join(",")
}

/// What a client asked the proxy for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Tunnel(Endpoint),
    /// `GET http://host[:port]/path`: a plain-HTTP request, sent on in origin form.
    Forward { to: Endpoint, path: String },
}

impl Target {
    pub fn endpoint(&self) -> &Endpoint {
        match self {
            Target::Tunnel(to) | Target::Forward { to, .. } => to,
        }
    }
}

/// A request head the proxy read.
#[derive(Debug)]
pub struct RequestHead {
    pub method: String,
    /// The target as the client wrote it.
    pub raw_target: String,
    pub target: Target,
    /// Bytes of the head, through its blank line: what follows is the body, or the tunnel's.
    pub length: usize,
    minor_version: u8,
    /// Headers sent on: without [`HOP_HEADERS`].
    headers: Vec<(String, Vec<u8>)>,
}

impl RequestHead {
    /// The head to send on for a [`Target::Forward`]: in origin form to the host itself, or as
    /// the client wrote it to an upstream proxy (`absolute`); one request per connection.
    pub fn forwarded(&self, absolute: bool) -> Vec<u8> {
        let target = match (&self.target, absolute) {
            (Target::Forward { path, .. }, false) => path.as_str(),
            _ => self.raw_target.as_str(),
        };
        let mut head = format!("{} {target} HTTP/1.{}\r\n", self.method, self.minor_version).into_bytes();
        let mut has_host = false;
        for (name, value) in &self.headers {
            has_host |= name.eq_ignore_ascii_case("host");
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        }
        if !has_host {
            head.extend_from_slice(format!("Host: {}\r\n", self.target.endpoint().authority()).as_bytes());
        }
        head.extend_from_slice(b"Connection: close\r\n\r\n");
        head
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("request head longer than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed request head: {0}")]
    Malformed(String),
    #[error("target {0:?} is neither `host:port` after CONNECT nor an `http://` URL")]
    BadTarget(String),
}

impl RequestError {
    /// The HTTP status the client gets.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::TooLarge => 431,
            RequestError::Malformed(_) | RequestError::BadTarget(_) => 400,
        }
    }
}

/// Reads the request head at the start of `bytes`: `Ok(None)` while it is incomplete.
pub fn request_head(bytes: &[u8]) -> Result<Option<RequestHead>, RequestError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let length = match request.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if bytes.len() >= MAX_HEAD => return Err(RequestError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooLarge),
        Err(error) => return Err(RequestError::Malformed(error.to_string())),
    };
    if length > MAX_HEAD {
        return Err(RequestError::TooLarge);
    }
    let (Some(method), Some(raw_target), Some(minor_version)) = (request.method, request.path, request.version) else {
        return Err(RequestError::Malformed("no request line".into()));
    };
    let bad = || RequestError::BadTarget(raw_target.to_owned());
    let target = if method.eq_ignore_ascii_case("CONNECT") {
        Target::Tunnel(parse_authority(raw_target, None).ok_or_else(bad)?)
    } else {
        let rest = raw_target.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = rest.find('/').map_or((rest, "/"), |at| (&rest[..at], &rest[at..]));
        if authority.contains('@') {
            return Err(bad());
        }
        Target::Forward { to: parse_authority(authority, Some(80)).ok_or_else(bad)?, path: path.to_owned() }
    };
    let headers = (request.headers.iter())
        .filter(|header| !HOP_HEADERS.iter().any(|hop| header.name.eq_ignore_ascii_case(hop)))
        .map(|header| (header.name.to_owned(), header.value.to_vec()))
        .collect();
    Ok(Some(RequestHead {
        method: method.to_owned(),
        raw_target: raw_target.to_owned(),
        target,
        length,
        minor_version,
        headers,
    }))
}

/// A whole response of the proxy's own, closing the connection.
pub fn response(status: u16, text: &str) -> Vec<u8> {
    let reason = match status {
        200 => "Connection established",
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    if status == 200 {
        return format!("HTTP/1.1 200 {reason}\r\n\r\n").into_bytes();
    }
    let body = format!("credwatch --contain-net: {text}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn to(host: &str, port: u16) -> Endpoint {
        Endpoint { host: host.into(), port }
    }

    fn allowed(env: &[(&str, &str)], npmrcs: &[&str]) -> Allowed {
        let rules = RuleSet::load(None).unwrap();
        let env: Vec<(OsString, OsString)> = env.iter().map(|(n, v)| (n.into(), v.into())).collect();
        let npmrcs: Vec<String> = npmrcs.iter().map(|text| (*text).to_owned()).collect();
        Allowed::new(&rules, env.iter().map(|(n, v)| (n.as_os_str(), v.as_os_str())), &npmrcs)
    }

    #[test]
    fn the_usual_registries_pass_on_https_and_nothing_else_does() {
        let allowed = allowed(&[], &[]);
        for host in ["registry.npmjs.org", "pypi.org", "files.pythonhosted.org", "index.crates.io", "github.com"] {
            assert!(allowed.allows(&to(host, 443)), "{host}");
        }
        assert!(allowed.allows(&to("static.crates.io", 80)));
        // Another port of a registry (ssh to github.com), an address, loopback, the metadata
        // endpoint, a name merely ending like a registry's.
        for (host, port) in [
            ("github.com", 22),
            ("104.16.1.35", 443),
            ("127.0.0.1", 443),
            ("localhost", 80),
            ("169.254.169.254", 80),
            ("metadata.google.internal", 80),
            ("evilpypi.org", 443),
            ("collector.exfil.invalid", 443),
        ] {
            assert!(!allowed.allows(&to(host, port)), "{host}:{port}");
        }
    }

    #[test]
    fn the_users_configured_registries_pass_on_their_own_port() {
        let allowed = allowed(
            &[
                ("npm_config_registry", "http://127.0.0.10:4873/"),
                ("NPM_CONFIG_@corp:REGISTRY", "https://npm.corp.example/"),
                ("PIP_INDEX_URL", "https://user:secret@pypi.corp.example:8443/simple"),
                ("PIP_EXTRA_INDEX_URL", "https://a.example/simple https://b.example/simple"),
                ("UV_INDEX", "internal=https://uv.corp.example/simple"),
                ("CARGO_REGISTRIES_CORP_INDEX", "sparse+https://crates.corp.example/index/"),
                ("HOME", "/home/alice"),
                ("NPM_CONFIG_CACHE", "http://not.a.registry.example/"),
            ],
            &["registry = \"http://[::1]:4874\"\n; registry=http://commented.example/\n@x:registry=http://x.example:81/"],
        );
        let expected = [
            to("127.0.0.10", 4873),
            to("::1", 4874),
            to("a.example", 443),
            to("b.example", 443),
            to("crates.corp.example", 443),
            to("npm.corp.example", 443),
            to("pypi.corp.example", 8443),
            to("uv.corp.example", 443),
            to("x.example", 81),
        ];
        let mut configured = allowed.configured().to_vec();
        configured.sort_by(|a, b| a.host.cmp(&b.host));
        let mut expected = expected.to_vec();
        expected.sort_by(|a, b| a.host.cmp(&b.host));
        assert_eq!(configured, expected);
        assert!(allowed.allows(&to("127.0.0.10", 4873)));
        assert!(!allowed.allows(&to("127.0.0.10", 4874)));
        assert!(!allowed.allows(&to("127.0.0.11", 4873)));
        // The configured loopback host goes through the proxy; the rest of loopback stays the box's.
        assert_eq!(no_proxy(&allowed), "localhost,127.0.0.1");
        assert_eq!(no_proxy(&Allowed::default()), "localhost,127.0.0.1,::1");
    }

    #[test]
    fn urls_give_their_endpoint_or_none() {
        assert_eq!(endpoint("https://Registry.NPMJS.org./"), Some(to("registry.npmjs.org", 443)));
        assert_eq!(endpoint("http://u:p@h.example:8080?x"), Some(to("h.example", 8080)));
        assert_eq!(endpoint("http://[fd00::1]/simple"), Some(to("fd00::1", 80)));
        for bad in [
            "ftp://h.example/",
            "h.example",
            "http://",
            "http://h.example:0/",
            "http://h.example:99999/",
            "http://[zz]/",
            "http://a b/",
            "http://h\u{1b}[2J/",
        ] {
            assert_eq!(endpoint(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn connect_and_absolute_requests_are_read_and_the_rest_refused_clearly() {
        let tunnel = b"CONNECT registry.npmjs.org:443 HTTP/1.1\r\nHost: registry.npmjs.org:443\r\n\r\nTLS";
        let connect = request_head(tunnel).unwrap().unwrap();
        assert_eq!(connect.target, Target::Tunnel(to("registry.npmjs.org", 443)));
        // The tunnel's first bytes are not the head's.
        assert_eq!(connect.length, tunnel.len() - 3);

        let get = b"GET http://127.0.0.10:4873/left-pad HTTP/1.1\r\nHost: 127.0.0.10:4873\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n";
        let head = request_head(get).unwrap().unwrap();
        assert_eq!(head.target, Target::Forward { to: to("127.0.0.10", 4873), path: "/left-pad".into() });
        assert_eq!(
            String::from_utf8(head.forwarded(false)).unwrap(),
            "GET /left-pad HTTP/1.1\r\nHost: 127.0.0.10:4873\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert!(String::from_utf8(head.forwarded(true))
            .unwrap()
            .starts_with("GET http://127.0.0.10:4873/left-pad HTTP/1.1\r\n"));
        let bare = request_head(b"GET http://h.example HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            String::from_utf8(bare.forwarded(false)).unwrap(),
            "GET / HTTP/1.0\r\nHost: h.example:80\r\nConnection: close\r\n\r\n"
        );

        assert!(request_head(b"CONNECT registry.npmjs.org:443 HTTP/1.1\r\nHost: x").unwrap().is_none());
        for (bad, status) in [
            (&b"GET /left-pad HTTP/1.1\r\n\r\n"[..], 400),
            (b"CONNECT registry.npmjs.org HTTP/1.1\r\n\r\n", 400),
            (b"GET https://h.example/ HTTP/1.1\r\n\r\n", 400),
            (b"GET http://user@h.example/ HTTP/1.1\r\n\r\n", 400),
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
        ] {
            let error = request_head(bad).unwrap_err();
            assert_eq!(error.status(), status, "{error}");
        }
        let long = format!("GET http://h.example/ HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(request_head(long.as_bytes()).unwrap_err(), RequestError::TooLarge);
        let many = format!("GET http://h.example/ HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(request_head(many.as_bytes()).unwrap_err(), RequestError::TooLarge);
    }

    #[test]
    fn the_proxys_own_responses_close_and_say_why() {
        let refused = String::from_utf8(response(403, "collector.exfil.invalid:443 is not a registry")).unwrap();
        assert!(
            refused.starts_with("HTTP/1.1 403 Forbidden\r\n") && refused.contains("Connection: close"),
            "{refused}"
        );
        assert!(refused.ends_with("\r\n\r\ncredwatch --contain-net: collector.exfil.invalid:443 is not a registry\n"));
        assert_eq!(response(200, ""), b"HTTP/1.1 200 Connection established\r\n\r\n");
    }
}
