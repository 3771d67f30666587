//! Each probe against a stand-in peer on a socket in a temporary directory: the answers it
//! should read, and peers that refuse, say nonsense, hang up or say nothing.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixListener,
    thread,
};

use super::*;

/// Serves one connection at a new socket with `serve`; the door of `probe` there.
fn stand_in(probe: Probe, name: &str, serve: impl FnOnce(UnixStream) + Send + 'static) -> (tempfile::TempDir, Door) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let listener = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        if let Ok((stream, _)) = listener.accept() {
            serve(stream);
        }
    });
    let door = Door {
        path,
        kind: "demo".into(),
        name: "a demo".into(),
        category: "demo".into(),
        directory: false,
        from_variable: None,
        probe: Some(probe),
    };
    (dir, door)
}

/// Reads the ssh-agent request, then writes `reply`.
fn agent_replying(reply: Vec<u8>) -> impl FnOnce(UnixStream) + Send + 'static {
    move |mut stream| {
        let mut request = [0u8; 5];
        stream.read_exact(&mut request).unwrap();
        assert_eq!(request, [0, 0, 0, 1, 11], "SSH2_AGENTC_REQUEST_IDENTITIES");
        let _ = stream.write_all(&reply);
    }
}

fn no_answer(answer: Option<Answer>) -> String {
    match answer {
        Some(Answer::NoAnswer { why }) => why,
        other => panic!("expected no answer, got {other:?}"),
    }
}

#[test]
fn an_ssh_agent_tells_its_key_count_and_nothing_more_is_read() {
    // Two keys' worth of blob after the count: never looked at.
    let mut reply = vec![0, 0, 0, 45, 12, 0, 0, 0, 2];
    reply.extend([0xaa; 40]);
    let (_dir, door) = stand_in(Probe::SshAgent, "agent.1", agent_replying(reply));
    let answer = probe(&door).unwrap();
    assert_eq!(answer, Answer::SshAgent { keys: 2 });
    assert_eq!(answer.describe(), "2 keys loaded");
    assert_eq!(Answer::SshAgent { keys: 1 }.describe(), "1 key loaded");
}

#[test]
fn ssh_agents_that_refuse_or_talk_nonsense_give_a_line() {
    let (_dir, door) = stand_in(Probe::SshAgent, "a", agent_replying(vec![0, 0, 0, 1, 5]));
    assert_eq!(no_answer(probe(&door)), "it refused to list its keys (SSH_AGENT_FAILURE)");
    let (_dir, door) = stand_in(Probe::SshAgent, "b", agent_replying(b"HTTP/1.1 400 Bad".to_vec()));
    let why = no_answer(probe(&door));
    assert!(why.starts_with("not an ssh-agent's answer (message type 47"), "{why}");
    let (_dir, door) = stand_in(Probe::SshAgent, "c", agent_replying(vec![0, 0, 0, 9, 12, 0]));
    assert_eq!(no_answer(probe(&door)), "it hung up mid-answer");
}

#[test]
fn a_silent_peer_is_given_up_at_the_deadline() {
    let (_dir, door) = stand_in(Probe::SshAgent, "silent", |mut stream| {
        // Reads the request, answers nothing, and stays until the probe hangs up.
        let _ = stream.read(&mut [0u8; 5]);
        let _ = stream.read(&mut [0u8; 1]);
    });
    let started = Instant::now();
    assert_eq!(no_answer(probe(&door)), format!("no answer within {} ms", PROBE_DEADLINE.as_millis()));
    assert!(started.elapsed() < PROBE_DEADLINE * 3, "{:?}", started.elapsed());
}

