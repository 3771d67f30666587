//! Decoders of what package code hands the network: socket addresses (`struct sockaddr` as
//! passed to `connect`/`sendto`) and DNS queries (the wire format of RFC 1035). Both take bytes
//! from the monitored system: every length is checked, nothing panics, and the work is bounded.

use std::net::{Ipv4Addr, Ipv6Addr};

use thiserror::Error;

const AF_UNSPEC: u16 = 0;
const AF_UNIX: u16 = 1;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// Labels followed before a query name is given up on (a name has at most 127).
const MAX_LABELS: usize = 128;
/// Longest name, in bytes of its text form (RFC 1035: 255 on the wire).
const MAX_NAME: usize = 255;

/// A decoded socket address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SockAddr {
    /// `inet`, `inet6`, `unix`, `unspec`, or the `AF_*` number.
    pub family: String,
    pub address: Option<String>,
    pub port: Option<u16>,
    /// A unix socket's path; an abstract one starts with `@`.
    pub path: Option<String>,
}

/// Decodes the `struct sockaddr` in `bytes` (what the process passed, possibly cut short).
/// Fields the bytes do not hold are left out.
pub fn sockaddr(bytes: &[u8]) -> SockAddr {
    let Some(family) = bytes.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]])) else {
        return SockAddr { family: "unknown".into(), ..SockAddr::default() };
    };
    let port = bytes.get(2..4).map(|b| u16::from_be_bytes([b[0], b[1]]));
    match family {
        AF_INET => SockAddr {
            family: "inet".into(),
            address: bytes.get(4..8).map(|b| Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()),
            port,
            path: None,
        },
        AF_INET6 => SockAddr {
            family: "inet6".into(),
            address: bytes.get(8..24).map(|b| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(b);
                Ipv6Addr::from(octets).to_string()
            }),
            port,
            path: None,
        },
        AF_UNIX => {
            let raw = bytes.get(2..).unwrap_or_default();
            let path = match raw.split_first() {
                // Abstract: the name is every byte after the NUL, as long as the address says.
                Some((0, name)) => format!("@{}", String::from_utf8_lossy(name)),
                _ => String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or_default()).into_owned(),
            };
            SockAddr { family: "unix".into(), path: Some(path), ..SockAddr::default() }
        }
        AF_UNSPEC => SockAddr { family: "unspec".into(), ..SockAddr::default() },
        other => SockAddr { family: other.to_string(), ..SockAddr::default() },
    }
}

/// The name of a `SOCK_*` type, as `Connect::socket_type` gives it.
pub fn socket_type_name(sock_type: u32) -> Option<String> {
    match sock_type {
        0 => None,
        1 => Some("stream".into()),
        2 => Some("dgram".into()),
        3 => Some("raw".into()),
        4 => Some("rdm".into()),
        5 => Some("seqpacket".into()),
        10 => Some("packet".into()),
        other => Some(format!("type{other}")),
    }
}

