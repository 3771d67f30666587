//! A RELP client (rsyslog's Reliable Event Logging Protocol), the syslog output's transport with
//! acknowledgements: each message is a `syslog` command that the receiver answers `rsp 200` once
//! it has taken it, so a receiver that dies loses nothing the agent counted as delivered.
//!
//! Written here rather than taken from a crate: crates.io has no RELP client (`relp` is a linear
//! programming solver, `rsyslog` an RFC 5424 parser, `syslog` and `syslog-rs` speak plain
//! UDP/TCP/Unix syslog only), and binding librelp would bring a C library and its TLS stack
//! for a protocol of five commands. What is used of it, as rsyslog's imrelp speaks it (checked
//! against librelp 1.11): frames `TXNR SP COMMAND SP DATALEN [SP DATA] LF`; `open` with the
//! client's offers, answered `rsp` with `200 OK` and the server's offers (which must list
//! `syslog`); `syslog` with one message each; `serverclose` from the server when it ends the
//! session (its answer to garbage too). Transaction numbers run 1 to 999,999,999 and wrap to 1.
//!
//! Up to [`WINDOW`] messages are in flight, unacknowledged, as librelp's own client does; each
//! answer lets the next one go. Anything else than the expected answers (garbage, a `500`, a
//! `serverclose`, an end of stream, no progress for the timeout) is an error: the session is
//! dropped and the whole batch is sent again on a new one (at-least-once: receivers dedup on the
//! alert's id).
//!
//! Measured (release build, rsyslogd 8.2302 on loopback, batches of 256): 60,000 alerts/s
//! acknowledged with rsyslog's default queue in memory; 2,200/s with the disk queue checkpointed
//! at each message that keeps what it acknowledged across its kill; 365/s with its files synced
//! too. Plain TCP writes 170,000/s, unacknowledged.

use std::{collections::VecDeque, io, time::Duration};

use tokio::{io::AsyncReadExt, net::TcpStream};

use crate::timed::{within, write_all};

/// Most messages sent and not yet acknowledged (librelp's client default).
pub const WINDOW: usize = 128;
const MAX_TXNR: u32 = 999_999_999;
/// The longest frame taken from the server: its answers are a status line and its offers.
const MAX_DATA: usize = 64 * 1024;
/// The longest COMMAND (RELP's are words of a few letters).
const MAX_COMMAND: usize = 32;

/// One open RELP session over TCP.
#[derive(Debug)]
pub struct Session {
    stream: TcpStream,
    next_txnr: u32,
    /// Bytes read and not yet parsed into frames.
    received: Vec<u8>,
    timeout: Duration,
}

/// A frame from the server.
#[derive(Debug, PartialEq, Eq)]
struct Frame {
    txnr: u32,
    command: String,
    data: Vec<u8>,
}

impl Session {
    /// Connects and opens the session: `open` offering the `syslog` command, which the server's
    /// answer must accept.
    pub async fn open(host: &str, port: u16, timeout: Duration) -> io::Result<Session> {
        let stream = TcpStream::connect((host, port)).await.map_err(|e| {
            io::Error::new(e.kind(), format!("connect to {}: {e}", credwatch_core::net::host_port(host, port)))
        })?;
        // Frames go out as soon as written: a window's last frame must not wait for an
        // acknowledgement of the previous ones.
        stream.set_nodelay(true)?;
        let mut session = Session { stream, next_txnr: 1, received: Vec::new(), timeout };
        let offers = format!("relp_version=0\nrelp_software=credwatch,{}\ncommands=syslog", env!("CARGO_PKG_VERSION"));
        let txnr = session.take_txnr();
        let mut frame = Vec::new();
        encode(&mut frame, txnr, "open", offers.as_bytes());
        write_all(&mut session.stream, &frame, timeout).await?;
        let answer = session.read_frame().await?;
        let data = Session::check_answer(&answer, txnr)?;
        let commands = data
            .split(|&b| b == b'\n')
            .find_map(|line| line.strip_prefix(b"commands="))
            .ok_or_else(|| invalid(format!("the answer to open offers no commands: {}", show(data))))?;
        if !commands.split(|&b| b == b',').any(|command| command == b"syslog") {
            return Err(invalid(format!("the receiver does not take syslog messages (commands={})", show(commands))));
        }
        Ok(session)
    }

