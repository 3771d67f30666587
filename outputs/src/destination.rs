//! Where an output sends alerts, as spelled on the command line (`--to DEST`) and in the
//! configuration's `outputs:` list (`to: DEST`). Other tools script against these spellings:
//! `file:PATH`, `syslog:unix:PATH`, `syslog:udp:HOST:PORT`, `syslog:tcp:HOST:PORT`,
//! `syslog:relp:HOST:PORT`, `webhook:URL`, `falcosidekick:URL`, `nats:URL/SUBJECT_PREFIX`.

use std::{fmt, path::PathBuf, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::syslog::SyslogTarget;

/// One output's destination.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// JSON lines appended to a file.
    File(PathBuf),
    Syslog(SyslogTarget),
    /// An HTTP(S) endpoint that takes the ECS alert.
    Webhook(String),
    /// A Falcosidekick, sent Falco's alert shape.
    Falcosidekick(String),
    /// NATS JetStream: each alert on `<subject_prefix>.<host>`.
    Nats {
        url: String,
        subject_prefix: String,
    },
}

/// A destination that does not parse, with the part that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{spelling:?}: {problem}")]
pub struct DestinationError {
    /// The destination as given.
    pub spelling: String,
    /// What is wrong with it, naming the part.
    pub problem: String,
}

const KINDS: &str = "file:PATH, syslog:unix:PATH, syslog:udp:HOST:PORT, syslog:tcp:HOST:PORT, \
                     syslog:relp:HOST:PORT, webhook:URL, falcosidekick:URL, nats:URL/SUBJECT_PREFIX";

impl FromStr for Destination {
    type Err = DestinationError;

    fn from_str(text: &str) -> Result<Destination, DestinationError> {
        parse(text).map_err(|problem| DestinationError { spelling: text.to_owned(), problem })
    }
}

fn parse(text: &str) -> Result<Destination, String> {
    let Some((kind, rest)) = text.split_once(':') else {
        return Err(format!("no kind before a `:` (one of {KINDS})"));
    };
    match kind {
        "file" => Ok(Destination::File(path("file", rest)?)),
        "syslog" => {
            let Some((transport, address)) = rest.split_once(':') else {
                return Err(format!(
                    "`syslog:` needs `unix:PATH`, `udp:HOST:PORT`, `tcp:HOST:PORT` or `relp:HOST:PORT`, not {rest:?}"
                ));
            };
            Ok(Destination::Syslog(match transport {
                "unix" => SyslogTarget::Unix(path("syslog:unix", address)?),
                "udp" => {
                    let (host, port) = host_port("syslog:udp", address)?;
                    SyslogTarget::Udp { host, port }
                }
                "tcp" => {
                    let (host, port) = host_port("syslog:tcp", address)?;
                    SyslogTarget::Tcp { host, port }
                }
                "relp" => {
                    let (host, port) = host_port("syslog:relp", address)?;
                    SyslogTarget::Relp { host, port }
                }
                other => return Err(format!("syslog transport {other:?} is none of unix, udp, tcp, relp")),
            }))
        }
        "webhook" => Ok(Destination::Webhook(http_url("webhook", rest)?)),
        "falcosidekick" => Ok(Destination::Falcosidekick(http_url("falcosidekick", rest)?)),
        "nats" => {
            let (url, subject_prefix) = nats(rest)?;
            Ok(Destination::Nats { url, subject_prefix })
        }
        other => Err(format!("kind {other:?} is none of {KINDS}")),
    }
}

fn path(kind: &str, text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err(format!("`{kind}:` needs a path"));
    }
    if text.contains('\0') {
        return Err(format!("the path after `{kind}:` holds a NUL byte"));
    }
    Ok(PathBuf::from(text))
}

/// `HOST:PORT`, `[IPv6]:PORT`.
fn host_port(kind: &str, text: &str) -> Result<(String, u16), String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("`{kind}:` needs HOST:PORT, not {text:?} (no port)"));
    };
    let host = match host.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']').ok_or_else(|| format!("host {host:?}: a `[` without its `]`"))?,
        None if host.contains(':') => return Err(format!("host {host:?}: an IPv6 address goes in brackets, [::1]")),
        None => host,
    };
    if host.is_empty() {
        return Err(format!("`{kind}:` needs a host before the port"));
    }
    if host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(format!("host {host:?} is not a host name or address"));
    }
    let port =
        port.parse::<u16>().ok().filter(|port| *port > 0).ok_or_else(|| format!("port {port:?} is not 1-65535"))?;
    Ok((host.to_owned(), port))
}

fn http_url(kind: &str, text: &str) -> Result<String, String> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(format!("`{kind}:` needs an http:// or https:// URL, not {text:?}"));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("URL scheme {scheme:?} is neither http nor https"));
    }
    authority(rest)?;
    Ok(text.to_owned())
}

/// The host part of a URL after its `scheme://`: up to the first `/`.
fn authority(rest: &str) -> Result<&str, String> {
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.starts_with(':') {
        return Err(format!("URL {rest:?} has no host"));
    }
    if authority.chars().any(char::is_whitespace) {
        return Err(format!("URL host {authority:?} holds a space"));
    }
    Ok(authority)
}

