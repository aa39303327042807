//! The accept loop. `axum::serve` would do, but it writes HTTP/1 header
//! names in lower case; llama-server writes them as named
//! (`Access-Control-Allow-Origin`), and clients that look headers up
//! case-sensitively (llama.cpp's own test harness among them) then find
//! them only on llama-server. Header names are case-insensitive, so
//! title case costs correct clients nothing.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use super::conn::{self, Timeouts};

const ACCEPT_PAUSE: Duration = Duration::from_millis(20);

/// Serve `app` on `listener` until `shutdown` resolves, then close the
/// listener and wait for the open connections to finish (the caller
/// bounds that wait). Each connection keeps `timeouts` (see `conn`).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().title_case_headers(true);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // A connection that failed before it was accepted (the client
            // reset it) ends only itself; if file descriptors ran out,
            // pausing lets open connections finish and free some.
            Err(error) => {
                tracing::debug!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        // Token streams are many small writes.
        let _ = stream.set_nodelay(true);
        let (stream, service) = conn::track(stream, app.clone(), timeouts);
        let service = TowerToHyperService::new(service);
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    // Closed now, not when the open connections are done: a client that
    // connects during the grace is refused at once instead of waiting in
    // the kernel's backlog for an answer that never comes.
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use axum::routing::get;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn header_names_go_out_in_title_case_and_shutdown_ends_the_loop() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("a port");
        let address = listener.local_addr().expect("an address");
        let app = Router::new().route("/", get(|| async { ([("access-control-allow-origin", "*")], "ok") }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, Timeouts::default(), async {
            let _ = stopped.await;
        }));
        let response = tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(address).expect("connects");
            stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("writes");
            let mut response = String::new();
            stream.read_to_string(&mut response).expect("reads");
            response
        })
        .await
        .expect("the client ran");
        assert!(response.contains("\r\nAccess-Control-Allow-Origin: *\r\n"), "{response}");
        assert!(response.ends_with("ok"), "{response}");
        let _ = stop.send(());
        server.await.expect("the loop ran").expect("it ended cleanly");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn new_connections_are_refused_from_the_moment_shutdown_begins() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("a port");
        let address = listener.local_addr().expect("an address");
        // A request that stays in flight until released keeps the server
        // waiting for its connection after the stop.
        let (entered, mut inside) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (release, released) = tokio::sync::watch::channel(false);
        let hold = move || {
            let (entered, mut released) = (entered.clone(), released.clone());
            async move {
                let _ = entered.send(());
                let _ = released.wait_for(|released| *released).await;
                "done"
            }
        };
        let app = Router::new().route("/hold", get(hold));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, Timeouts::default(), async {
            let _ = stopped.await;
        }));
        let held = tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(address).expect("connects");
            stream.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("writes");
            let mut response = String::new();
            stream.read_to_string(&mut response).expect("reads");
            response
        });
        inside.recv().await.expect("the request reached its handler");
        let _ = stop.send(());
        let refused = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while std::net::TcpStream::connect(address).is_ok() {
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            true
        })
        .await
        .expect("the prober ran");
        assert!(refused, "a new connection was still accepted after the stop");
        assert!(!server.is_finished(), "the server waits for the request in flight");
        let _ = release.send(true);
        let response = held.await.expect("the held client ran");
        assert!(response.ends_with("done"), "{response}");
        server.await.expect("the loop ran").expect("it ended cleanly");
    }
}