    /// Sends each message as a `syslog` command, at most [`WINDOW`] unacknowledged; `Ok` once
    /// the receiver acknowledged every one with `200`.
    pub async fn send(&mut self, messages: &[Vec<u8>]) -> io::Result<()> {
        let mut waiting: VecDeque<u32> = VecDeque::with_capacity(WINDOW.min(messages.len()));
        let mut next = messages.iter();
        let mut frames = Vec::new();
        loop {
            frames.clear();
            while waiting.len() < WINDOW {
                let Some(message) = next.next() else { break };
                let txnr = self.take_txnr();
                encode(&mut frames, txnr, "syslog", message);
                waiting.push_back(txnr);
            }
            if !frames.is_empty() {
                write_all(&mut self.stream, &frames, self.timeout).await?;
            }
            if waiting.is_empty() {
                return Ok(());
            }
            // One answer, then every other one already here, before the window refills.
            let mut answer = Some(self.read_frame().await?);
            while let Some(frame) = answer {
                let position = waiting.iter().position(|&txnr| txnr == frame.txnr).ok_or_else(|| {
                    let told = if frame.command == "serverclose" { "" } else { " for no message waiting" };
                    invalid(format!("{}{told}", describe(&frame)))
                })?;
                Session::check_answer(&frame, frame.txnr)?;
                waiting.remove(position);
                answer = self.parsed()?;
            }
        }
    }

    /// Ends the session: `close`, answered by an `rsp` (imrelp's has no data, no status).
    pub async fn close(mut self) -> io::Result<()> {
        let txnr = self.take_txnr();
        let mut frame = Vec::new();
        encode(&mut frame, txnr, "close", b"");
        write_all(&mut self.stream, &frame, self.timeout).await?;
        let answer = self.read_frame().await?;
        if answer.command != "rsp" || answer.txnr != txnr {
            return Err(invalid(format!("{} where the answer to close ({txnr}) was due", describe(&answer))));
        }
        Ok(())
    }

