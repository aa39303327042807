//! HTTP on a bare socket, for what a well-behaved client library will not
//! send: half a request, a declared length it never sends, garbage, a
//! stream it never reads.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use crate::http::Server;

/// The server's listening address.
pub fn address(server: &Server) -> SocketAddr {
    server.url("").trim_start_matches("http://").parse().expect("an address")
}

/// What the server sends on a raw connection until it closes it (bounded:
/// `None` if it was still open after `wait`).
pub fn read_until_closed(stream: &mut TcpStream, wait: Duration) -> Option<String> {
    let (answer, closed) = read_for(stream, wait);
    closed.then_some(answer)
}

/// What the server sends on a raw connection within `wait`, and whether
/// it closed the connection by then.
pub fn read_for(stream: &mut TcpStream, wait: Duration) -> (String, bool) {
    stream.set_read_timeout(Some(wait)).expect("timeout");
    let mut answer = Vec::new();
    let mut buf = [0u8; 65536];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            // Still open when the wait ran out.
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                break false;
            }
            // Closed with a reset: it had unread bytes of ours.
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

/// Send `request` on a new connection and read until the server closes it.
pub fn raw(server: &Server, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(address(server)).expect("connects");
    stream.write_all(request).expect("writes");
    read_until_closed(&mut stream, Duration::from_secs(20)).expect("the server answers and closes")
}

/// The status of a raw HTTP answer (0 when there is none).
pub fn status_of(answer: &str) -> u16 {
    answer.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// The JSON body of a raw HTTP answer, with its status.
pub fn answer_json(answer: &str) -> (u16, Value) {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status_of(answer), serde_json::from_str(body).unwrap_or_else(|_| panic!("no JSON body in {answer:?}")))
}

/// A POST head for a JSON body of `length` bytes, with the API key if any;
/// the connection is to close after the answer.
pub fn post_head(path: &str, length: u64, key: Option<&str>) -> String {
    let auth = key.map(|key| format!("Authorization: Bearer {key}\r\n")).unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
}

/// A connection to `address` whose receive buffer is about `bytes` (the
/// kernel doubles it and keeps a floor), with `request` sent: a client that
/// then never reads holds the server's writes back as soon as that little
/// fills.
pub fn unread_connection(address: SocketAddr, request: &[u8], bytes: usize) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(address), socket2::Type::STREAM, None)?;
    // Set before connecting, so that the window the server sees is small
    // from the start.
    socket.set_recv_buffer_size(bytes)?;
    socket.connect(&address.into())?;
    let mut stream: TcpStream = socket.into();
    stream.write_all(request)?;
    Ok(stream)
}