#[test]
fn what_is_no_listening_socket_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let mut door = Door {
        path: dir.path().join("S.gpg-agent"),
        kind: "gpg-agent".into(),
        name: "gpg-agent".into(),
        category: "gpg".into(),
        directory: false,
        from_variable: None,
        probe: Some(Probe::GpgAgent),
    };
    fs::write(&door.path, "").unwrap();
    assert_eq!(no_answer(probe(&door)), "not a socket (nothing listens)");
    fs::remove_file(&door.path).unwrap();
    drop(UnixListener::bind(&door.path).unwrap());
    assert_eq!(no_answer(probe(&door)), "nothing listens (connection refused)");
    door.path = dir.path().join("gone/S.gpg-agent");
    assert!(no_answer(probe(&door)).starts_with("cannot look at it: "));
    door.path = dir.path().join("S.dirmngr");
    assert_eq!(probe(&door), None, "gpg-agent's probe speaks to S.gpg-agent and S.gpg-agent.ssh only");
}

#[test]
fn a_socket_path_too_long_for_an_address_is_said() {
    let long = PathBuf::from(format!("/tmp/{}/agent.sock", "d".repeat(100)));
    let error = connect(&long).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(error.to_string(), "its path is longer than a socket address holds (107 bytes)");
}

#[test]
fn gpg_agent_counts_its_keys_and_the_unlocked_ones() {
    let (_dir, door) = stand_in(Probe::GpgAgent, "S.gpg-agent", |stream| {
        let mut writer = stream.try_clone().unwrap();
        writer.write_all(b"OK Pleased to meet you, process 1\n").unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        assert_eq!(line, "KEYINFO --list\n");
        writer
            .write_all(
                b"# a comment\nS KEYINFO 0A1B D - - 1 P - - -\nS KEYINFO 2C3D D - - - P - - -\n\
                  S KEYINFO 4E5F T D2760001 OPENPGP.1 - - - - -\nOK\n",
            )
            .unwrap();
    });
    let answer = probe(&door).unwrap();
    assert_eq!(answer, Answer::GpgAgent { keys: 3, cached: 1 });
    assert_eq!(answer.describe(), "3 keys known, 1 unlocked (cached)");
    let (_dir, door) = stand_in(Probe::GpgAgent, "S.gpg-agent", |mut stream| {
        stream.write_all(b"OK hi\n").unwrap();
        let _ = stream.read(&mut [0u8; 64]);
        stream.write_all(b"ERR 67108881 Not supported \x1b[2J<gpg-agent>\n").unwrap();
    });
    assert_eq!(
        no_answer(probe(&door)),
        "it refused to list its keys: \"ERR 67108881 Not supported \\u{1b}[2J<gpg-agent>\""
    );
    let (_dir, door) = stand_in(Probe::GpgAgent, "S.gpg-agent", |mut stream| {
        stream.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").unwrap();
    });
    assert_eq!(no_answer(probe(&door)), "not gpg-agent's greeting: \"SSH-2.0-OpenSSH_9.2\"");
}

#[test]
fn a_gpg_directory_sums_its_agents_and_the_ssh_socket_speaks_ssh() {
    let dir = tempfile::tempdir().unwrap();
    for (at, keys) in [("S.gpg-agent", 1), ("d.abc/S.gpg-agent", 2)] {
        let path = dir.path().join(at);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let listener = UnixListener::bind(&path).unwrap();
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            writer.write_all(b"OK\n").unwrap();
            BufReader::new(stream).read_line(&mut String::new()).unwrap();
            for _ in 0..keys {
                writer.write_all(b"S KEYINFO AB D - - 1 P - - -\n").unwrap();
            }
            writer.write_all(b"OK\n").unwrap();
        });
    }
    let door = Door {
        path: dir.path().to_owned(),
        kind: "gpg-agent".into(),
        name: "gpg-agent".into(),
        category: "gpg".into(),
        directory: true,
        from_variable: None,
        probe: Some(Probe::GpgAgent),
    };
    assert_eq!(probe(&door), Some(Answer::GpgAgent { keys: 3, cached: 3 }));
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(probe(&Door { path: empty.path().to_owned(), ..door }), None, "no agent in it");
    let (_dir, ssh) = stand_in(Probe::GpgAgent, "S.gpg-agent.ssh", agent_replying(vec![0, 0, 0, 5, 12, 0, 0, 0, 0]));
    assert_eq!(probe(&ssh), Some(Answer::SshAgent { keys: 0 }));
}

