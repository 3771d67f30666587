//! The socket's lines, both ways: JSON, one object a line, at most [`MAX_LINE`] bytes.

use std::io::{self, BufRead, Read as _};

use credwatch_core::alert::Alert;
use serde::{Deserialize, Serialize};

/// The longest line either side accepts, newline included.
pub const MAX_LINE: usize = 1 << 20;

/// The client's first (and only) line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Alerts(AlertsRequest),
    Selftest(SelftestRequest),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsRequest {
    /// The logged alerts after this seq first; none when absent.
    pub since: Option<u64>,
    /// New alerts as they come after the history.
    #[serde(default)]
    pub follow: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelftestRequest {
    pub pid: u32,
}

/// A logged alert as the log stores it and the socket sends it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Logged {
    pub seq: u64,
    pub alert: Alert,
}

/// The server's other lines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    CaughtUp { last_seq: u64 },
    Selftest { ok: bool },
    Error(String),
}

impl Reply {
    pub fn line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("a reply serialises");
        line.push('\n');
        line
    }
}

/// Why a request line was refused (its text is the `error` line the client gets).
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("a line longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("the connection closed before a whole line")]
    Closed,
    #[error("reading: {0}")]
    Io(#[from] io::Error),
}

/// The next line of `reader` without its newline, at most [`MAX_LINE`] bytes; `Ok(None)` at the
/// end. A line cut short by the end of the stream is [`LineError::Closed`].
///
/// `pending` keeps what was read of a line when a read timed out, for the next call.
pub fn read_line(reader: &mut impl BufRead, pending: &mut Vec<u8>) -> Result<Option<Vec<u8>>, LineError> {
    let room = (MAX_LINE + 1).saturating_sub(pending.len());
    let read = reader.by_ref().take(room as u64).read_until(b'\n', pending)?;
    if pending.last() == Some(&b'\n') {
        pending.pop();
        return Ok(Some(std::mem::take(pending)));
    }
    if pending.len() > MAX_LINE - 1 {
        return Err(LineError::TooLong);
    }
    if read == 0 && pending.is_empty() {
        return Ok(None);
    }
    Err(LineError::Closed)
}

/// The request of a client's first line, or why it is none.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(line).map_err(|_| "the request is not UTF-8".to_owned())?;
    if text.trim().is_empty() {
        return Err("an empty request".into());
    }
    serde_json::from_str(text).map_err(|error| {
        format!(
            "a bad request ({error}): expected {{\"alerts\": {{\"since\": N or null, \"follow\": BOOL}}}} or {{\"selftest\": {{\"pid\": P}}}}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_request(br#"{"alerts": {"since": 4, "follow": true}}"#),
            Ok(Request::Alerts(AlertsRequest { since: Some(4), follow: true }))
        );
        assert_eq!(
            parse_request(br#"{"alerts": {"since": null}}"#),
            Ok(Request::Alerts(AlertsRequest { since: None, follow: false }))
        );
        assert_eq!(parse_request(br#"{"selftest": {"pid": 77}}"#), Ok(Request::Selftest(SelftestRequest { pid: 77 })));
        for (bad, why) in [
            (&b"{\"alerts\": "[..], "bad request"),
            (b"not json", "bad request"),
            (br#"{"delete": {}}"#, "unknown variant `delete`"),
            (br#"{"alerts": {"since": -1}}"#, "bad request"),
            (br#"{"alerts": {"since": 1, "limit": 3}}"#, "unknown field `limit`"),
            (b"\xff\xfe", "not UTF-8"),
            (b"  ", "empty request"),
        ] {
            let error = parse_request(bad).unwrap_err();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn lines_are_bounded_and_a_timed_out_read_keeps_its_part() {
        let mut pending = Vec::new();
        let mut two = io::Cursor::new(b"{\"a\":1}\n{\"b\":2}\n".to_vec());
        assert_eq!(read_line(&mut two, &mut pending).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(read_line(&mut two, &mut pending).unwrap().unwrap(), b"{\"b\":2}");
        assert!(read_line(&mut two, &mut pending).unwrap().is_none());

        let mut long = io::Cursor::new(vec![b'x'; MAX_LINE + 10]);
        assert!(matches!(read_line(&mut long, &mut Vec::new()), Err(LineError::TooLong)));
        let mut just_fits = vec![b'x'; MAX_LINE - 1];
        just_fits.push(b'\n');
        assert_eq!(read_line(&mut io::Cursor::new(just_fits), &mut Vec::new()).unwrap().unwrap().len(), MAX_LINE - 1);

        let mut cut = io::Cursor::new(b"{\"a\"".to_vec());
        assert!(matches!(read_line(&mut cut, &mut Vec::new()), Err(LineError::Closed)));
        // What a timed-out read got stays for the next call.
        let mut pending = b"{\"a\"".to_vec();
        assert_eq!(read_line(&mut io::Cursor::new(b":1}\n".to_vec()), &mut pending).unwrap().unwrap(), b"{\"a\":1}");
    }

    #[test]
    fn replies_are_the_contracts_lines() {
        assert_eq!(Reply::CaughtUp { last_seq: 9 }.line(), "{\"caught_up\":{\"last_seq\":9}}\n");
        assert_eq!(Reply::Selftest { ok: true }.line(), "{\"selftest\":{\"ok\":true}}\n");
        assert_eq!(Reply::Error("too many clients".into()).line(), "{\"error\":\"too many clients\"}\n");
    }
}