/// `address:port`, with brackets around an IPv6 address.
pub fn host_port(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DnsError {
    #[error("DNS message of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("DNS message is a response or not a standard query")]
    NotQuery,
    #[error("DNS message has no question")]
    NoQuestion,
    #[error("DNS question name runs past the message")]
    Truncated,
    #[error("DNS question name is compressed, too long or malformed")]
    BadName,
}

/// The first question of a DNS query message: the name (lowercase, no final dot; bytes other
/// than letters, digits, `-` and `_` escaped as `\ddd`) and its type.
pub fn dns_question(message: &[u8]) -> Result<(String, u16), DnsError> {
    if message.len() < 12 {
        return Err(DnsError::Short(message.len()));
    }
    // QR (bit 15) clear, OPCODE (bits 11..14) 0: a standard query.
    let flags = u16::from_be_bytes([message[2], message[3]]);
    if flags & 0xf800 != 0 {
        return Err(DnsError::NotQuery);
    }
    if u16::from_be_bytes([message[4], message[5]]) == 0 {
        return Err(DnsError::NoQuestion);
    }
    let mut at = 12;
    let mut name = String::new();
    for _ in 0..MAX_LABELS {
        let len = *message.get(at).ok_or(DnsError::Truncated)? as usize;
        at += 1;
        if len == 0 {
            let qtype = message.get(at..at + 2).ok_or(DnsError::Truncated)?;
            return Ok((name, u16::from_be_bytes([qtype[0], qtype[1]])));
        }
        // A query has no earlier name to point to; 0x40 and 0x80 are reserved.
        if len > 63 {
            return Err(DnsError::BadName);
        }
        let label = message.get(at..at + len).ok_or(DnsError::Truncated)?;
        at += len;
        if !name.is_empty() {
            name.push('.');
        }
        for &byte in label {
            match byte {
                b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => name.push(byte as char),
                b'A'..=b'Z' => name.push(byte.to_ascii_lowercase() as char),
                other => name.push_str(&format!("\\{other:03}")),
            }
        }
        if name.len() > MAX_NAME * 4 {
            return Err(DnsError::BadName);
        }
    }
    Err(DnsError::BadName)
}

/// A DNS query sent over TCP starts with its length (RFC 1035 4.2.2): the question of either
/// form.
pub fn dns_question_any(payload: &[u8]) -> Result<(String, u16), DnsError> {
    dns_question(payload).or_else(|error| match payload {
        [high, low, rest @ ..] if usize::from(u16::from_be_bytes([*high, *low])) >= rest.len() && rest.len() >= 12 => {
            dns_question(rest)
        }
        _ => Err(error),
    })
}

/// The usual name of a query type.
pub fn qtype_name(qtype: u16) -> String {
    match qtype {
        1 => "A".into(),
        2 => "NS".into(),
        5 => "CNAME".into(),
        6 => "SOA".into(),
        12 => "PTR".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        28 => "AAAA".into(),
        33 => "SRV".into(),
        64 => "SVCB".into(),
        65 => "HTTPS".into(),
        255 => "ANY".into(),
        other => format!("TYPE{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query for `name` of type `qtype`, as glibc builds it.
    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut message = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            message.push(label.len() as u8);
            message.extend_from_slice(label.as_bytes());
        }
        message.push(0);
        message.extend_from_slice(&qtype.to_be_bytes());
        message.extend_from_slice(&1u16.to_be_bytes());
        message
    }

    #[test]
    fn reads_the_question_of_a_query() {
        let message = query("Collector.EXFIL.invalid", 1);
        assert_eq!(dns_question(&message), Ok(("collector.exfil.invalid".into(), 1)));
        assert_eq!(qtype_name(28), "AAAA");
        assert_eq!(qtype_name(4242), "TYPE4242");
    }

    #[test]
    fn reads_a_tcp_query_after_its_length() {
        let message = query("registry.npmjs.org", 28);
        let mut framed = (message.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&message);
        assert_eq!(dns_question_any(&framed), Ok(("registry.npmjs.org".into(), 28)));
    }

    #[test]
    fn escapes_odd_bytes_in_labels() {
        let mut message = query("a.b", 1);
        message[13] = b'\n';
        assert_eq!(dns_question(&message).unwrap().0, "\\010.b");
    }

    #[test]
    fn rejects_malformed_messages_without_panicking() {
        assert_eq!(dns_question(&[]), Err(DnsError::Short(0)));
        let mut response = query("a.b", 1);
        response[2] |= 0x80;
        assert_eq!(dns_question(&response), Err(DnsError::NotQuery));
        let mut none = query("a.b", 1);
        none[5] = 0;
        assert_eq!(dns_question(&none), Err(DnsError::NoQuestion));
        let whole = query("collector.exfil.invalid", 1);
        for cut in 12..whole.len() - 2 {
            assert_eq!(dns_question(&whole[..cut]), Err(DnsError::Truncated), "cut at {cut}");
        }
        let mut pointer = query("a.b", 1);
        pointer[12] = 0xc0;
        assert_eq!(dns_question(&pointer), Err(DnsError::BadName));
        // Labels that never end: the label limit stops the walk.
        let mut endless = vec![0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for _ in 0..200 {
            endless.extend_from_slice(&[1, b'a']);
        }
        assert_eq!(dns_question(&endless), Err(DnsError::BadName));
        // Every prefix and every single-byte corruption of a query is an answer or an error.
        for index in 0..whole.len() {
            for value in [0u8, 1, 63, 64, 0xc0, 0xff] {
                let mut bad = whole.clone();
                bad[index] = value;
                let _ = dns_question_any(&bad);
            }
            let _ = dns_question_any(&whole[..index]);
        }
    }

    #[test]
    fn decodes_socket_addresses() {
        let inet = [2, 0, 0x1f, 0x90, 127, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0];
        let decoded = sockaddr(&inet);
        assert_eq!(
            (decoded.family.as_str(), decoded.address.as_deref(), decoded.port),
            ("inet", Some("127.0.0.9"), Some(8080))
        );
        let mut inet6 = vec![10, 0, 0, 80, 0, 0, 0, 0];
        inet6.extend_from_slice(&"fd00:ec2::254".parse::<Ipv6Addr>().unwrap().octets());
        let decoded = sockaddr(&inet6);
        assert_eq!((decoded.address.as_deref(), decoded.port), (Some("fd00:ec2::254"), Some(80)));
        assert_eq!(host_port("fd00:ec2::254", 80), "[fd00:ec2::254]:80");
        let mut unix = vec![1, 0];
        unix.extend_from_slice(b"/run/docker.sock\0\0\0");
        assert_eq!(sockaddr(&unix).path.as_deref(), Some("/run/docker.sock"));
        let abstract_ = [1, 0, 0, b'x', b'y'];
        assert_eq!(sockaddr(&abstract_).path.as_deref(), Some("@xy"));
        // Cut short: what is missing is left out.
        assert_eq!(sockaddr(&inet[..6]).address, None);
        assert_eq!(sockaddr(&[2]).family, "unknown");
        assert_eq!(sockaddr(&[0, 0]).family, "unspec");
        assert_eq!(sockaddr(&[16, 0, 1, 2]).family, "16");
    }
}