#[test]
fn a_container_engine_answers_its_ping() {
    let (_dir, door) = stand_in(Probe::HttpPing, "docker.sock", |stream| {
        let mut writer = stream.try_clone().unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        assert_eq!(line, "GET /_ping HTTP/1.1\r\n");
        writer.write_all(b"HTTP/1.1 200 OK\r\nApi-Version: 1.47\r\nContent-Length: 2\r\n\r\nOK").unwrap();
    });
    let answer = probe(&door).unwrap();
    assert_eq!((answer.clone(), answer.describe()), (Answer::Http { status: 200 }, "answers (HTTP 200)".into()));
    let (_dir, door) = stand_in(Probe::HttpPing, "docker.sock", |mut stream| {
        let _ = stream.read(&mut [0u8; 128]);
        stream.write_all(&[0xff; 300]).unwrap();
    });
    let why = no_answer(probe(&door));
    assert!(why.starts_with("not an HTTP answer: \"\u{fffd}"), "{why}");
    let (_dir, door) = stand_in(Probe::HttpPing, "docker.sock", |mut stream| {
        let _ = stream.read(&mut [0u8; 128]);
    });
    assert_eq!(no_answer(probe(&door)), "it hung up without an answer");
}

#[test]
fn a_bus_that_will_not_let_us_in_or_is_no_bus() {
    let (_dir, door) = stand_in(Probe::SessionBus, "bus", |mut stream| {
        let _ = stream.read(&mut [0u8; 64]);
        stream.write_all(b"REJECTED EXTERNAL\r\n").unwrap();
    });
    assert_eq!(no_answer(probe(&door)), "the bus did not let this user in: \"REJECTED EXTERNAL\"");
    let (_dir, door) = stand_in(Probe::SessionBus, "bus", |stream| {
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        reader.read_until(b'\n', &mut Vec::new()).unwrap();
        writer.write_all(b"OK 0123456789abcdef\r\n").unwrap();
        reader.read_until(b'\n', &mut Vec::new()).unwrap();
        // A "message" claiming a body far larger than any probe reads.
        let mut head = vec![b'l', 2, 0, 1];
        head.extend(u32::MAX.to_le_bytes());
        head.extend(1u32.to_le_bytes());
        head.extend(0u32.to_le_bytes());
        writer.write_all(&head).unwrap();
        let _ = reader.read(&mut [0u8; 1]);
    });
    let why = no_answer(probe(&door));
    assert!(why.starts_with("a D-Bus message of 4294967295 bytes, more than 1048576"), "{why}");
}

#[test]
fn bus_names_are_read_from_any_body_without_a_panic() {
    let mut body = vec![0; 4];
    for name in ["a.b", "org.freedesktop.secrets"] {
        while !body.len().is_multiple_of(4) {
            body.push(0);
        }
        body.extend((name.len() as u32).to_le_bytes());
        body.extend(name.as_bytes());
        body.push(0);
    }
    let length = (body.len() - 4) as u32;
    body[..4].copy_from_slice(&length.to_le_bytes());
    assert_eq!(strings(&body, true).unwrap(), ["a.b", "org.freedesktop.secrets"]);
    for cut in 0..body.len() {
        let _ = strings(&body[..cut], true);
    }
    assert!(strings(&[0xff, 0xff, 0xff, 0xff, 1], true).is_err());
    // The call's header fields add up to its declared length, padded to 8 before the body.
    let call = method_call(2, "NameHasOwner", Some(SECRET_SERVICE));
    let fields = u32_at(&call, 12, true).unwrap() as usize;
    let body_at = (16 + fields).div_ceil(8) * 8;
    assert_eq!(u32_at(&call, 4, true), Some(call.len() as u32 - body_at as u32));
    assert_eq!(&call[body_at + 4..call.len() - 1], SECRET_SERVICE.as_bytes());
}
