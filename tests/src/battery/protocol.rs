//! What arrives before a handler reads a body: lengths declared and never
//! sent, bodies over the limit, oversized targets, broken framing, not
//! HTTP at all; and the API key on every route.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use super::{Answer, Expect, Report, Target, check, send, still_serving};
use crate::raw::{address, post_head, read_for};

/// Longest wait for an answer that must come at once (a refusal that
/// waits for bytes that never come is the failure this finds).
const PROMPT: Duration = Duration::from_secs(5);

/// Send `request` on a new connection; the answer read until the server
/// closes or [`PROMPT`] passes (then it is "no answer").
fn exchange(target: &Target<'_>, request: &[u8]) -> Answer {
    let connected = TcpStream::connect(address(target.server)).and_then(|stream| Ok((stream.try_clone()?, stream)));
    let (mut writer, mut stream) = match connected {
        Ok(pair) => pair,
        Err(error) => return Answer { status: 0, body: format!("cannot connect: {error}"), stream: false },
    };
    // Written beside the reading: the server may answer and close before
    // it takes all of a large request, and an answer left unread when the
    // reset that closing sends arrives would be lost.
    let read = std::thread::scope(|scope| {
        scope.spawn(move || {
            let _ = writer.write_all(request);
        });
        let read = read_for(&mut stream, PROMPT);
        // A writer the server never read from is stopped so.
        let _ = stream.shutdown(std::net::Shutdown::Both);
        read
    });
    // A whole answer counts, closed or not: after refusing a chunked body
    // the server may read the rest of it and keep the connection.
    match read {
        (answer, _) if answer.contains("\r\n\r\n") => {
            let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_owned();
            Answer { status: crate::raw::status_of(&answer), body, stream: false }
        }
        _ => Answer { status: 0, body: format!("nothing within {} s", PROMPT.as_secs()), stream: false },
    }
}

pub fn protocol(target: &Target<'_>, report: &mut Report) {
    let category = "before routing";
    let key = Some(target.key);
    let over = target.body_limit + 1;
    let head = |length: u64| post_head("/completion", length, key);
    let mut cases: Vec<(String, Vec<u8>, Expect)> = vec![
        (
            "a declared length of a terabyte, 15 bytes sent".into(),
            format!("{}{{\"prompt\":\"a\"}}", head(1_000_000_000_000)).into_bytes(),
            Expect::Status(413, &["limit"]),
        ),
        (
            "a declared length one over the limit, nothing sent".into(),
            head(over as u64).into_bytes(),
            Expect::Status(413, &["limit"]),
        ),
        (
            "a body one byte over the limit".into(),
            [head(over as u64).into_bytes(), vec![b' '; over]].concat(),
            Expect::Status(413, &["limit"]),
        ),
        (
            "a chunked body over the limit".into(),
            {
                let head = format!(
                    "POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
                    target.key
                );
                let chunk = format!("{over:x}\r\n{}\r\n0\r\n\r\n", " ".repeat(over));
                format!("{head}{chunk}").into_bytes()
            },
            Expect::Status(413, &["limit"]),
        ),
        (
            "a negative length".into(),
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec(),
            Expect::Status(400, &[]),
        ),
        (
            "two lengths".into(),
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
            Expect::Status(400, &[]),
        ),
        (
            "a target of 70,000 bytes".into(),
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            Expect::Status(414, &[]),
        ),
        ("not HTTP".into(), b"GARBAGE\r\n\r\n".to_vec(), Expect::Status(400, &[])),
        ("a request line of spaces".into(), b"    \r\n\r\n".to_vec(), Expect::Status(400, &[])),
    ];
    // Every route needs the key; a wrong one and a malformed header are
    // the same refusal.
    for (path, method) in [
        ("/completion", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/slots", "GET"),
        ("/metrics", "GET"),
        ("/props", "GET"),
        ("/admin/policy", "POST"),
    ] {
        for auth in ["", "Authorization: Bearer wrong\r\n", "Authorization: Basic x\r\n", "X-Api-Key: \r\n"] {
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            );
            cases.push((
                format!("{method} {path} with {:?}", auth.trim()),
                request.into_bytes(),
                Expect::Status(401, &[]),
            ));
        }
    }
    for (what, request, expect) in cases {
        check(report, category, &what, &exchange(target, &request), &expect);
    }
    let health = reqwest::blocking::Client::new().get(target.server.url("/health"));
    send(report, category, "/health without a key", health, &Expect::Status(200, &[]));
    still_serving(target, report, category);
}
