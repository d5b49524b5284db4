use super::*;
use hyper::StatusCode;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Instant;

fn ok(request: &Request<Incoming>, client: SocketAddr) -> Response<Body> {
    respond(
        StatusCode::OK,
        "text/plain",
        format!("{} from {}\n", request.uri().path(), client.ip()),
    )
}

/// A connection from `source` that sends half a request and then nothing.
fn slow_client(source: Ipv4Addr, server: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from((source, 0)).into())
        .expect("bind the source");
    socket.connect(&server.into()).expect("connect");
    let mut stream: TcpStream = socket.into();
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
        .expect("half a request");
    stream
}

/// Whether the server closed `stream` (within `wait`).
fn closed(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).expect("timeout");
    let mut buffer = [0; 512];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            // A 408 or 503 the server sent on its way out.
            Ok(_) => continue,
            Err(error) => return error.kind() == io::ErrorKind::ConnectionReset,
        }
    }
}

fn get(server: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(server).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// A server on loopback with `limits`, and its address.
fn server(limits: Limits) -> (SocketAddr, JoinHandle<()>) {
    let mut listeners = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).expect("bind");
    let listener = listeners.remove(0);
    let addr = listener.local_addr().expect("addr");
    (addr, serve(listener, limits, ok))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_no_more_than_their_share_and_a_probe_still_answers() {
    let (server, task) = server(Limits {
        per_client: 8,
        header_timeout: Duration::from_secs(60),
        ..Limits::default()
    });
    let checked = tokio::task::spawn_blocking(move || {
        // 40 connections from one address that never finish a request.
        let mut slow: Vec<TcpStream> = (0..40)
            .map(|_| slow_client(Ipv4Addr::new(127, 0, 0, 2), server))
            .collect();
        // The kubelet, from another address, is answered.
        let probe = get(server, "/readyz");
        assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
        assert!(probe.contains("/readyz from 127.0.0.1"), "{probe}");
        // Beyond its share, the slow client's connections were closed on arrival; its
        // share stays open (for a minute, its header timeout).
        let over: Vec<bool> = slow[8..]
            .iter_mut()
            .map(|s| closed(s, Duration::from_secs(10)))
            .collect();
        assert!(over.iter().all(|c| *c), "{over:?}");
        let held: Vec<bool> = slow[..8]
            .iter_mut()
            .map(|s| closed(s, Duration::from_millis(200)))
            .collect();
        assert!(held.iter().all(|c| !*c), "{held:?}");
        // Once it lets one go, it gets one again.
        drop(slow.remove(0));
        std::thread::sleep(Duration::from_millis(100));
        let mut again = slow_client(Ipv4Addr::new(127, 0, 0, 2), server);
        assert!(!closed(&mut again, Duration::from_millis(200)));
    })
    .await;
    task.abort();
    checked.expect("checks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_closed() {
    let (server, task) = server(Limits {
        header_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let checked = tokio::task::spawn_blocking(move || {
        let mut slow = slow_client(Ipv4Addr::new(127, 0, 0, 2), server);
        let started = Instant::now();
        assert!(
            closed(&mut slow, Duration::from_secs(30)),
            "still open after {:?}",
            started.elapsed()
        );
    })
    .await;
    task.abort();
    checked.expect("checks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ipv4_wildcard_is_bound_for_ipv6_too_on_one_port() {
    let listeners = bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))).expect("bind");
    if std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
        .is_ok_and(|v| v.trim() == "1")
    {
        assert_eq!(listeners.len(), 1, "no IPv6 on this host");
        return;
    }
    assert_eq!(listeners.len(), 2);
    let port = listeners[0].local_addr().expect("addr").port();
    assert_eq!(listeners[1].local_addr().expect("addr").port(), port);
    let tasks: Vec<_> = listeners
        .into_iter()
        .map(|l| serve(l, Limits::default(), ok))
        .collect();
    let answers = tokio::task::spawn_blocking(move || {
        [
            get(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), "/v4"),
            get(SocketAddr::from((Ipv6Addr::LOCALHOST, port)), "/v6"),
        ]
    })
    .await
    .expect("gets");
    for task in tasks {
        task.abort();
    }
    assert!(answers[0].contains("/v4 from 127.0.0.1"), "{}", answers[0]);
    assert!(answers[1].contains("/v6 from ::1"), "{}", answers[1]);
}