/// `nats://HOST:PORT/PREFIX` (or `tls://`, or a bare `HOST:PORT/PREFIX`): the server URL and
/// the subject prefix.
fn nats(text: &str) -> Result<(String, String), String> {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) if ["nats", "tls", "ws", "wss"].contains(&scheme) => (Some(scheme), rest),
        Some((scheme, _)) => return Err(format!("URL scheme {scheme:?} is none of nats, tls, ws, wss")),
        None => (None, text),
    };
    let server = authority(rest)?;
    let Some(prefix) = rest[server.len()..].strip_prefix('/').filter(|prefix| !prefix.is_empty()) else {
        return Err(format!("`nats:` needs URL/SUBJECT_PREFIX: no subject prefix after {text:?}"));
    };
    if let Some(bad) = prefix
        .split('.')
        .find(|token| token.is_empty() || token.chars().any(|c| c.is_whitespace() || c == '*' || c == '>' || c == '/'))
    {
        return Err(format!("subject prefix {prefix:?}: token {bad:?} is empty or holds a space, `*`, `>` or `/`"));
    }
    let url = match scheme {
        Some(scheme) => format!("{scheme}://{server}"),
        None => server.to_owned(),
    };
    Ok((url, prefix.to_owned()))
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::File(path) => write!(f, "file:{}", path.display()),
            Destination::Syslog(SyslogTarget::Unix(path)) => write!(f, "syslog:unix:{}", path.display()),
            Destination::Syslog(SyslogTarget::Udp { host, port }) => write!(f, "syslog:udp:{}:{port}", bracket(host)),
            Destination::Syslog(SyslogTarget::Tcp { host, port }) => write!(f, "syslog:tcp:{}:{port}", bracket(host)),
            Destination::Syslog(SyslogTarget::Relp { host, port }) => write!(f, "syslog:relp:{}:{port}", bracket(host)),
            Destination::Webhook(url) => write!(f, "webhook:{url}"),
            Destination::Falcosidekick(url) => write!(f, "falcosidekick:{url}"),
            Destination::Nats { url, subject_prefix } => write!(f, "nats:{url}/{subject_prefix}"),
        }
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

impl Serialize for Destination {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Destination {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Destination, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_the_issue_parses_and_prints_back() {
        let cases = [
            ("file:/var/log/credwatch/alerts.jsonl", Destination::File("/var/log/credwatch/alerts.jsonl".into())),
            ("syslog:unix:/dev/log", Destination::Syslog(SyslogTarget::Unix("/dev/log".into()))),
            (
                "syslog:udp:127.0.0.1:514",
                Destination::Syslog(SyslogTarget::Udp { host: "127.0.0.1".into(), port: 514 }),
            ),
            (
                "syslog:tcp:logs.example:6514",
                Destination::Syslog(SyslogTarget::Tcp { host: "logs.example".into(), port: 6514 }),
            ),
            ("syslog:tcp:[::1]:601", Destination::Syslog(SyslogTarget::Tcp { host: "::1".into(), port: 601 })),
            (
                "syslog:relp:logs.example:2514",
                Destination::Syslog(SyslogTarget::Relp { host: "logs.example".into(), port: 2514 }),
            ),
            ("syslog:relp:[::1]:20514", Destination::Syslog(SyslogTarget::Relp { host: "::1".into(), port: 20514 })),
            (
                "webhook:https://hooks.example/credwatch?x=1",
                Destination::Webhook("https://hooks.example/credwatch?x=1".into()),
            ),
            ("falcosidekick:http://127.0.0.1:2801", Destination::Falcosidekick("http://127.0.0.1:2801".into())),
            (
                "nats:nats://127.0.0.1:4222/credwatch.alerts",
                Destination::Nats { url: "nats://127.0.0.1:4222".into(), subject_prefix: "credwatch.alerts".into() },
            ),
            (
                "nats:bus:4222/credwatch",
                Destination::Nats { url: "bus:4222".into(), subject_prefix: "credwatch".into() },
            ),
        ];
        for (text, destination) in cases {
            assert_eq!(text.parse::<Destination>(), Ok(destination.clone()), "{text}");
            assert_eq!(destination.to_string(), text);
        }
    }

    #[test]
    fn bad_spellings_name_the_bad_part() {
        let cases = [
            ("/var/log/alerts", "no kind before a `:`"),
            ("fiel:/tmp/a", "kind \"fiel\" is none of file:PATH"),
            ("file:", "`file:` needs a path"),
            ("syslog:/dev/log", "`syslog:` needs `unix:PATH`"),
            ("syslog:sctp:h:1", "syslog transport \"sctp\" is none of unix, udp, tcp, relp"),
            ("syslog:relp:logs.example", "`syslog:relp:` needs HOST:PORT"),
            ("syslog:relp:h:0", "port \"0\" is not 1-65535"),
            ("syslog:udp:127.0.0.1:x", "port \"x\" is not 1-65535"),
            ("syslog:udp:localhost", "no port"),
            ("syslog:tcp::514", "needs a host before the port"),
            ("syslog:tcp:h:65536", "port \"65536\" is not 1-65535"),
            ("syslog:tcp:h:0", "port \"0\" is not 1-65535"),
            ("syslog:tcp:::1:514", "goes in brackets"),
            ("syslog:tcp:[::1:514", "without its `]`"),
            ("webhook:hooks.example/x", "needs an http:// or https:// URL"),
            ("webhook:ftp://hooks.example", "scheme \"ftp\" is neither http nor https"),
            ("falcosidekick:http:///x", "has no host"),
            ("nats:nats://127.0.0.1:4222", "no subject prefix"),
            ("nats:nats://127.0.0.1:4222/", "no subject prefix"),
            ("nats:nats://h:4222/a..b", "token \"\" is empty"),
            ("nats:nats://h:4222/alerts.>", "token \">\""),
            ("nats:http://h:4222/a", "scheme \"http\" is none of nats"),
        ];
        for (text, part) in cases {
            let error = text.parse::<Destination>().unwrap_err();
            assert_eq!(error.spelling, text);
            assert!(error.to_string().contains(part), "{text}: {error}");
        }
    }
}