    /// The server closed the session or said something unasked while idle (a `serverclose`):
    /// a new session is needed. Asked of the socket itself, as for plain TCP (see `syslog`).
    pub fn stale(&self) -> bool {
        let mut byte = [std::mem::MaybeUninit::uninit()];
        match socket2::SockRef::from(&self.stream).peek(&mut byte) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    fn take_txnr(&mut self) -> u32 {
        let txnr = self.next_txnr;
        self.next_txnr = if txnr >= MAX_TXNR { 1 } else { txnr + 1 };
        txnr
    }

    /// `frame` is `rsp` for `txnr` with status 200: its data after the status line.
    fn check_answer(frame: &Frame, txnr: u32) -> io::Result<&[u8]> {
        if frame.command != "rsp" || frame.txnr != txnr {
            return Err(invalid(format!("{} where the answer to transaction {txnr} was due", describe(frame))));
        }
        let (status, rest) = match frame.data.iter().position(|&b| b == b'\n') {
            Some(end) => (&frame.data[..end], &frame.data[end + 1..]),
            None => (&frame.data[..], &[][..]),
        };
        if !status.starts_with(b"200") {
            return Err(io::Error::other(format!("the receiver answered {} to transaction {txnr}", show(status))));
        }
        Ok(rest)
    }

    /// The next frame, reading until one is whole (failing on no progress for the timeout).
    async fn read_frame(&mut self) -> io::Result<Frame> {
        let mut chunk = [0; 8192];
        loop {
            if let Some(frame) = self.parsed()? {
                return Ok(frame);
            }
            // Acknowledge at once what comes: imrelp writes each answer on its own, and with
            // delayed ACKs here and Nagle's algorithm there, each next answer waited 40 ms
            // (measured with a test client and a window of 8: 180 messages/s, 16,000/s with this).
            let _ = socket2::SockRef::from(&self.stream).set_tcp_quickack(true);
            let read = within(self.timeout, "waiting for the receiver's answer", self.stream.read(&mut chunk)).await?;
            if read == 0 {
                let what = if self.received.is_empty() { "" } else { " in the middle of a frame" };
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the receiver closed the connection{what}"),
                ));
            }
            self.received.extend_from_slice(&chunk[..read]);
        }
    }

    /// A whole frame off the front of what was read, if there is one.
    fn parsed(&mut self) -> io::Result<Option<Frame>> {
        match parse(&self.received).map_err(invalid)? {
            Some((frame, used)) => {
                self.received.drain(..used);
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }
}

/// Appends the frame `TXNR SP COMMAND SP DATALEN [SP DATA] LF`.
fn encode(out: &mut Vec<u8>, txnr: u32, command: &str, data: &[u8]) {
    out.extend_from_slice(format!("{txnr} {command} {}", data.len()).as_bytes());
    if !data.is_empty() {
        out.push(b' ');
        out.extend_from_slice(data);
    }
    out.push(b'\n');
}

/// The frame at the start of `bytes` and the bytes it takes, `None` while it is not whole, or
/// what is wrong with it.
fn parse(bytes: &[u8]) -> Result<Option<(Frame, usize)>, String> {
    let mut at = 0;
    let Some((txnr, _)) = number(bytes, &mut at, b" ", "transaction number")? else { return Ok(None) };
    let command_start = at;
    let command = loop {
        match bytes.get(at) {
            None if at - command_start <= MAX_COMMAND => return Ok(None),
            Some(b' ') if at > command_start => break String::from_utf8_lossy(&bytes[command_start..at]).into_owned(),
            Some(b) if b.is_ascii_alphabetic() && at - command_start < MAX_COMMAND => at += 1,
            _ => return Err(format!("no command after transaction number {txnr}: {}", show(bytes))),
        }
    };
    at += 1;
    // DATALEN ends with the LF of a frame without data, or with the space before the data.
    let Some((datalen, end)) = number(bytes, &mut at, b" \n", "data length")? else { return Ok(None) };
    let datalen = datalen as usize;
    if datalen > MAX_DATA {
        return Err(format!("{command} {txnr} announces {datalen} bytes of data, more than {MAX_DATA}"));
    }
    if end == b'\n' {
        if datalen != 0 {
            return Err(format!("{command} {txnr} announces {datalen} bytes and has none"));
        }
        return Ok(Some((Frame { txnr, command, data: Vec::new() }, at)));
    }
    let Some(&trailer) = bytes.get(at + datalen) else { return Ok(None) };
    if trailer != b'\n' {
        return Err(format!("{command} {txnr}: no LF after its {datalen} bytes of data"));
    }
    let data = bytes[at..at + datalen].to_vec();
    Ok(Some((Frame { txnr, command, data }, at + datalen + 1)))
}

/// At most nine digits at `*at`, then one of `ends` (both taken): the number and its end,
/// `None` while more is to come.
fn number(bytes: &[u8], at: &mut usize, ends: &[u8], what: &str) -> Result<Option<(u32, u8)>, String> {
    let start = *at;
    let mut value: u32 = 0;
    loop {
        match bytes.get(*at) {
            None if *at - start <= 9 => return Ok(None),
            Some(&b) if ends.contains(&b) && *at > start => {
                *at += 1;
                return Ok(Some((value, b)));
            }
            Some(&b) if b.is_ascii_digit() && *at - start < 9 => {
                value = value * 10 + u32::from(b - b'0');
                *at += 1;
            }
            _ => return Err(format!("no {what} at byte {start}: {}", show(bytes))),
        }
    }
}

fn describe(frame: &Frame) -> String {
    match frame.command.as_str() {
        "serverclose" => "the receiver closed the session (serverclose)".to_owned(),
        command => format!("{command} {} {}", frame.txnr, show(&frame.data)),
    }
}

/// What the server sent, escaped and cut short, for an error message.
fn show(bytes: &[u8]) -> String {
    const MAX: usize = 80;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]).escape_debug().to_string();
    if bytes.len() > MAX {
        format!("\"{text}...\"")
    } else {
        format!("\"{text}\"")
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };

    use super::*;

    fn frame(txnr: u32, command: &str, data: &str) -> Frame {
        Frame { txnr, command: command.into(), data: data.as_bytes().to_vec() }
    }

    #[test]
    fn frames_encode_and_parse_back() {
        let mut bytes = Vec::new();
        encode(&mut bytes, 7, "syslog", b"<83>1 - h credwatch - - - hi");
        encode(&mut bytes, 8, "close", b"");
        assert_eq!(bytes, b"7 syslog 28 <83>1 - h credwatch - - - hi\n8 close 0\n");
        let (first, used) = parse(&bytes).unwrap().unwrap();
        assert_eq!(first, frame(7, "syslog", "<83>1 - h credwatch - - - hi"));
        assert_eq!(parse(&bytes[used..]).unwrap(), Some((frame(8, "close", ""), 10)));
        // Data holding LFs and spaces (the open answer's offers).
        let answer = b"1 rsp 30 200 OK\nrelp_version=0\ncommands\n";
        assert_eq!(parse(answer).unwrap().unwrap().0, frame(1, "rsp", "200 OK\nrelp_version=0\ncommands"));
    }

    #[test]
    fn a_frame_cut_anywhere_waits_for_the_rest() {
        let whole = b"123 rsp 6 200 OK\n";
        for end in 0..whole.len() {
            assert_eq!(parse(&whole[..end]), Ok(None), "{end}");
        }
        assert!(parse(whole).unwrap().is_some());
    }

    #[test]
    fn garbage_is_an_error_naming_it() {
        for (bytes, said) in [
            (&b"HTTP/1.1 400 Bad Request\r\n"[..], "no transaction number at byte 0: \"HTTP/1.1"),
            (b"1234567890 rsp 0\n", "no transaction number"),
            (b" rsp 0\n", "no transaction number"),
            (b"1 r5p 0\n", "no command after transaction number 1"),
            (b"1  0\n", "no command after transaction number 1"),
            (b"1 rsp x\n", "no data length"),
            (b"1 rsp 6\n", "announces 6 bytes and has none"),
            (b"1 rsp 6 200 OKX\n", "no LF after its 6 bytes"),
            (b"1 rsp 999999999 ", "more than 65536"),
            (b"1 rspppppppppppppppppppppppppppppppppppp", "no command"),
            (b"\x1b[2J\x00", "no transaction number at byte 0: \"\\u{1b}[2J\\0\""),
        ] {
            let error = parse(bytes).unwrap_err();
            assert!(error.contains(said), "{bytes:?}: {error}");
        }
    }

    #[test]
    fn transaction_numbers_wrap_to_one() {
        assert_eq!(parse(b"999999999 rsp 0\n").unwrap().unwrap().0.txnr, MAX_TXNR);
        let mut txnrs = [MAX_TXNR - 1, 0, 0, 0];
        for i in 1..4 {
            txnrs[i] = if txnrs[i - 1] >= MAX_TXNR { 1 } else { txnrs[i - 1] + 1 };
        }
        assert_eq!(txnrs, [MAX_TXNR - 1, MAX_TXNR, 1, 2]);
    }

    const TIMEOUT: Duration = Duration::from_secs(5);

    /// A server that answers `open` as imrelp does, then runs `rest` on the connection.
    async fn server<F, Fut>(rest: F) -> (u16, tokio::task::JoinHandle<()>)
    where
        F: FnOnce(TcpStream, Vec<u8>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let open = read_one(&mut stream, &mut received).await;
            assert_eq!(open.command, "open");
            assert!(String::from_utf8_lossy(&open.data).contains("commands=syslog"), "{open:?}");
            let offers = b"200 OK\nrelp_version=0\nrelp_software=librelp,1.11.0\ncommands=syslog";
            let mut answer = Vec::new();
            encode(&mut answer, open.txnr, "rsp", offers);
            stream.write_all(&answer).await.unwrap();
            rest(stream, received).await;
        });
        (port, task)
    }

    async fn read_one(stream: &mut TcpStream, received: &mut Vec<u8>) -> Frame {
        loop {
            if let Some((frame, used)) = parse(received).unwrap() {
                received.drain(..used);
                return frame;
            }
            let mut chunk = [0; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert_ne!(n, 0, "the client closed");
            received.extend_from_slice(&chunk[..n]);
        }
    }

    fn messages(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("<83>1 - h credwatch - - - m{i}").into_bytes()).collect()
    }

    #[tokio::test]
    async fn messages_are_acknowledged_within_a_window_in_any_order() {
        let (port, task) = server(|mut stream, mut received| async move {
            let mut seen = Vec::new();
            while seen.len() < 300 {
                // What is in flight: one frame, then all that came meanwhile.
                let mut window = vec![read_one(&mut stream, &mut received).await];
                tokio::time::sleep(Duration::from_millis(20)).await;
                let mut more = vec![0; 1 << 20];
                if let Ok(n) = stream.try_read(&mut more) {
                    received.extend_from_slice(&more[..n]);
                }
                while let Some((frame, used)) = parse(&received).unwrap() {
                    received.drain(..used);
                    window.push(frame);
                }
                assert!(window.len() <= WINDOW, "{} unacknowledged", window.len());
                // Answered last first.
                let mut answers = Vec::new();
                for frame in window.iter().rev() {
                    assert_eq!(frame.command, "syslog");
                    encode(&mut answers, frame.txnr, "rsp", b"200 OK");
                }
                stream.write_all(&answers).await.unwrap();
                seen.extend(window.into_iter().map(|f| f.data));
            }
            assert_eq!(seen, messages(300), "each message once, in order");
        })
        .await;
        let mut session = Session::open("127.0.0.1", port, TIMEOUT).await.unwrap();
        session.send(&messages(300)).await.unwrap();
        task.await.unwrap();
    }

    /// The error of a session whose server answers the first `syslog` with `answer` (or
    /// closes, for an empty one).
    async fn error_for(answer: &'static [u8]) -> io::Error {
        let (port, task) = server(move |mut stream, mut received| async move {
            read_one(&mut stream, &mut received).await;
            if !answer.is_empty() {
                stream.write_all(answer).await.unwrap();
            }
            drop(stream);
        })
        .await;
        let mut session = Session::open("127.0.0.1", port, TIMEOUT).await.unwrap();
        let error = session.send(&messages(3)).await.unwrap_err();
        task.await.unwrap();
        error
    }

    #[tokio::test]
    async fn a_receiver_answering_garbage_refusing_or_closing_is_an_error_never_a_panic() {
        let cases: [(&[u8], &str); 7] = [
            (b"2 rsp 20 500 command disabled\n", "answered \"500 command disabled\" to transaction 2"),
            (b"0 serverclose 0\n", "the receiver closed the session (serverclose)"),
            (b"9 rsp 6 200 OK\n", "rsp 9 \"200 OK\" for no message waiting"),
            (b"garbage\r\n", "no transaction number at byte 0: \"garbage\\r\\n\""),
            (b"2 rsp 6 20", "closed the connection in the middle of a frame"),
            (b"", "the receiver closed the connection"),
            (b"2 syslog 2 hi\n", "syslog 2 \"hi\" where the answer to transaction 2 was due"),
        ];
        for (answer, said) in cases {
            let error = error_for(answer).await;
            assert!(error.to_string().contains(said), "{answer:?}: {error}");
        }
    }

    #[tokio::test]
    async fn a_stalled_receiver_times_out() {
        let (port, task) = server(|stream, _| async move {
            // Reads nothing more, answers nothing, keeps the connection open.
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(stream);
        })
        .await;
        let mut session = Session::open("127.0.0.1", port, Duration::from_millis(300)).await.unwrap();
        let error = session.send(&messages(3)).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("waiting for the receiver's answer: no progress in 300ms"), "{error}");
        task.abort();
    }

    #[tokio::test]
    async fn open_needs_the_syslog_command_and_a_200() {
        for (answer, said) in [
            (&b"1 rsp 41 200 OK\nrelp_version=0\ncommands=otherthing\n"[..], "does not take syslog messages"),
            (b"1 rsp 21 200 OK\nrelp_version=0\n", "offers no commands"),
            (b"1 rsp 8 500 busy\n", "answered \"500 busy\" to transaction 1"),
            (b"0 serverclose 0\n", "serverclose"),
        ] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let task = tokio::spawn(async move {
                let (mut stream, _) = listener.accept().await.unwrap();
                read_one(&mut stream, &mut Vec::new()).await;
                stream.write_all(answer).await.unwrap();
            });
            let error = Session::open("127.0.0.1", port, TIMEOUT).await.unwrap_err();
            assert!(error.to_string().contains(said), "{answer:?}: {error}");
            task.await.unwrap();
        }
    }

    #[tokio::test]
    async fn close_ends_the_session_as_librelp_does() {
        let (port, task) = server(|mut stream, mut received| async move {
            let close = read_one(&mut stream, &mut received).await;
            assert_eq!((close.txnr, close.command.as_str(), close.data.as_slice()), (2, "close", &b""[..]));
            let mut answer = Vec::new();
            encode(&mut answer, close.txnr, "rsp", b"");
            stream.write_all(&answer).await.unwrap();
        })
        .await;
        let session = Session::open("127.0.0.1", port, TIMEOUT).await.unwrap();
        session.close().await.unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_serverclose_while_idle_makes_the_session_stale() {
        let (port, task) = server(|mut stream, _| async move {
            stream.write_all(b"0 serverclose 0\n").await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        })
        .await;
        let session = Session::open("127.0.0.1", port, TIMEOUT).await.unwrap();
        let start = std::time::Instant::now();
        while !session.stale() {
            assert!(start.elapsed() < TIMEOUT, "never stale");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.await.unwrap();
    }
}
